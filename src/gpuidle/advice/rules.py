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

import functools

import msgspec

from gpuidle.advice.comm_rules import embedding_all_to_all, exposed_all_to_all, exposed_communication
from gpuidle.advice.frameworks import UNEXPLAINED_BY_TRACKER, graph_fix
from gpuidle.advice.hardware import hardware
from gpuidle.advice.host_rules import cpu_work, larger_batch
from gpuidle.advice.mesh_rules import MESH_RULES
from gpuidle.advice.precision import mixed_precision, recast_kernels, tf32
from gpuidle.advice.preconditions import offered
from gpuidle.advice.ruleinput import COMPUTE, MIB, MIN_SHARE, Rule, RuleInput, _ms, removes, removes_between
from gpuidle.advice.whatif import Effect, Proposal, excess, modelled, placeholder, rank_state
from gpuidle.analysis.steps import counted
from gpuidle.model import Cause, Declined, JobReport, RankReport, Recommendation, StepReport
from gpuidle.model.arrays import median_of


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
    evidence: dict[str, object] = {
        "host_sync_ms_per_step": _ms(x.idle(Cause.HOST_SYNC)),
        "sync_calls_per_step": round(k.syncs_per_step, 2), "item_calls_per_step": round(k.item_calls_per_step, 2)}
    sources = x.report.sync_sources
    if sources:
        evidence["waits_from"] = {s.function[:120]: f"{_ms(x.per_window_step(s.idle_s))} ms/step, {s.share:.0%}"
                                  for s in sources}
    where = "".join(f"# waits from {s.function[:100]}: {s.share:.0%} of the sync idle\n" for s in sources[:3])
    return [x.rec(
        "remove_host_sync", Cause.HOST_SYNC,
        "Stop synchronizing with the GPU every step (.item(), .cpu(), torch.cuda.synchronize())",
        evidence,
        where + (INFERENCE_SYNC if x.inference else
                 "# find the syncs: warns at every synchronizing call\n"
                 "torch.cuda.set_sync_debug_mode(\"warn\")\n"
                 "# keep running metrics on the GPU and read them rarely\n"
                 "running_loss += loss.detach()\n"
                 "if step % 100 == 0:\n"
                 "    print(running_loss.item() / 100); running_loss.zero_()"),
        removes(Cause.HOST_SYNC, x.idle(Cause.HOST_SYNC)),
    )]


INFERENCE_SYNC = (
    "# find the syncs: warns at every synchronizing call\n"
    "torch.cuda.set_sync_debug_mode(\"warn\")\n"
    "# read results back once per batch of requests, into pinned memory, and overlap the copy:\n"
    "out_host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)\n"
    "out_host.copy_(out, non_blocking=True)\n"
    "done = torch.cuda.Event(); done.record()   # launch the next batch here, then done.synchronize()"
)


PINNED_SPEEDUP_LOW, PINNED_SPEEDUP_HIGH = 1.5, 2.0
"""How much faster a copy runs from pinned than from pageable memory: the driver stages pageable memory through a
pinned buffer, a copy more on the host; pinned transfers reach 1.5-2× the pageable rate on PCIe (NVIDIA's
bandwidthTest and "How to Optimize Data Transfers in CUDA C/C++")."""


def pinned_memory(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    pageable_s = x.per_window_step(k.pageable_copy_s)
    pageable_share = pageable_s / x.state.step_s if x.state.step_s else 0.0
    if x.share(Cause.MEMCPY) < MIN_SHARE and pageable_share < MIN_SHARE \
            and not (k.pageable_htod_copies and x.idle(Cause.MEMCPY) > 0):
        return []
    # a DataLoader's pin_memory only where the program has one (a serving engine builds its own tensors)
    loader = (x.report.host_events or {}).get("data_loader_calls", 0) > 0 or x.idle(Cause.DATA_LOADING) > 0
    evidence: dict[str, object] = {
        "memcpy_ms_per_step": _ms(x.idle(Cause.MEMCPY)), "pageable_htod_copies": k.pageable_htod_copies,
        "pageable_htod_mib": round(k.pageable_htod_bytes / MIB, 2), "pageable_copy_ms_per_step": _ms(pageable_s),
        "pageable_copy_gbps": k.pageable_copy_gbps, "data_loader_in_trace": loader}
    return [x.rec(
        "pinned_memory_non_blocking", Cause.MEMCPY,
        "Copy batches from pinned memory with non_blocking=True",
        evidence,
        ("loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
         "for x, y in loader:\n"
         "    x = x.to(device, non_blocking=True)\n"
         "    y = y.to(device, non_blocking=True)\n"
         "# tensors you build yourself: t = t.pin_memory() once, then .to(device, non_blocking=True)") if loader else
        ("# no data loader in the trace: pin the host tensors the program copies (once, for reused buffers)\n"
         "staging = torch.empty(shape, dtype=dtype, pin_memory=True)   # allocate once\n"
         "staging.copy_(host_tensor)\n"
         "x = staging.to(device, non_blocking=True)"),
        _pinned_effect(x.idle(Cause.MEMCPY), pageable_s, evidence),
    )]


def _pinned_effect(idle_s: float, pageable_s: float, evidence: dict[str, object]) -> Effect:
    """The host's copy idle goes (measured); the pageable copies' own device time shrinks by the pinned speed-up
    (modelled): one range, its ends the idle plus the copies' low and high saving."""
    if pageable_s <= 0:
        return removes(Cause.MEMCPY, idle_s)
    low, high = 1 - 1 / PINNED_SPEEDUP_LOW, 1 - 1 / PINNED_SPEEDUP_HIGH
    evidence["assumption"] = (f"copies from pinned memory run {PINNED_SPEEDUP_LOW:g}–{PINNED_SPEEDUP_HIGH:g}× as fast "
                              "as from pageable memory")
    mid = (low + high) / 2
    return modelled(Effect(idle={Cause.MEMCPY.value: idle_s}, busy=pageable_s * mid, measured_idle=True),
                    low / mid, high / mid)


GRAPH_LOW, GRAPH_HIGH = 0.5, 1.0
"""Share of launch gaps a CUDA-graph replay removes: all of them when the whole step is captured
(one launch replays every kernel), half when graph breaks leave part of the step eager."""


def cuda_graphs(x: RuleInput) -> list[Proposal]:
    """Launch overhead beyond the zero_grad fills, with the fix for the program's execution mode."""
    k = x.report.kernels
    zero_grad = x.mean_step(lambda s: s.zero_grad_launch_s)
    launch = max(0.0, x.idle(Cause.LAUNCH_OVERHEAD) - zero_grad)
    if not x.state.step_s or launch / x.state.step_s < 0.10:
        return []
    wording = graph_fix(x.report.workload)
    if wording is None:
        return []
    title, fix = wording
    ev = x.report.host_events or {}
    kernels = x.per_window_step(k.count)
    known = ev.get("runtime_calls", 0) > 0 and k.median_launch_us is not None
    evidence: dict[str, object] = {
        "launch_overhead_ms_per_step": _ms(x.idle(Cause.LAUNCH_OVERHEAD)),
        **({"zero_grad_launch_ms_per_step": _ms(zero_grad)} if zero_grad > 0 else {}),
        "graph_replayable_ms_per_step": _ms(launch), "kernels_per_step": round(kernels, 1),
        "short_kernel_share": round(k.short_kernel_share, 3),
        "median_launch_us": None if k.median_launch_us is None else round(k.median_launch_us, 2),
        "launch_calls_ms_per_step": _ms(x.per_window_step(ev.get("launch_call_us", 0) / 1e6)) if known else None,
        "launch_bound": "kernels x median launch call + 100 µs of dispatch each" if known else "unknown",
        "assumption": f"graph replay removes {GRAPH_LOW * 100:.0f}–{GRAPH_HIGH * 100:.0f} % of the launch gaps "
                      "(graph breaks and dynamic shapes leave part of the step eager)",
    }
    if not known:
        evidence["caveat"] = "the trace records no runtime calls: what launching costs is unknown"
    if x.report.workload is not None:
        evidence["execution"] = x.report.workload.execution
    return [x.rec("cuda_graphs", Cause.LAUNCH_OVERHEAD, title, evidence, fix,
                  removes_between(GRAPH_LOW, GRAPH_HIGH, {Cause.LAUNCH_OVERHEAD: launch}),
                  confidence="medium" if known else "low")]


def _zero_grad_idle(step: StepReport, cause: str) -> float:
    return step.zero_grad_s.get(cause, 0.0)


def zero_grad_set_to_none(x: RuleInput) -> list[Proposal]:
    """Per-parameter fills launched by ``zero_grad()``: one kernel per parameter, gone with ``set_to_none``."""
    causes = {c for s in x.report.steps for c in s.zero_grad_s} or {Cause.LAUNCH_OVERHEAD.value}
    by_cause = {c: x.mean_step(functools.partial(_zero_grad_idle, cause=c)) for c in sorted(causes)}
    if not by_cause.get(Cause.LAUNCH_OVERHEAD.value):  # a report without the split (older): its launches alone
        by_cause[Cause.LAUNCH_OVERHEAD.value] = x.mean_step(lambda s: s.zero_grad_launch_s)
    zero_grad = sum(by_cause.values())
    if not x.state.step_s or zero_grad / x.state.step_s < MIN_SHARE:
        return []
    return [x.rec(
        "zero_grad_set_to_none", Cause.LAUNCH_OVERHEAD,
        "zero_grad() launches a fill per parameter: set gradients to None instead",
        {"zero_grad_idle_ms_per_step": _ms(zero_grad),
         "zero_grad_idle_by_cause_ms": {c: _ms(v) for c, v in by_cause.items() if v},
         "launch_overhead_ms_per_step": _ms(x.idle(Cause.LAUNCH_OVERHEAD))},
        "optimizer.zero_grad(set_to_none=True)   # the default since PyTorch 2.0; no kernel per parameter\n"
        "# a loop of p.grad.zero_() or model.zero_grad(set_to_none=False) does the same per-parameter fills",
        Effect(idle={c: v for c, v in by_cause.items() if v}, part="zero_grad"),
    )]


def cudnn_benchmark(x: RuleInput) -> list[Proposal]:
    k = x.report.kernels
    if k.conv_share < 0.2:
        return []
    library = x.hw.conv_library
    rocm = "\n# ROCm builds: torch.backends.cudnn drives MIOpen; this turns on its algorithm search" \
        if library == "MIOpen" else ""
    return [x.rec(
        "cudnn_benchmark", COMPUTE,
        f"Convolutions dominate: let {library} pick the fastest algorithms for your shapes",
        {"conv_share_of_kernel_time": round(k.conv_share, 3)},
        "torch.backends.cudnn.benchmark = True   # set once, before the first forward; input shapes must not vary"
        + rocm,
        Effect(reason=f"a trace does not hold the algorithms {library} would pick; "
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
    """When a tracker run cannot say why the device waits, how to record a profile that can. A trace's own gaps are
    said as what it cannot tell (:mod:`gpuidle.analysis.trace_quality`), never as a fix."""
    un = x.idle(Cause.UNATTRIBUTED)
    idle = sum(v for k, v in x.state.idle.items() if k != Cause.STRAGGLER_WAIT.value)
    if x.report.host_events is not None or un <= 0 or x.share(Cause.UNATTRIBUTED) < MIN_SHARE:
        return []
    largest = max(x.state.idle, key=lambda c: x.state.idle[c])
    if largest != Cause.UNATTRIBUTED.value and un <= idle / 2:
        return []
    fix = "tracker.profile(steps=range(100, 105))   # a profiler trace of 5 steps, for gpuidle analyze\n" \
          "# it records as:\n" + "\n".join("# " + line for line in PROFILE_ARGS.splitlines())
    return [x.rec(
        "record_cpu_activity", Cause.UNATTRIBUTED, UNEXPLAINED_BY_TRACKER,
        {"unattributed_ms_per_step": _ms(un), "unattributed_share_of_idle": round(un / idle, 3) if idle else None,
         "missing": ["step timing cannot split idle into launch overhead, host syncs and host work"],
         "recorded_by": "step tracker"},
        fix, Effect(reason="the trace does not say what the host did while the device waited"),
    )]


RULES: list[Rule] = [
    dataloader_workers, remove_host_sync, pinned_memory, cuda_graphs, zero_grad_set_to_none, larger_batch, cpu_work,
    tf32, mixed_precision, recast_kernels, cudnn_benchmark, exposed_communication, exposed_all_to_all,
    embedding_all_to_all, explain_unattributed,
]


def recommend(report: RankReport, accumulation_repeats: int = 1, rules: list[Rule] | None = None,
              include_all: bool = False) -> tuple[list[Proposal], list[Declined]]:
    """Every rule's proposals for one rank, on its steady-state step (all steps with ``include_all``), those whose
    preconditions hold (``advice.preconditions``) and those declined with the check that failed: by default
    :data:`RULES` and the sharded data-parallel rules (``advice.sharded``, built on :class:`RuleInput`)."""
    from gpuidle.advice.sharded import SHARDED_RULES

    if not report.steps:
        return [], []
    rules = rules if rules is not None else [*RULES, *SHARDED_RULES, *MESH_RULES]
    x = RuleInput(report, report.primary(), rank_state(report, include_all),
                  len(counted(report.steps, include_all)), accumulation_repeats, include_all)
    proposals, declined = offered(x, [p for rule in rules for p in rule(x)])
    return [*(q for p in proposals if (q := per_step(x, p)) is not None), *unsized_causes(x, proposals)], declined


RECUR_STEPS = 2
RECUR_SHARE = 0.2
"""A per-step gain needs its cause to recur: in at least two steady steps and a fifth of them. A cause every few
steps (a log line every fourth step) costs its mean in every step; one event in one step costs nothing per step.
Recurring in half the steps would be too strict for causes timed with jitter, whose idle lands in some steps and
not their neighbours (a tracker's completions stamped in bursts on a busy host)."""
PRESENT = 0.005
"""A cause is in a step where its idle is at least this share of the step."""


def per_step(x: RuleInput, p: Proposal) -> Proposal | None:
    """``p`` as it is where each cause it removes recurs (:data:`RECUR_SHARE`; in a window of one step, where no one
    call holds half of the cause's idle: it recurs within the step); else with its gain not estimable and the
    reason: one call in one step is no per-step cause, nor is the idle of a trace that is a fragment of a step. A
    fix of busy time alone (precision: the GEMMs' fp32 time) is a property of the kernels each step runs, estimable
    from one step; a fix whose idle is an outlier but whose busy part recurs (pageable copies' device time every
    step) keeps that part. None where its only cause is in no steady step at all (:data:`PRESENT`): a fix for idle
    the steps lack is none."""
    steps = counted(x.report.steps, x.include_all)
    effect = p.effects.get(x.report.rank)
    if effect is None or effect.reason is not None:
        return p
    causes = [c for c, v in effect.idle.items() if v > 0]
    fragment = [q.says for q in x.report.quality if q.kind == "fragment"]
    if fragment and causes:  # the idle of a fragment may be the recording's, not the step's: thin evidence
        why = f"the trace holds {fragment[0]}: no per-step gain is taken from its idle"
        return Proposal(msgspec.structs.replace(p.rec, confidence="low"),
                        {**p.effects, x.report.rank: msgspec.structs.replace(effect, reason=why)})
    single = [c for c in causes if steps and c in steps[0].main_calls]
    if len(steps) < 2 and single:
        why = (f"one step in the window, its {', '.join(single)} idle under one call "
               f"({steps[0].main_calls[single[0]].words()}): whether it recurs each step cannot be shown, so no "
               "per-step gain is taken from it")
        return Proposal(p.rec, {**p.effects, x.report.rank: msgspec.structs.replace(effect, reason=why)})
    if len(steps) < 2:
        return p  # idle spread over many calls recurs within the step
    step = float(median_of([s.dur_s for s in steps]))
    if causes and effect.busy < PRESENT * step and not any(
            s.idle_by_cause_s.get(c, 0.0) >= PRESENT * s.dur_s > 0 for s in steps for c in causes):
        return None
    outliers: dict[str, str] = {}
    for cause, seconds in effect.idle.items():
        if seconds <= 0:
            continue
        where = [s for s in steps if s.dur_s > 0 and s.idle_by_cause_s.get(cause, 0.0) >= PRESENT * s.dur_s]
        present = len(where)
        if present < max(RECUR_STEPS, RECUR_SHARE * len(steps)):
            named = ", ".join(f"step {s.step}: {s.idle_by_cause_s[cause] * 1e3:.2f} ms{_under(s, cause)}"
                              for s in where)
            outliers[cause] = (f"{cause} is in {present} of {len(steps)} steady steps{f' ({named})' if named else ''}: "
                               "not a per-step cause (an outlier, named once), so no per-step gain is taken from it")
    if not outliers:
        return p
    kept = {c: v for c, v in effect.idle.items() if c not in outliers}
    if effect.busy > 0 or any(v > 0 for v in kept.values()):  # the rest of the effect recurs: it keeps its gain
        p.rec.evidence["not_per_step"] = "; ".join(outliers.values())
        return Proposal(p.rec, {**p.effects, x.report.rank: msgspec.structs.replace(effect, idle=kept)})
    why = next(iter(outliers.values()))
    return Proposal(p.rec, {**p.effects, x.report.rank: msgspec.structs.replace(effect, reason=why)})


def _under(step: StepReport, cause: str) -> str:
    """`` under one cudaMemcpyAsync call of 463.0 ms, its transfer 4.5 µs`` where one call holds the idle."""
    call = step.main_calls.get(cause)
    return f" under {call.words()}" if call is not None else ""


UNSIZED_SHARE = 0.10
"""A cause this large a share of the step that no fix claims is named all the same (below it, a healthy job's
few percent of exposed communication or host work would be flagged with nothing to do about them)."""


def unsized_causes(x: RuleInput, proposals: list[Proposal]) -> list[Proposal]:
    """A cause of a tenth of the step or more that no fix claims is said as such, never left as no cause at all."""
    claimed = {p.rec.cause for p in proposals}
    out = []
    for cause in (Cause.DATA_LOADING, Cause.HOST_SYNC, Cause.LAUNCH_OVERHEAD, Cause.CPU_COMPUTE, Cause.MEMCPY,
                  Cause.COMMUNICATION):
        share = x.share(cause)
        if share < UNSIZED_SHARE or cause.value in claimed:
            continue
        out.append(x.rec(
            f"unsized_{cause.value}", cause,
            f"{cause.value} is {share:.1%} of the step, and no fix in this trace's terms can size it",
            {f"{cause.value}_ms_per_step": _ms(x.idle(cause)), "share_of_step": round(share, 3)},
            f"# look at what runs during the {cause.value} idle: gpuidle analyze TRACE --annotate annotated.json\n"
            "# then open annotated.json in https://ui.perfetto.dev",
            Effect(reason=f"not estimable from one trace: no rule's preconditions hold for this {cause.value} idle"),
            confidence="low",
        ))
    return out


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
    """A straggler named with evidence: its fix removes its excess over its peers' median, part by part."""
    out = []
    by_rank = {r.rank: r for r in reports}
    for s in job.stragglers:
        others = [r for r in reports if r.rank != s.rank and r.steps]
        if not others or s.rank not in by_rank:
            continue
        peer_states = [rank_state(r, include_all) for r in others]
        peers = float(median_of([p.own_s for p in peer_states]))
        mine = rank_state(by_rank[s.rank], include_all)
        extra = excess(mine, peer_states)
        smi = hardware(by_rank[s.rank].primary()).smi
        fix = STRAGGLER_FIX.get(s.cause, "# compare this rank's host (CPU load, storage, network) with a healthy one")
        fix = fix.replace("{smi}", SMI_PERFORMANCE.get(smi or "", "the device's clock and throttle counters"))
        pools = (s.cause,) if s.cause in mine.idle else ()
        rec = Recommendation(
            id=f"straggler_rank_{s.rank}", cause=Cause.STRAGGLER_WAIT.value,
            title=f"Rank {s.rank} is a straggler (score {s.score:.2f}): the other ranks wait for it",
            evidence={"rank": s.rank, "late_in_steps": s.steps, "mean_lateness_ms": _ms(s.lateness_s),
                      "score": round(s.score, 3), "score_interval": [s.score_low, s.score_high], "why": s.why,
                      "own_step_ms": _ms(mine.own_s), "peers_median_own_step_ms": _ms(peers),
                      "excess_ms": {"compute": _ms(extra.busy), **{c: _ms(v) for c, v in extra.idle.items()}}},
            fix=fix, gain=placeholder(), confidence="medium", rank=s.rank,
        )
        out.append(Proposal(rec, {s.rank: Effect(idle=extra.idle, busy=extra.busy, pools=pools)}))
    return out
