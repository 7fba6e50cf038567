"""Rules: measured findings in, recommendations with their effect out.

Each rule is a small function ``(RuleInput) -> list[Proposal]`` that fires only on
evidence from this trace, cites that evidence in numbers, gives a fix written against
the current PyTorch API, and states what it removes from a steady-state step: idle of a
cause, busy time, or (stragglers) a rank's excess. The gain itself is computed by the
one what-if model in :mod:`gpuidle.advice.whatif`, never here. ``confidence`` says how
the effect was obtained: ``high`` is measured idle of exactly that cause; ``medium`` and
``low`` are estimates with their assumption in the evidence. Rule ids are stable: other
modules (framework-specific texts) key on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpuidle.advice.hardware import Hardware, amp_snippet, hardware
from gpuidle.advice.whatif import Effect, Proposal, RankState, placeholder, rank_state
from gpuidle.analysis.steps import counted
from gpuidle.model import Cause, DeviceReport, JobReport, RankReport, Recommendation

MIB = 1 << 20
COMPUTE = "compute"
"""The ``cause`` of a recommendation that shortens busy time rather than idle time."""


@dataclass(frozen=True, slots=True)
class RuleInput:
    """One rank's report, its steady-state step, and what the rules keep asking of it."""

    report: RankReport
    device: DeviceReport
    """The device with the most busy time: the one the rank trains on."""
    state: RankState
    """The mean steady-state step (steps marked ``excluded`` left out)."""
    steps: int
    """Steady steps the state is the mean of."""
    accumulation_repeats: int
    """How many times the same all-reduce sequence repeats inside a step (1: no repeat)."""

    @property
    def hw(self) -> Hardware:
        return hardware(self.device)

    def idle(self, cause: Cause) -> float:
        """Idle of ``cause`` per steady step, in seconds."""
        return self.state.idle.get(cause.value, 0.0)

    def share(self, cause: Cause) -> float:
        return self.idle(cause) / self.state.step_s if self.state.step_s else 0.0

    def per_window_step(self, seconds: float) -> float:
        """A whole-window figure (kernel totals) per step of the window."""
        return seconds / max(len(self.report.steps), 1)

    def rec(self, id: str, cause: Cause | str, title: str, evidence: dict[str, object], fix: str,
            effect: Effect, confidence: str = "high") -> Proposal:
        evidence = {"device": self.device.device, "steps": self.steps, **evidence}
        rec = Recommendation(id=id, cause=str(cause), title=title, evidence=evidence, fix=fix,
                             gain=placeholder(), confidence=confidence, rank=self.report.rank)
        return Proposal(rec, {self.report.rank: effect})


def removes(cause: Cause, seconds: float) -> Effect:
    return Effect(idle={cause.value: seconds})


Rule = Callable[[RuleInput], list[Proposal]]
LARGE_MESSAGE = 16 * MIB
COMPRESSIBLE_MESSAGE = 1 * MIB
"""Below this an all-reduce is latency-bound (NCCL's ring: tens of µs of latency against 100+ GB/s, the
crossover near 1-2 MiB): halving its bytes saves little; fewer, larger buckets help instead."""
LOW_BUSBW_GBPS = 10.0
"""Below this, a large all-reduce is not on NVLink or InfiniBand-class bandwidth."""
MIN_SHARE = 0.03
"""A cause below 3 % of the window is not worth a recommendation."""


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def dataloader_workers(x: RuleInput) -> list[Proposal]:
    if x.share(Cause.DATA_LOADING) < MIN_SHARE:
        return []
    return [x.rec(
        "dataloader_workers", Cause.DATA_LOADING,
        "Load batches in parallel: more DataLoader workers, pinned memory, prefetching",
        {"data_loading_ms_per_step": _ms(x.idle(Cause.DATA_LOADING)),
         "data_loading_share": round(x.share(Cause.DATA_LOADING), 4)},
        "loader = torch.utils.data.DataLoader(\n"
        "    dataset, batch_size=batch_size, shuffle=True,\n"
        "    num_workers=8,            # start near os.cpu_count() // GPUs per node\n"
        "    pin_memory=True,          # page-locked batches: fast, asynchronous host-to-device copies\n"
        "    persistent_workers=True,  # keep workers alive between epochs\n"
        "    prefetch_factor=4,        # batches loaded ahead per worker\n"
        ")",
        removes(Cause.DATA_LOADING, x.idle(Cause.DATA_LOADING)),
    )]


def remove_host_sync(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    if x.share(Cause.HOST_SYNC) < MIN_SHARE:
        return []
    return [x.rec(
        "remove_host_sync", Cause.HOST_SYNC,
        "Stop synchronizing with the GPU every step (.item(), .cpu(), torch.cuda.synchronize())",
        {"host_sync_ms_per_step": _ms(x.idle(Cause.HOST_SYNC)),
         "sync_calls_per_step": round(k.syncs_per_step, 2), "item_calls_per_step": round(k.item_calls_per_step, 2)},
        "# find the syncs: warns at every synchronizing call\n"
        "torch.cuda.set_sync_debug_mode(\"warn\")\n"
        "# keep running metrics on the GPU and read them rarely\n"
        "running_loss += loss.detach()\n"
        "if step % 100 == 0:\n"
        "    print(running_loss.item() / 100); running_loss.zero_()",
        removes(Cause.HOST_SYNC, x.idle(Cause.HOST_SYNC)),
    )]


def pinned_memory(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    if x.share(Cause.MEMCPY) < MIN_SHARE and not (k.pageable_htod_copies and x.idle(Cause.MEMCPY) > 0):
        return []
    return [x.rec(
        "pinned_memory_non_blocking", Cause.MEMCPY,
        "Copy batches from pinned memory with non_blocking=True",
        {"memcpy_ms_per_step": _ms(x.idle(Cause.MEMCPY)),
         "pageable_htod_copies": k.pageable_htod_copies, "pageable_htod_mib": round(k.pageable_htod_bytes / MIB, 2)},
        "loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
        "for x, y in loader:\n"
        "    x = x.to(device, non_blocking=True)\n"
        "    y = y.to(device, non_blocking=True)\n"
        "# tensors you build yourself: t = t.pin_memory() once, then .to(device, non_blocking=True)",
        removes(Cause.MEMCPY, x.idle(Cause.MEMCPY)),
    )]


def cuda_graphs(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    if x.share(Cause.LAUNCH_OVERHEAD) < 0.10:
        return []
    return [x.rec(
        "cuda_graphs", Cause.LAUNCH_OVERHEAD,
        "Launch-bound: capture the step with CUDA graphs (torch.compile mode=\"reduce-overhead\")",
        {"launch_overhead_ms_per_step": _ms(x.idle(Cause.LAUNCH_OVERHEAD)),
         "kernels_per_step": round(x.per_window_step(k.count), 1), "short_kernel_share": round(k.short_kernel_share, 3),
         "median_launch_us": None if k.median_launch_us is None else round(k.median_launch_us, 2)},
        "model = torch.compile(model, mode=\"reduce-overhead\")   # fuses kernels and replays CUDA graphs\n"
        "# static shapes required; or capture by hand: torch.cuda.make_graphed_callables(model, (sample_input,))",
        removes(Cause.LAUNCH_OVERHEAD, x.idle(Cause.LAUNCH_OVERHEAD)),
    )]


def larger_batch(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    starved = x.share(Cause.LAUNCH_OVERHEAD) + x.share(Cause.CPU_COMPUTE)
    if k.short_kernel_share < 0.5 or starved < 0.2:
        return []
    return [x.rec(
        "larger_batch", Cause.LAUNCH_OVERHEAD,
        "Tiny kernels starve the GPU: double the per-GPU batch (scale the learning rate with it)",
        {"short_kernel_share": round(k.short_kernel_share, 3), "launch_plus_cpu_share": round(starved, 3),
         "assumption": "2x batch: host time per sample halves, so half of this idle goes"},
        "batch_size = 2 * batch_size\n"
        "lr = base_lr * batch_size / base_batch_size      # linear scaling rule (SGD); sqrt scaling for Adam-type\n"
        "# out of memory? keep the per-GPU batch and accumulate k micro-batches per optimizer step\n"
        "# (under model.no_sync() for all but the last one with DDP)",
        Effect(idle={Cause.LAUNCH_OVERHEAD.value: x.idle(Cause.LAUNCH_OVERHEAD) / 2,
                     Cause.CPU_COMPUTE.value: x.idle(Cause.CPU_COMPUTE) / 2}), confidence="low",
    )]


def cpu_work(x: RuleInput) -> list[Proposal]:
    if x.share(Cause.CPU_COMPUTE) < 0.10:
        return []
    return [x.rec(
        "move_cpu_work", Cause.CPU_COMPUTE,
        "Host-side operators that launch nothing hold the GPU back",
        {"cpu_compute_ms_per_step": _ms(x.idle(Cause.CPU_COMPUTE))},
        "# move per-sample preprocessing into Dataset.__getitem__ (runs in DataLoader workers)\n"
        "# and fuse Python-level tensor code: model = torch.compile(model)\n"
        "# locate it: torch.profiler.profile(..., with_stack=True) and sort by self CPU time",
        removes(Cause.CPU_COMPUTE, x.idle(Cause.CPU_COMPUTE)),
    )]


AMP_SPEEDUP = 2.0
"""Conservative speed-up of a GEMM/conv moved from fp32 to fp16/bf16 tensor cores."""


def mixed_precision(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    if k.reduced_precision_gemm_share is None or k.reduced_precision_gemm_share > 0.5 or k.gemm_share < 0.3:
        return []
    hw = x.hw
    fp32_gemm_s = x.per_window_step(k.total_s * k.gemm_share * (1 - k.reduced_precision_gemm_share))
    evidence: dict[str, object] = {
        "gemm_share_of_kernel_time": round(k.gemm_share, 3),
        "reduced_precision_share_of_gemm": round(k.reduced_precision_gemm_share, 3),
        "fp32_gemm_ms_per_step": _ms(fp32_gemm_s), "hardware": hw.label, "dtype": "bf16" if hw.bf16 else "fp16",
    }
    if hw.tensor_cores is False:
        effect = Effect(reason=f"{hw.label} has no tensor cores: fp16 halves memory traffic, "
                               "but the GEMM speed-up cannot be estimated")
    else:
        evidence["assumption"] = f"fp32 GEMM/conv time shrinks {AMP_SPEEDUP:g}x on the matrix units" + (
            "; the trace records no compute capability: tensor cores assumed" if hw.tensor_cores is None else "")
        effect = Effect(busy=fp32_gemm_s * (1 - 1 / AMP_SPEEDUP))
    return [x.rec(
        "mixed_precision", COMPUTE, "GEMMs/convolutions run in fp32: use mixed precision (torch.autocast)",
        evidence, amp_snippet(hw), effect, confidence="medium" if hw.tensor_cores else "low",
    )]


def cudnn_benchmark(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    if k.conv_share < 0.2:
        return []
    return [x.rec(
        "cudnn_benchmark", COMPUTE,
        "Convolutions dominate: let cuDNN pick the fastest algorithms for your shapes",
        {"conv_share_of_kernel_time": round(k.conv_share, 3)},
        "torch.backends.cudnn.benchmark = True   # set once, before the first forward; input shapes must not vary",
        Effect(reason="a trace does not hold the algorithms cuDNN would pick; "
                      "helps only with fixed input shapes"), confidence="low",
    )]


PROFILE_ARGS = (
    "with torch.profiler.profile(\n"
    "    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],\n"
    "    schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),\n"
    "    record_shapes=True,        # operator input shapes\n"
    "    with_stack=True,           # Python stacks of the operators: where the host time goes\n"
    "    on_trace_ready=torch.profiler.tensorboard_trace_handler(\"run/traces\"),\n"
    ") as prof:\n"
    "    for batch in loader:\n"
    "        train_step(batch)\n"
    "        prof.step()"
)
"""The profiler call that records what attribution needs: CPU operators, runtime calls and their links."""


def explain_unattributed(x: RuleInput) -> list[Proposal]:
    """When the trace cannot say why the device waits, say what it lacks and how to record it."""
    un = x.idle(Cause.UNATTRIBUTED)
    idle = sum(v for k, v in x.state.idle.items() if k != Cause.STRAGGLER_WAIT.value)
    if un <= 0 or x.share(Cause.UNATTRIBUTED) < MIN_SHARE:
        return []
    largest = max(x.state.idle, key=lambda c: x.state.idle[c])
    if largest != Cause.UNATTRIBUTED.value and un <= idle / 2:
        return []
    ev = x.report.host_events
    if ev is None:
        missing = ["step timing cannot split idle into launch overhead, host syncs and host work"]
        fix = "tracker.profile(steps=range(100, 105))   # a profiler trace of 5 steps, for gpuidle analyze\n" \
              "# it records as:\n" + "\n".join("# " + line for line in PROFILE_ARGS.splitlines())
    else:
        missing = []
        if ev.get("cpu_ops", 0) == 0:
            missing.append("no CPU operators (ProfilerActivity.CPU was not recorded)")
        if ev.get("runtime_calls", 0) == 0:
            missing.append("no CUDA/HIP runtime calls")
        elif ev.get("linked_launches", 0) == 0:
            missing.append("no runtime call is linked to a kernel (no correlation ids)")
        if ev.get("graph_or_driver_launches", 0):
            missing.append(f"{ev['graph_or_driver_launches']} launches through CUDA graphs or the driver API: "
                           "their kernels have no operator")
        if not missing:
            missing.append("the host is between operators (Python, or a thread the trace does not record)")
        fix = PROFILE_ARGS
    return [x.rec(
        "record_cpu_activity", Cause.UNATTRIBUTED,
        "The trace cannot explain most of the idle time: record host activity with it",
        {"unattributed_ms_per_step": _ms(un), "unattributed_share_of_idle": round(un / idle, 3) if idle else None,
         "missing": missing},
        fix, Effect(reason="the trace does not say what the host did while the device waited"),
    )]


def exposed_communication(x: RuleInput) -> list[Proposal]:
    """DDP tuning when collectives run with no compute beside them."""
    comm = x.report.communication
    if x.share(Cause.COMMUNICATION) < MIN_SHARE:
        return []
    out: list[Proposal] = []
    reduces = [c for c in comm.collectives if c.collective == "all_reduce"]
    count = x.per_window_step(sum(c.count for c in reduces))
    nbytes = x.per_window_step(sum(c.bytes for c in reduces))
    exposed = x.idle(Cause.COMMUNICATION)
    if x.accumulation_repeats > 1:
        out.append(x.rec(
            "ddp_no_sync", Cause.COMMUNICATION,
            f"Gradients are all-reduced on each of {x.accumulation_repeats} micro-batches: skip all but the last",
            {"all_reduce_repeats_per_step": x.accumulation_repeats,
             "exposed_comm_ms_per_step": _ms(exposed)},
            "for i, batch in enumerate(micro_batches):\n"
            "    ctx = model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()\n"
            "    with ctx:\n"
            "        model(batch).backward()\n"
            "optimizer.step()",
            removes(Cause.COMMUNICATION, exposed * (1 - 1 / x.accumulation_repeats)), confidence="medium",
        ))
    if count >= 8 and nbytes > 0:
        cap = max(25, math.ceil(nbytes / 4 / MIB))
        out.append(x.rec(
            "ddp_bucket_cap", Cause.COMMUNICATION,
            f"{count:.0f} all-reduces per step: fewer, larger buckets (bucket_cap_mb={cap})",
            {"all_reduces_per_step": round(count, 1), "all_reduce_mib_per_step": round(nbytes / MIB, 2),
             "exposed_comm_ms_per_step": _ms(exposed),
             "assumption": "about 4 buckets per step; at most the exposed communication is saved"},
            f"model = torch.nn.parallel.DistributedDataParallel(\n"
            f"    model, device_ids=[local_rank],\n"
            f"    bucket_cap_mb={cap},             # default 25\n"
            f"    gradient_as_bucket_view=True,   # no copy between gradients and buckets\n"
            f"    static_graph=True,              # if the used parameters never change between steps\n"
            f")",
            removes(Cause.COMMUNICATION, exposed), confidence="medium",
        ))
    sized = [c for c in reduces if c.busbw_gbps is not None]
    message = sum(c.bytes for c in reduces) / max(1, sum(c.count for c in reduces))
    if message >= COMPRESSIBLE_MESSAGE:  # the tracker knows the bytes, not the bandwidth: sized may be empty
        worst = min(sized, key=lambda c: c.busbw_gbps or 0.0) if sized else None
        out.append(x.rec(
            "comm_compression", Cause.COMMUNICATION,
            "Gradient all-reduce is exposed: compress gradients before it",
            {"exposed_comm_ms_per_step": _ms(exposed),
             "mean_message_mib": round(message / MIB, 2),
             "overlap_ratio": None if comm.overlap_ratio is None else round(comm.overlap_ratio, 3),
             "all_reduce_busbw_gbps": round(worst.busbw_gbps or 0.0, 2) if worst else None,
             "assumption": "bf16 halves the bytes on the wire: half the exposed time"},
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "model.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)  # or fp16_compress_hook\n"
            "# stronger: from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD\n"
            "#   state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,\n"
            "#                                  start_powerSGD_iter=1_000)\n"
            "#   model.register_comm_hook(state, powerSGD.powerSGD_hook)",
            removes(Cause.COMMUNICATION, exposed / 2), confidence="medium",
        ))
    large = [c for c in sized if c.count and c.bytes / c.count >= LARGE_MESSAGE
             and (c.busbw_gbps or 0.0) < LOW_BUSBW_GBPS]
    if large:
        c = large[0]
        out.append(x.rec(
            "nccl_transport", Cause.COMMUNICATION,
            f"Large all-reduces reach only {c.busbw_gbps or 0.0:.1f} GB/s bus bandwidth: check the NCCL transport",
            {"all_reduce_busbw_gbps": round(c.busbw_gbps or 0.0, 2),
             "mean_message_mib": round(c.bytes / c.count / MIB, 1),
             "caveat": "kernel time includes waiting for other ranks; "
                       "measure the link itself with gpuidle bench allreduce"},
            "# which transport does NCCL pick? (debug output: not for production runs)\n"
            "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET torchrun ...   # look for 'via NET/Socket' vs 'NET/IB'\n"
            "# pin NCCL to the fast interface and make sure InfiniBand is not disabled\n"
            "export NCCL_SOCKET_IFNAME=ib0        # or your high-speed Ethernet interface, e.g. ens5\n"
            "export NCCL_IB_DISABLE=0",
            removes(Cause.COMMUNICATION, exposed / 2), confidence="low",
        ))
    busy = x.device.busy_s
    if x.report.communication.comm_s >= busy > 0:
        out.append(x.rec(
            "comm_bound_batch", Cause.COMMUNICATION,
            "Communication takes as long as compute: more work per all-reduce",
            {"comm_s": round(comm.comm_s, 6), "compute_busy_s": round(busy, 6)},
            "# raise the per-GPU batch (scale lr linearly), or accumulate k micro-batches per optimizer step\n"
            "# under model.no_sync() so gradients are all-reduced once per k",
            removes(Cause.COMMUNICATION, exposed / 2), confidence="low",
        ))
    return out


RULES: list[Rule] = [
    dataloader_workers, remove_host_sync, pinned_memory, cuda_graphs, larger_batch, cpu_work,
    mixed_precision, cudnn_benchmark, exposed_communication, explain_unattributed,
]


def recommend(report: RankReport, accumulation_repeats: int = 1, rules: list[Rule] = RULES,
              include_all: bool = False) -> list[Proposal]:
    """Every rule's proposals for one rank, on its steady-state step (all steps with ``include_all``)."""
    if not report.steps:
        return []
    x = RuleInput(report, report.primary(), rank_state(report, include_all),
                  len(counted(report.steps, include_all)), accumulation_repeats)
    return [p for rule in rules for p in rule(x)]


STRAGGLER_FIX = {
    Cause.DATA_LOADING.value: "# this rank waits for data: check its shard (file sizes, sample counts),\n"
                              "# its storage and its DataLoader workers (CPU count per rank on that host)",
    Cause.CPU_COMPUTE.value: "# this rank's CPU is slower or busier: check other processes on its host\n"
                             "# (top/htop), CPU frequency scaling, and NUMA binding (numactl --cpunodebind)",
    "compute": "# this rank's kernels take longer: check its GPU clocks and throttling\n"
               "# ({smi}), and whether its batches hold more samples\n"
               "# or longer sequences than the others'",
}
SMI_PERFORMANCE = {"nvidia-smi": "nvidia-smi -q -d PERFORMANCE", "rocm-smi": "rocm-smi --showperflevel --showclocks"}


def straggler_recommendations(job: JobReport, reports: list[RankReport], include_all: bool = False) -> list[Proposal]:
    """A straggler named with evidence: its fix brings its own step time to its peers' median."""
    out = []
    by_rank = {r.rank: r for r in reports}
    for s in job.stragglers:
        others = [r for r in reports if r.rank != s.rank and r.steps]
        if not others or s.rank not in by_rank:
            continue
        peers = float(np.median([rank_state(r, include_all).own_s for r in others]))
        mine = rank_state(by_rank[s.rank], include_all)
        smi = hardware(by_rank[s.rank].primary()).smi
        fix = STRAGGLER_FIX.get(s.cause, "# compare this rank's host (CPU load, storage, network) with a healthy one")
        fix = fix.replace("{smi}", SMI_PERFORMANCE.get(smi or "", "the device's clock and throttle counters"))
        pools = (s.cause,) if s.cause in mine.idle else ()
        rec = Recommendation(
            id=f"straggler_rank_{s.rank}", cause=Cause.STRAGGLER_WAIT.value,
            title=f"Rank {s.rank} is a straggler (score {s.score:.2f}): the other ranks wait for it",
            evidence={"rank": s.rank, "late_in_steps": s.steps, "mean_lateness_ms": _ms(s.lateness_s),
                      "score": round(s.score, 3), "score_interval": [s.score_low, s.score_high], "why": s.why,
                      "own_step_ms": _ms(mine.own_s), "peers_median_own_step_ms": _ms(peers)},
            fix=fix, gain=placeholder(), confidence="medium", rank=s.rank,
        )
        out.append(Proposal(rec, {s.rank: Effect(own_to=peers, pools=pools)}))
    return out
