"""Rules: measured findings in, ranked recommendations out.

Each rule is a small function ``(RuleInput) -> list[Recommendation]`` that fires only
on evidence from this trace, cites that evidence in numbers, gives a fix written
against the current PyTorch API, and states the expected gain: seconds per step
saved and the utilization that would follow if the idle time it addresses were
removed. ``confidence`` says how the gain was obtained: ``high`` is measured idle of
exactly that cause; ``medium`` and ``low`` are estimates with their assumption in
the evidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpuidle.advice import calc
from gpuidle.analysis.ranks import PERSISTENT_SCORE
from gpuidle.model import Cause, DeviceReport, Gain, JobReport, RankReport, Recommendation

MIB = 1 << 20
COMPUTE = "compute"
"""The ``cause`` of a recommendation that shortens busy time rather than idle time."""


@dataclass(frozen=True, slots=True)
class RuleInput:
    """One rank's report, plus what the rules keep asking of it."""

    report: RankReport
    device: DeviceReport
    """The device with the most busy time: the one the rank trains on."""
    steps: int
    accumulation_repeats: int
    """How many times the same all-reduce sequence repeats inside a step (1: no repeat)."""

    def idle(self, cause: Cause) -> float:
        return self.device.idle_by_cause_s[cause.value]

    def share(self, cause: Cause) -> float:
        return self.idle(cause) / self.device.window_s if self.device.window_s else 0.0

    def per_step(self, seconds: float) -> float:
        return seconds / self.steps

    def gain(self, idle_removed_s: float, busy_removed_s: float = 0.0) -> Gain:
        d = self.device
        return Gain(
            step_s_saved=self.per_step(idle_removed_s + busy_removed_s),
            utilization_after=calc.utilization_after(d.busy_s, d.window_s, idle_removed_s, busy_removed_s),
        )

    def rec(self, id: str, cause: Cause | str, title: str, evidence: dict[str, object], fix: str,
            gain: Gain, confidence: str = "high") -> Recommendation:
        evidence = {"device": self.device.device, "steps": self.steps, **evidence}
        return Recommendation(id=id, cause=str(cause), title=title, evidence=evidence, fix=fix,
                              gain=gain, confidence=confidence, rank=self.report.rank)


Rule = Callable[[RuleInput], list[Recommendation]]
LARGE_MESSAGE = 16 * MIB
LOW_BUSBW_GBPS = 10.0
"""Below this, a large all-reduce is not on NVLink or InfiniBand-class bandwidth."""
MIN_SHARE = 0.03
"""A cause below 3 % of the window is not worth a recommendation."""


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def dataloader_workers(x: RuleInput) -> list[Recommendation]:
    if x.share(Cause.DATA_LOADING) < MIN_SHARE:
        return []
    return [x.rec(
        "dataloader_workers", Cause.DATA_LOADING,
        "Load batches in parallel: more DataLoader workers, pinned memory, prefetching",
        {"data_loading_ms_per_step": _ms(x.per_step(x.idle(Cause.DATA_LOADING))),
         "data_loading_share": round(x.share(Cause.DATA_LOADING), 4)},
        "loader = torch.utils.data.DataLoader(\n"
        "    dataset, batch_size=batch_size, shuffle=True,\n"
        "    num_workers=8,            # start near os.cpu_count() // GPUs per node\n"
        "    pin_memory=True,          # page-locked batches: fast, asynchronous host-to-device copies\n"
        "    persistent_workers=True,  # keep workers alive between epochs\n"
        "    prefetch_factor=4,        # batches loaded ahead per worker\n"
        ")",
        x.gain(x.idle(Cause.DATA_LOADING)),
    )]


def remove_host_sync(x: RuleInput) -> list[Recommendation]:
    k = x.report.kernels
    if x.share(Cause.HOST_SYNC) < MIN_SHARE:
        return []
    return [x.rec(
        "remove_host_sync", Cause.HOST_SYNC,
        "Stop synchronizing with the GPU every step (.item(), .cpu(), torch.cuda.synchronize())",
        {"host_sync_ms_per_step": _ms(x.per_step(x.idle(Cause.HOST_SYNC))),
         "sync_calls_per_step": round(k.syncs_per_step, 2), "item_calls_per_step": round(k.item_calls_per_step, 2)},
        "# find the syncs: warns at every synchronizing call\n"
        "torch.cuda.set_sync_debug_mode(\"warn\")\n"
        "# keep running metrics on the GPU and read them rarely\n"
        "running_loss += loss.detach()\n"
        "if step % 100 == 0:\n"
        "    print(running_loss.item() / 100); running_loss.zero_()",
        x.gain(x.idle(Cause.HOST_SYNC)),
    )]


def pinned_memory(x: RuleInput) -> list[Recommendation]:
    k = x.report.kernels
    if x.share(Cause.MEMCPY) < MIN_SHARE and not (k.pageable_htod_copies and x.idle(Cause.MEMCPY) > 0):
        return []
    return [x.rec(
        "pinned_memory_non_blocking", Cause.MEMCPY,
        "Copy batches from pinned memory with non_blocking=True",
        {"memcpy_ms_per_step": _ms(x.per_step(x.idle(Cause.MEMCPY))),
         "pageable_htod_copies": k.pageable_htod_copies, "pageable_htod_mib": round(k.pageable_htod_bytes / MIB, 2)},
        "loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
        "for x, y in loader:\n"
        "    x = x.to(device, non_blocking=True)\n"
        "    y = y.to(device, non_blocking=True)\n"
        "# tensors you build yourself: t = t.pin_memory() once, then .to(device, non_blocking=True)",
        x.gain(x.idle(Cause.MEMCPY)),
    )]


def cuda_graphs(x: RuleInput) -> list[Recommendation]:
    k = x.report.kernels
    if x.share(Cause.LAUNCH_OVERHEAD) < 0.10:
        return []
    return [x.rec(
        "cuda_graphs", Cause.LAUNCH_OVERHEAD,
        "Launch-bound: capture the step with CUDA graphs (torch.compile mode=\"reduce-overhead\")",
        {"launch_overhead_ms_per_step": _ms(x.per_step(x.idle(Cause.LAUNCH_OVERHEAD))),
         "kernels_per_step": round(k.count / x.steps, 1), "short_kernel_share": round(k.short_kernel_share, 3),
         "median_launch_us": None if k.median_launch_us is None else round(k.median_launch_us, 2)},
        "model = torch.compile(model, mode=\"reduce-overhead\")   # fuses kernels and replays CUDA graphs\n"
        "# static shapes required; or capture by hand: torch.cuda.make_graphed_callables(model, (sample_input,))",
        x.gain(x.idle(Cause.LAUNCH_OVERHEAD)),
    )]


def larger_batch(x: RuleInput) -> list[Recommendation]:
    k = x.report.kernels
    starved = x.share(Cause.LAUNCH_OVERHEAD) + x.share(Cause.CPU_COMPUTE)
    if k.short_kernel_share < 0.5 or starved < 0.2:
        return []
    saved = (x.idle(Cause.LAUNCH_OVERHEAD) + x.idle(Cause.CPU_COMPUTE)) / 2
    return [x.rec(
        "larger_batch", Cause.LAUNCH_OVERHEAD,
        "Tiny kernels starve the GPU: double the per-GPU batch (scale the learning rate with it)",
        {"short_kernel_share": round(k.short_kernel_share, 3), "launch_plus_cpu_share": round(starved, 3),
         "assumption": "2x batch: host time per sample halves, so half of this idle goes"},
        "batch_size = 2 * batch_size\n"
        "lr = base_lr * batch_size / base_batch_size      # linear scaling rule (SGD); sqrt scaling for Adam-type\n"
        "# out of memory? keep the per-GPU batch and accumulate k micro-batches per optimizer step\n"
        "# (under model.no_sync() for all but the last one with DDP)",
        x.gain(saved), confidence="low",
    )]


def cpu_work(x: RuleInput) -> list[Recommendation]:
    if x.share(Cause.CPU_COMPUTE) < 0.10:
        return []
    return [x.rec(
        "move_cpu_work", Cause.CPU_COMPUTE,
        "Host-side operators that launch nothing hold the GPU back",
        {"cpu_compute_ms_per_step": _ms(x.per_step(x.idle(Cause.CPU_COMPUTE)))},
        "# move per-sample preprocessing into Dataset.__getitem__ (runs in DataLoader workers)\n"
        "# and fuse Python-level tensor code: model = torch.compile(model)\n"
        "# locate it: torch.profiler.profile(..., with_stack=True) and sort by self CPU time",
        x.gain(x.idle(Cause.CPU_COMPUTE)),
    )]


AMP_SPEEDUP = 2.0
"""Conservative speed-up of a GEMM/conv moved from fp32 to fp16/bf16 tensor cores."""


def mixed_precision(x: RuleInput) -> list[Recommendation]:
    k = x.report.kernels
    if k.reduced_precision_gemm_share is None or k.reduced_precision_gemm_share > 0.5 or k.gemm_share < 0.3:
        return []
    fp32_gemm_s = k.total_s * k.gemm_share * (1 - k.reduced_precision_gemm_share)
    saved = fp32_gemm_s * (1 - 1 / AMP_SPEEDUP)
    return [x.rec(
        "mixed_precision", COMPUTE,
        "GEMMs/convolutions run in fp32: use mixed precision (torch.autocast)",
        {"gemm_share_of_kernel_time": round(k.gemm_share, 3),
         "reduced_precision_share_of_gemm": round(k.reduced_precision_gemm_share, 3),
         "assumption": f"fp32 GEMM/conv time shrinks {AMP_SPEEDUP:g}x on tensor cores"},
        "with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):   # Ampere+; no scaler needed\n"
        "    loss = model(x, y)\n"
        "loss.backward()\n"
        "# fp16 instead: scaler = torch.amp.GradScaler(\"cuda\"); scaler.scale(loss).backward();\n"
        "#               scaler.step(optimizer); scaler.update()",
        x.gain(0.0, busy_removed_s=saved), confidence="medium",
    )]


def cudnn_benchmark(x: RuleInput) -> list[Recommendation]:
    k = x.report.kernels
    if k.conv_share < 0.2:
        return []
    return [x.rec(
        "cudnn_benchmark", COMPUTE,
        "Convolutions dominate: let cuDNN pick the fastest algorithms for your shapes",
        {"conv_share_of_kernel_time": round(k.conv_share, 3),
         "assumption": "gain not estimable from one trace; helps only with fixed input shapes"},
        "torch.backends.cudnn.benchmark = True   # set once, before the first forward; input shapes must not vary",
        x.gain(0.0), confidence="low",
    )]


def exposed_communication(x: RuleInput) -> list[Recommendation]:
    """DDP tuning when collectives run with no compute beside them."""
    comm = x.report.communication
    if x.share(Cause.COMMUNICATION) < MIN_SHARE:
        return []
    out: list[Recommendation] = []
    reduces = [c for c in comm.collectives if c.collective == "all_reduce"]
    count = sum(c.count for c in reduces) / x.steps
    nbytes = sum(c.bytes for c in reduces) / x.steps
    exposed = x.idle(Cause.COMMUNICATION)
    if x.accumulation_repeats > 1:
        out.append(x.rec(
            "ddp_no_sync", Cause.COMMUNICATION,
            f"Gradients are all-reduced on each of {x.accumulation_repeats} micro-batches: skip all but the last",
            {"all_reduce_repeats_per_step": x.accumulation_repeats,
             "exposed_comm_ms_per_step": _ms(x.per_step(exposed))},
            "for i, batch in enumerate(micro_batches):\n"
            "    ctx = model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()\n"
            "    with ctx:\n"
            "        model(batch).backward()\n"
            "optimizer.step()",
            x.gain(exposed * (1 - 1 / x.accumulation_repeats)), confidence="medium",
        ))
    if count >= 8 and nbytes > 0:
        cap = max(25, math.ceil(nbytes / 4 / MIB))
        out.append(x.rec(
            "ddp_bucket_cap", Cause.COMMUNICATION,
            f"{count:.0f} all-reduces per step: fewer, larger buckets (bucket_cap_mb={cap})",
            {"all_reduces_per_step": round(count, 1), "all_reduce_mib_per_step": round(nbytes / MIB, 2),
             "exposed_comm_ms_per_step": _ms(x.per_step(exposed)),
             "assumption": "about 4 buckets per step; at most the exposed communication is saved"},
            f"model = torch.nn.parallel.DistributedDataParallel(\n"
            f"    model, device_ids=[local_rank],\n"
            f"    bucket_cap_mb={cap},             # default 25\n"
            f"    gradient_as_bucket_view=True,   # no copy between gradients and buckets\n"
            f"    static_graph=True,              # if the used parameters never change between steps\n"
            f")",
            x.gain(exposed), confidence="medium",
        ))
    sized = [c for c in reduces if c.busbw_gbps is not None]
    if sized:
        worst = min(sized, key=lambda c: c.busbw_gbps or 0.0)
        out.append(x.rec(
            "comm_compression", Cause.COMMUNICATION,
            "Gradient all-reduce is exposed: compress gradients before it",
            {"exposed_comm_ms_per_step": _ms(x.per_step(exposed)),
             "overlap_ratio": None if comm.overlap_ratio is None else round(comm.overlap_ratio, 3),
             "all_reduce_busbw_gbps": round(worst.busbw_gbps or 0.0, 2),
             "assumption": "bf16 halves the bytes on the wire: half the exposed time"},
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "model.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)  # or fp16_compress_hook\n"
            "# stronger: from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD\n"
            "#   state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,\n"
            "#                                  start_powerSGD_iter=1_000)\n"
            "#   model.register_comm_hook(state, powerSGD.powerSGD_hook)",
            x.gain(exposed / 2), confidence="medium",
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
                x.gain(exposed / 2), confidence="low",
            ))
    busy = x.device.busy_s
    if x.report.communication.comm_s >= busy > 0:
        out.append(x.rec(
            "comm_bound_batch", Cause.COMMUNICATION,
            "Communication takes as long as compute: more work per all-reduce",
            {"comm_s": round(comm.comm_s, 6), "compute_busy_s": round(busy, 6)},
            "# raise the per-GPU batch (scale lr linearly), or accumulate k micro-batches per optimizer step\n"
            "# under model.no_sync() so gradients are all-reduced once per k",
            x.gain(exposed / 2), confidence="low",
        ))
    return out


RULES: list[Rule] = [
    dataloader_workers, remove_host_sync, pinned_memory, cuda_graphs, larger_batch, cpu_work,
    mixed_precision, cudnn_benchmark, exposed_communication,
]


def recommend(report: RankReport, accumulation_repeats: int = 1, rules: list[Rule] = RULES) -> list[Recommendation]:
    """All recommendations for one rank, largest expected gain first."""
    x = RuleInput(report, report.primary(), max(len(report.steps), 1), accumulation_repeats)
    out = [r for rule in rules for r in rule(x)]
    return rank_by_gain(out)


def rank_by_gain(recs: list[Recommendation]) -> list[Recommendation]:
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(recs, key=lambda r: (-r.gain.step_s_saved, order.get(r.confidence, 3), r.id))


def straggler_recommendations(job: JobReport, reports: list[RankReport]) -> list[Recommendation]:
    """A persistent straggler: look at that rank's host, data shard and CPU, with its numbers."""
    out = []
    for s in job.stragglers:
        if s.score < PERSISTENT_SCORE and len(s.steps) < 2:
            continue
        others = [r for r in reports if r.rank != s.rank]
        if not others:
            continue
        typical = min(others, key=lambda r: abs(r.primary().utilization - float(np.median(
            [o.primary().utilization for o in others]))))
        x = RuleInput(typical, typical.primary(), max(len(typical.steps), 1), 1)
        wait = x.idle(Cause.STRAGGLER_WAIT)
        fix = {
            Cause.DATA_LOADING.value: "# this rank waits for data: check its shard (file sizes, sample counts),\n"
                                      "# its storage and its DataLoader workers (CPU count per rank on that host)",
            Cause.CPU_COMPUTE.value: "# this rank's CPU is slower or busier: check other processes on its host\n"
                                     "# (top/htop), CPU frequency scaling, and NUMA binding (numactl --cpunodebind)",
            "compute": "# this rank's kernels take longer: check its GPU clocks and throttling\n"
                       "# (nvidia-smi -q -d PERFORMANCE), and whether its batches hold more samples\n"
                       "# or longer sequences than the others'",
        }.get(s.cause, "# compare this rank's host (CPU load, storage, network) with a healthy one")
        out.append(Recommendation(
            id=f"straggler_rank_{s.rank}", cause=Cause.STRAGGLER_WAIT.value,
            title=f"Rank {s.rank} is a straggler (score {s.score:.2f}): the other ranks wait for it",
            evidence={"rank": s.rank, "late_in_steps": s.steps, "mean_lateness_ms": _ms(s.lateness_s),
                      "score": round(s.score, 3), "why": s.why,
                      "wait_on_rank": typical.rank, "wait_ms_per_step": _ms(x.per_step(wait))},
            fix=fix,
            gain=x.gain(wait), confidence="medium", rank=s.rank,
        ))
    return out
