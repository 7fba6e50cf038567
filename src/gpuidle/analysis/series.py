"""The tracker's steps become the analysis report: idle causes per step, the job view, stragglers.

The in-process tracker sees no kernels. Per step and rank it measures the wall time, the
wait for the next batch, host (and, with CUDA, device) time per phase, and each DDP
bucket's communication. *Busy* is the compute phases' time less the exposed
communication inside them (DDP waits for the last buckets inside ``backward``). The rest
of the step is idle, split with the trace causes in this order, each capped by what is
left, so the causes add up to the idle time exactly:

1. ``straggler_wait``: exposed communication spent waiting for a slower rank;
2. ``communication``: the rest of the exposed communication;
3. ``data_loading``: the wait for the next batch;
4. ``host_sync``: the idle the loop's host syncs caused, where the tracker sees them (JAX);
5. ``memcpy``: host time of the copy phase (a blocking copy from pageable memory shows here);
6. ``unattributed``: everything else (launch overhead, host syncs, host work outside the
   phases), which step timing cannot tell apart; a profiled window can.

Waiting for a slower rank: the all-reduce of a step's last bucket ends at about the same
moment on every rank, since none can finish before the last one hands in its gradients. A
rank's exposed communication is therefore the all-reduce's own time plus its wait for the
last rank; the last rank's is the own time alone. So a rank's wait is its exposed
communication less the smallest among the ranks in that step (:func:`straggler_split`),
the same reasoning as for traces (``analysis.ranks``), and no clock alignment is needed.
The tracker exchanges every rank's per-step times every few steps to do this.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuidle.analysis.comm import size_bucket
from gpuidle.analysis.job_mesh import pipeline_pace
from gpuidle.analysis.mesh import tracker_mesh
from gpuidle.analysis.ranks import (
    MIN_STRAGGLER_STEPS,
    TOO_FEW_STEPS,
    is_straggler,
    job_communication,
    rank_table,
    score_interval,
    step_skew,
)
from gpuidle.analysis.steps import after_profiling, steady_state
from gpuidle.model import (
    CAUSES,
    I64,
    TRACKER_OTHER,
    Cause,
    CollectiveStat,
    CommReport,
    DeviceReport,
    JobReport,
    JobStep,
    KernelFacts,
    RankReport,
    StepReport,
    StepSeries,
    Straggler,
    Window,
    missing_ranks,
)
from gpuidle.model.arrays import distinct, median_of

STEP_SOURCE = "tracker"
WINDOW_KIND = "tracker_steps"
HOST_TIMED_NOTE = "device timing unavailable: phases timed on the host"
LISTED_LATE_STEPS = 20
"""A straggler lists at most this many of the steps it was last in, spread over the run."""
UNEVEN_DATA_SHARE = 0.05
"""A rank whose data-wait share is this far above the median is named in the job notes."""
_COL = {c: i for i, c in enumerate(CAUSES)}
FRAMEWORK_NOTES = {
    "jax": ["busy: the device's time from each step's start (its dispatch, or the previous step's end) to the "
            "completion of the outputs given to tracker.step(outputs); data wait and host syncs are the device's "
            "idle while the host was in the loader or blocked in a sync, not the host's time in them",
            "idle outside the loader and the syncs (Python between steps, dispatch) is unattributed; "
            "jax.profiler.trace records a profile that gpuidle analyze splits",
            "communication is not timed by step timing: a rank's wait for the others counts as busy, and a "
            "straggler is told by its own step time"],
    "keras": ["busy: the device's time from each step's start (its train call's first dispatch, or the previous "
              "step's end) to the completion of the logs the call returned; data wait and host syncs are the "
              "device's idle while fit was fetching the batch or blocked in a sync, not the host's time in them",
              "idle outside the fetch and the syncs (callbacks, Keras's loop, dispatch) is unattributed; "
              "jax.profiler.trace around model.fit records a profile that gpuidle analyze splits",
              "communication is not timed by step timing: a rank's wait for the others counts as busy, and a "
              "straggler is told by its own step time"],
    "tensorflow": ["busy: host time from the batch's arrival in the compiled train function (timed in the "
                   "tf.data pipeline wrapped by callback.dataset) to the batch's end callback",
                   "idle outside the input wait (callbacks, the host between steps) is unattributed; "
                   "tf.profiler.experimental records a profile that gpuidle analyze splits",
                   "communication is not timed by step timing: a rank's wait for the others counts as busy, "
                   "and a straggler is told by its own step time"],
}
"""What busy and idle mean for the JAX and Keras trackers (Keras on TensorFlow and on JAX), in place of the PyTorch
tracker's notes."""


def straggler_split(exposed: npt.ArrayLike) -> I64:
    """How long each rank waited for the last one in each step: ``[ranks, steps]`` of exposed communication in.

    The last rank to arrive has the least exposed communication, the all-reduce's own time;
    every other rank waited for it the difference.
    """
    e = np.asarray(exposed, dtype=np.int64)
    if e.size == 0:
        return e.copy()
    wait: I64 = (e - e.min(axis=0, keepdims=True)).astype(np.int64)
    return wait


@dataclass(frozen=True, slots=True)
class StepSplit:
    """Per step: busy, idle, and the idle by cause (``[steps, len(CAUSES)]``), in ns."""

    busy: I64
    idle: I64
    causes: I64


def split_steps(s: StepSeries) -> StepSplit:
    """Busy and idle by cause for every step, in the order of the module docstring."""
    dur = s.dur
    busy = np.clip(s.compute() - s.comm_exposed, 0, dur)
    left = dur - busy
    causes = np.zeros((len(s), len(CAUSES)), dtype=np.int64)
    wanted = (
        (Cause.STRAGGLER_WAIT, s.straggler),
        (Cause.COMMUNICATION, s.comm_exposed - s.straggler),
        (Cause.DATA_LOADING, s.data),
        (Cause.HOST_SYNC, s.sync if s.sync is not None else np.zeros(len(s), dtype=np.int64)),
        (Cause.MEMCPY, s.copy()),
    )
    for cause, want in wanted:
        take = np.clip(np.minimum(want, left), 0, None)
        causes[:, _COL[cause]] = take
        left = left - take
    causes[:, _COL[Cause.UNATTRIBUTED]] = left
    return StepSplit(busy=busy, idle=dur - busy, causes=causes)


def measured(s: StepSeries) -> StepSeries:
    """The steps to analyse: those without a profiler running, unless every step had one."""
    if s.profiled.any() and not s.profiled.all():
        return s.select(~s.profiled)
    return s


def _s(ns: float) -> float:
    return float(ns) / 1e9


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def rank_report(series: StepSeries) -> RankReport:
    """One rank's :class:`RankReport`, in the trace report's shape, from the tracker's steps."""
    s = measured(series)
    disturbed = after_profiling(series.profiled) & ~series.profiled.all()
    if len(s) < len(series):
        disturbed = disturbed[~series.profiled]
    split = split_steps(s)
    excluded = steady_state(s.dur, disturbed, busy=split.busy)
    n = len(s)
    window = int(s.dur.sum())
    busy = int(split.busy.sum())
    by_cause = split.causes.sum(axis=0)
    exposed = int(s.comm_exposed.sum())
    device = DeviceReport(
        device=s.device, name=s.device_name or ("host (no device timing)" if not s.device_timed else None),
        window_s=_s(window), busy_s=_s(busy), idle_s=_s(window - busy),
        utilization=busy / window if window else 0.0,
        idle_by_cause_s={c.value: _s(by_cause[i]) for i, c in enumerate(CAUSES)},
        active_s=_s(min(window, busy + exposed)),
        timing="device" if s.device_timed else "host",
    )
    communication = _comm(s)
    communication.mesh = tracker_mesh(s.process_groups, s.rank, s.world_size, communication.comm_s,
                                      _s(by_cause[_COL[Cause.COMMUNICATION]]), int(s.buckets.sum()))
    steps = [
        StepReport(step=int(s.step[i]), start_s=_s(s.start[i]), dur_s=_s(s.dur[i]), busy_s=_s(split.busy[i]),
                   idle_s=_s(split.idle[i]), idle_by_cause_s={c.value: _s(split.causes[i, j])
                                                              for j, c in enumerate(CAUSES)},
                   excluded=excluded[i], comm_by_dim_s=_dp_only(split.causes[i, _COL[Cause.COMMUNICATION]]))
        for i in range(n)
    ]
    return RankReport(
        rank=s.rank, path=s.path, notes=_notes(series, s), step_source=STEP_SOURCE,
        window=Window(kind=WINDOW_KIND, start_s=_s(s.start[0]) if n else 0.0, dur_s=_s(window)),
        devices=[device], steps=steps, communication=communication, world_size=s.world_size,
        kernels=no_kernel_facts(float(s.syncs.mean()) if s.syncs is not None and n else 0.0),
        unmeasured=list(s.unmeasured),
    )


def _dp_only(ns: float) -> dict[str, float]:
    """A tracker's step's communication idle by dimension: its hooks time data parallel's alone."""
    return {"dp": _s(ns)} if ns > 0 else {}


def no_kernel_facts(syncs_per_step: float = 0.0) -> KernelFacts:
    """Step timing sees no kernels: every kernel figure is zero or unknown (a note says so); the JAX
    tracker counts the loop's host syncs."""
    return KernelFacts(count=0, total_s=0.0, short_kernel_share=0.0, short_kernel_count=0,
                       reduced_precision_gemm_share=None, gemm_share=0.0, conv_share=0.0, top=[],
                       syncs_per_step=syncs_per_step, item_calls_per_step=0.0, pageable_htod_copies=0,
                       pageable_htod_bytes=0, median_launch_us=None)


def _comm(s: StepSeries) -> CommReport:
    comm, exposed, buckets = int(s.comm.sum()), int(s.comm_exposed.sum()), int(s.buckets.sum())
    nbytes = int(s.bucket_bytes.sum())
    collectives = []
    histogram: dict[str, int] = {}
    if buckets:
        label = size_bucket(nbytes // buckets)
        histogram[label] = buckets
        style = hook_parallelism(s.comm_hook)
        collectives.append(CollectiveStat(
            collective=(("all_reduce" if s.comm_hook in (None, "allreduce_hook") else s.comm_hook)
                        if style == "ddp" else "all_gather+reduce_scatter"),
            process_group=style, size_bucket=label, count=buckets, total_s=_s(comm), bytes=nbytes,
            algbw_gbps=None, busbw_gbps=None,
        ))
    return CommReport(comm_s=_s(comm), exposed_s=_s(exposed), overlap_ratio=1 - exposed / comm if comm else None,
                      collectives=collectives, per_step_count=buckets / len(s) if len(s) else 0.0,
                      size_histogram=histogram, parallelism=hook_parallelism(s.comm_hook),
                      settings=dict(s.comm_settings))


SHARDED_HOOKS = {"fully_shard": "fsdp2"}
"""The tracker's ``comm_hook`` for sharded jobs (``live/tracker/fsdp.py``; DeepSpeed's is the style itself)."""


def hook_parallelism(hook: str | None) -> str:
    """The data-parallel style a tracker log's ``comm_hook`` names: a DDP comm hook's name means DDP."""
    if hook is None:
        return "unknown"
    if hook.startswith("deepspeed"):
        return hook
    return SHARDED_HOOKS.get(hook, "ddp")


def _notes(full: StepSeries, s: StepSeries) -> list[str]:
    notes = list(full.notes)
    n, wall = len(s), int(s.dur.sum()) or 1
    notes.append(f"tracker: {n} steps, {int(s.samples.sum()):,} samples in {int(s.batches.sum()):,} batches; "
                 f"data wait {_pct(int(s.data.sum()) / wall)}, exposed communication "
                 f"{_pct(int(s.comm_exposed.sum()) / wall)} of the step time")
    phases = ", ".join(full.compute_phases) or "none"
    if full.framework in FRAMEWORK_NOTES:
        notes.extend(FRAMEWORK_NOTES[full.framework])
    elif s.device_timed:
        notes.append(f"busy: device time between events around the compute phases ({phases}) less exposed "
                     "communication; gaps between kernels inside a phase count as busy")
    else:
        if HOST_TIMED_NOTE not in notes:
            notes.append(HOST_TIMED_NOTE)
        notes.append(f"busy: host time of the compute phases ({phases}) less exposed communication, "
                     "assuming the work runs where the host waits for it (true on a CPU)")
    if full.framework not in FRAMEWORK_NOTES:
        notes.append("idle that step timing cannot split (launch overhead, host syncs, host work outside the phases) "
                     "is unattributed; tracker.profile(steps=...) records a trace that splits it")
    notes.append("kernel figures are not measured by the tracker: shown as zero")
    if len(s) < len(full):
        notes.append(f"{len(full) - len(s)} profiled step(s) left out: the profiler's cost inflates them")
    if full.world_size > 1 and full.comm_hook is None and not full.buckets.any() \
            and full.framework not in FRAMEWORK_NOTES:
        notes.append("communication not timed (no DDP, FSDP2 or DeepSpeed model given to the tracker): waiting for "
                     "other ranks "
                     "counts as compute here, and stragglers cannot be told")
    return notes


# ----------------------------------------------------------------------------------
# The job: ranks side by side
# ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankStats:
    """One rank's summary, for the job table and the periodic log line. Shares are of step time."""

    rank: int
    steps: int
    step_s: float
    """Median step time."""
    busy_share: float
    data_share: float
    comm_share: float
    """Exposed communication, waiting for other ranks included."""
    straggler_share: float
    own_step_s: float
    """Median of the step time less the wait for slower ranks."""
    score: float
    """``own_step_s`` / the fastest rank's (NVRx's straggler score): 1.0 is the fastest."""
    samples: int
    batches: int


def rank_stats(series: list[StepSeries]) -> list[RankStats]:
    rows = []
    for s in series:
        s = measured(s)
        wall = int(s.dur.sum())
        split = split_steps(s)
        own_s = float(median_of(s.dur - s.straggler)) / 1e9 if len(s) else 0.0
        rows.append((s, wall, split, own_s))
    fastest = min((own for *_, own in rows if own > 0), default=0.0)
    out = []
    for s, wall, split, own in rows:
        w = wall or 1
        out.append(RankStats(
            rank=s.rank, steps=len(s), step_s=float(median_of(s.dur)) / 1e9 if len(s) else 0.0,
            busy_share=int(split.busy.sum()) / w, data_share=int(s.data.sum()) / w,
            comm_share=int(s.comm_exposed.sum()) / w, straggler_share=int(s.straggler.sum()) / w,
            own_step_s=own, score=own / fastest if fastest > 0 else 1.0,
            samples=int(s.samples.sum()), batches=int(s.batches.sum()),
        ))
    return out


def _aligned(series: list[StepSeries]) -> tuple[I64, list[StepSeries]]:
    """The step numbers every rank measured, and each rank's series restricted to them, in step order."""
    common = series[0].step
    for s in series[1:]:
        common = np.intersect1d(common, s.step)
    # series hold their steps in order (the tracker writes them so, the reader sorts them)
    return np.asarray(common, dtype=np.int64), [s.select(np.isin(s.step, common)) for s in series]


def _parts(s: StepSeries) -> dict[str, tuple[str, I64]]:
    """Where a rank's step time goes, per step: label -> (cause, ns)."""
    parts: dict[str, tuple[str, I64]] = {"data wait": (Cause.DATA_LOADING.value, s.data)}
    if s.copy_phase in s.phases:
        parts[f"{s.copy_phase} copy (host)"] = (Cause.MEMCPY.value, s.copy())
    if hook_parallelism(s.comm_hook) not in ("ddp", "unknown"):
        # sharded: the waits for parameter all-gathers fall in forward and backward alike
        own = s.compute() - s.comm_exposed
        where = "on the device" if s.device_timed else "host-timed"
        parts[f"{', '.join(s.compute_phases)} ({where}) less the waits for communication"] = \
            ("compute", np.clip(own, 0, None))
        return _rest(s, parts)
    waits_in = "backward" if "backward" in s.compute_phases else None  # where DDP waits for the all-reduce
    for p in s.compute_phases:
        if s.device_timed and p in s.device_phases:
            label, ns = f"{p} on the device", s.device_phases[p]
        elif p in s.phases:
            label, ns = f"{p} (host-timed)", s.phases[p]
        else:
            continue
        if p == waits_in:
            label, ns = f"{label} before its last bucket", np.clip(ns - s.comm_exposed, 0, None)
        parts[label] = ("compute", ns)
    return _rest(s, parts)


def _rest(s: StepSeries, parts: dict[str, tuple[str, I64]]) -> dict[str, tuple[str, I64]]:
    named = sum((v for k, v in s.phases.items() if k != TRACKER_OTHER), np.zeros(len(s), dtype=np.int64))
    rest = np.clip(s.dur - s.data - named, 0, None)  # the "other" phases and the loop between phases
    parts["host work outside the named phases"] = (Cause.CPU_COMPUTE.value, rest)
    return parts


def why_late(late: StepSeries, others: list[StepSeries]) -> tuple[str, str]:
    """The part of the step where the late rank spends the most more than the others (medians per step)."""
    mine = {k: (cause, float(median_of(v)) if v.size else 0.0) for k, (cause, v) in _parts(late).items()}
    theirs = [_parts(o) for o in others]
    best, cause, excess, ref = "", "unknown", 0.0, 0.0
    for label, (c, value) in mine.items():
        medians = [float(median_of(t[label][1])) for t in theirs if label in t and t[label][1].size]
        median = float(median_of(medians)) if medians else 0.0
        if value - median > excess:
            best, cause, excess, ref = label, c, value - median, median
    if excess <= 0:
        return "unknown", f"rank {late.rank} spends no part of its step longer than the other ranks"
    return cause, (f"rank {late.rank}: {best} {mine[best][1] / 1e6:.2f} ms/step "
                   f"vs {ref / 1e6:.2f} ms/step median of the other ranks")


def job_report(series: list[StepSeries], reports: list[RankReport], duplicates: list[int] | None = None) -> JobReport:
    """The job view of several ranks' tracker logs: stragglers, skew, per-step waits, sharding."""
    world = max(s.world_size for s in series)
    found = sorted(s.rank for s in series)
    notes: list[str] = []
    if len({s.world_size for s in series}) > 1:
        notes.append(f"ranks disagree on the world size: {sorted({s.world_size for s in series})}")
    missing = missing_ranks(world, found)
    if missing:
        notes.append(f"{len(found)} of {world} ranks present: waits were measured against all of them")
    if any(not s.device_timed for s in series):
        notes.append(HOST_TIMED_NOTE)
    stats = {r.rank: r for r in rank_stats(series)}
    kept = [measured(s) for s in series]
    common, aligned = _aligned(kept)
    job_steps: list[JobStep] = []
    stragglers: list[Straggler] = []
    if common.size and len(aligned) > 1:
        ranks = np.array([s.rank for s in aligned])
        dur = np.stack([s.dur for s in aligned])
        wait = np.stack([s.straggler for s in aligned])
        by_step_time = all(s.framework in FRAMEWORK_NOTES for s in aligned)
        if by_step_time:  # no communication timed: the last rank is the slowest, late by its step over the fastest's
            last = np.argmax(dur, axis=0)
            lateness = dur.max(axis=0) - dur.min(axis=0)
        else:
            last = np.argmin(np.stack([s.comm_exposed for s in aligned]), axis=0)
            lateness = wait.max(axis=0)
        median = np.median(dur, axis=0)
        for j, step in enumerate(common):
            late = lateness[j] > 0
            job_steps.append(JobStep(step=int(step), skew=float(dur[:, j].max() / median[j]) if median[j] > 0 else None,
                                     last_rank=int(ranks[last[j]]) if late else None,
                                     lateness_s=_s(lateness[j]) if late else 0.0))
        own = dur - wait
        for i, s in enumerate(aligned):
            st = stats[s.rank]
            hit = np.flatnonzero((last == i) & (lateness > 0))
            best_other = np.min(np.delete(own, i, axis=0), axis=0)
            ratios = own[i][best_other > 0] / best_other[best_other > 0]
            low, high = score_interval(ratios, geometric=by_step_time)
            if not is_straggler(st.score, low, common.size) or hit.size < max(1, common.size // 2):
                continue  # a straggler is slower by itself, beyond noise, and the last one in most steps
            shown = hit[distinct(np.linspace(0, hit.size - 1, min(hit.size, LISTED_LATE_STEPS)).round().astype(int))]
            cause, why = why_late(s, [o for o in aligned if o.rank != s.rank])
            stragglers.append(Straggler(
                rank=s.rank, steps=[int(x) for x in common[shown]], lateness_s=_s(float(lateness[shown].mean())),
                score=st.score, cause=cause, score_low=low, score_high=high,
                why=f"{why}; last in {hit.size} of {common.size} steps, "
                    + (f"{float(lateness[hit].mean()) / 1e6:.2f} ms slower than the fastest rank on average"
                       if by_step_time else f"the others waited {float(lateness[hit].mean()) / 1e6:.2f} ms on average"),
            ))
    if len(aligned) > 1 and common.size < MIN_STRAGGLER_STEPS:
        notes.append(f"{TOO_FEW_STEPS}: {common.size} step(s) shared by all ranks, at least {MIN_STRAGGLER_STEPS} "
                     "needed")
    notes.extend(_sharding_notes(list(stats.values())))
    pace, stage_ranks = pipeline_pace(reports)
    notes += pace
    stragglers = [x for x in stragglers if x.rank not in stage_ranks]
    return JobReport(
        world_size=world, ranks_found=found, missing_ranks=missing, duplicate_ranks=list(duplicates or []),
        step_skew=step_skew(reports), rank_table=rank_table(reports),
        stragglers=sorted(stragglers, key=lambda x: -x.lateness_s),
        communication=job_communication(reports), notes=notes, steps=job_steps,
    )


def _sharding_notes(stats: list[RankStats]) -> list[str]:
    """Uneven sharding (samples or batches differ across ranks) and a rank that waits for data more."""
    out = []
    for what in ("samples", "batches"):
        counts = {s.rank: getattr(s, what) for s in stats}
        lo, hi = min(counts, key=lambda r: counts[r]), max(counts, key=lambda r: counts[r])
        if counts[lo] != counts[hi]:
            out.append(f"uneven sharding: {what} per rank from {counts[lo]:,} (rank {lo}) to {counts[hi]:,} "
                       f"(rank {hi})")
    if len(stats) > 1:
        median = float(median_of([s.data_share for s in stats]))
        worst = max(stats, key=lambda s: s.data_share)
        if worst.data_share - median >= UNEVEN_DATA_SHARE:
            out.append(f"rank {worst.rank} waits for data {_pct(worst.data_share)} of its step time, "
                       f"the median rank {_pct(median)}")
    return out


def _merge_collectives(reports: list[RankReport]) -> list[CollectiveStat]:
    merged: dict[tuple[str, str, str], CollectiveStat] = {}
    for r in reports:
        for c in r.communication.collectives:
            key = (c.collective, c.process_group, c.size_bucket)
            m = merged.get(key)
            if m is None:
                merged[key] = CollectiveStat(collective=c.collective, process_group=c.process_group,
                                             size_bucket=c.size_bucket, count=c.count, total_s=c.total_s,
                                             bytes=c.bytes, algbw_gbps=None, busbw_gbps=None)
            else:
                m.count += c.count
                m.total_s += c.total_s
                m.bytes += c.bytes
    return sorted(merged.values(), key=lambda c: -c.total_s)
