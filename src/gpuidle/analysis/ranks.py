"""The job view: ranks side by side, stragglers, and waiting that is not communication.

The same collective is matched across ranks by (step number, process group, order
within the step). Its kernel ends at about the same moment on every rank, since no
rank can finish before the last one arrives; so a rank's *wait* for the last arrival
is its kernel duration minus the shortest duration among the ranks, and the rank with
the shortest kernel arrived last. This needs no clock alignment between hosts.

The wait sits at the start of the kernel: ``[start, start + wait)``. The part of it
that was exposed idle moves from ``communication`` to ``straggler_wait``.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.job_mesh import expert_skew, job_mesh, mesh_gaps, pipeline_pace
from gpuidle.analysis.steps import counted
from gpuidle.analysis.summary import RankAnalysis
from gpuidle.model import (
    Cause,
    CollectiveStat,
    CommRole,
    JobCommunication,
    JobReport,
    JobStep,
    RankReport,
    RankRow,
    Straggler,
    missing_ranks,
)
from gpuidle.model.arrays import median_of

PERSISTENT_SCORE = 1.05
"""A rank whose median own step time is 5 % above the fastest rank's is a persistent straggler."""
MIN_STRAGGLER_STEPS = 5
"""Fewer steps shared by all ranks than this cannot tell a straggler from run-to-run noise."""
TOO_FEW_STEPS = "too few steps to name a straggler"
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)


def score_interval(ratios: np.ndarray, geometric: bool = False) -> tuple[float, float]:
    """95 % t-interval of the mean of per-step scores (own step time / the fastest other rank's).

    ``geometric``: of their geometric mean (the t-interval of the log-ratios), for step times whose
    boundaries are coarse, where one near-zero step of the fastest rank would blow up the arithmetic mean; a step
    whose own time is zero there (its whole step a wait), or whose fastest peer's is, has no finite logarithm
    and is left out of it.
    """
    if geometric:
        positive = ratios[(ratios > 0) & np.isfinite(ratios)]
        if positive.size == 0:
            return 1.0, 1.0
        low, high = score_interval(np.log(positive))
        return float(np.exp(low)), float(np.exp(high))
    n = ratios.size
    if n < 2:
        return (float(ratios.mean()), float(ratios.mean())) if n else (1.0, 1.0)
    t = _T975[n - 2] if n - 2 < len(_T975) else 1.96 + 2.4 / (n - 1)
    half = t * float(ratios.std(ddof=1)) / float(np.sqrt(n))
    return float(ratios.mean()) - half, float(ratios.mean()) + half


def is_straggler(score: float, low: float, steps: int) -> bool:
    """Slower by itself (score), beyond noise (the interval's low end above 1), over enough steps."""
    return steps >= MIN_STRAGGLER_STEPS and score >= PERSISTENT_SCORE and low > 1.0
HOST_CAUSES = (Cause.DATA_LOADING, Cause.CPU_COMPUTE, Cause.HOST_SYNC, Cause.LAUNCH_OVERHEAD, Cause.MEMCPY)


class Arrival(msgspec.Struct, frozen=True):
    """Per matched collective: every rank's wait (ns) and who came last."""

    key: tuple[int, str, int]
    step: int
    waits: dict[int, int]
    last: int


def _keyed(ra: RankAnalysis) -> list[tuple[int, tuple[int, str, int]]]:
    """The rank's collectives on its training device, each with its cross-rank key
    (step number, process group, order within the step and group). Send/recv is left out: it pairs two ranks,
    not a group, and a pipeline stage's wait on its neighbour is its bubble, not a late rank's. In a pipeline
    a collective is matched only with the ranks of its own stage: the schedule brings the stages to a
    collective they share (the embedding group's all-reduce, the world's after the flush) in its own order,
    the first stage last, and that order is no rank's lateness."""
    c = ra.collectives
    stage = _stage(ra)
    seen: dict[tuple[int, str], int] = defaultdict(int)
    out = []
    for i in np.flatnonzero(c.device == ra.primary_device):
        if c.collective[i] == "send_recv":
            continue
        step = int(ra.step_numbers[c.step[i]]) if ra.step_numbers.size else 0
        group = (c.process_group[i] or "default") + stage
        out.append((int(i), (step, group, seen[(step, group)])))
        seen[(step, group)] += 1
    return out


def _stage(ra: RankAnalysis) -> str:
    """The rank's pipeline stage as a suffix of its collectives' keys: empty outside a pipeline; the rank itself
    where its stage is not told (it is then matched with no other rank)."""
    pp = next((m for m in ra.report.communication.mesh if m.dim == "pp"), None)
    if pp is None:
        return ""
    return f"@pp{pp.coordinate}" if pp.coordinate is not None else f"@rank{ra.report.rank}"


def enough_steps(ranks: list[RankAnalysis], include_all: bool = False) -> bool:
    """The ranks share enough steady steps to tell a late rank from one step's arrival skew: with fewer, a
    collective's wait is when each rank happened to start its step, and it stays communication."""
    own = {ra.report.rank: own_step_times(ra.report, include_all) for ra in ranks}
    return len(_shared(own)[0]) >= MIN_STRAGGLER_STEPS


def match_collectives(ranks: list[RankAnalysis]) -> list[Arrival]:
    table: dict[tuple[int, str, int], dict[int, tuple[str, int]]] = defaultdict(dict)
    for ra in ranks:
        c = ra.collectives
        for i, key in _keyed(ra):
            table[key][ra.report.rank] = (c.collective[i], int(c.end[i] - c.start[i]))
    out: list[Arrival] = []
    for key, per_rank in sorted(table.items()):
        if len(per_rank) < 2 or len({k for k, _ in per_rank.values()}) != 1:
            continue
        shortest = min(d for _, d in per_rank.values())
        waits = {r: d - shortest for r, (_, d) in per_rank.items()}
        last = min(per_rank, key=lambda r: (per_rank[r][1], r))
        out.append(Arrival(key, key[0], waits, last))
    return out


def waiting_intervals(ra: RankAnalysis, arrivals: list[Arrival]) -> iv.Intervals:
    """When this rank's collectives were waiting for the last rank: ``[start, start + wait)`` each."""
    rank = ra.report.rank
    wait_of = {a.key: a.waits[rank] for a in arrivals if rank in a.waits}
    starts, ends = [], []
    for i, key in _keyed(ra):
        w = wait_of.get(key, 0)
        if w > 0:
            starts.append(int(ra.collectives.start[i]))
            ends.append(int(ra.collectives.start[i]) + w)
    return iv.union(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64))


def apply_straggler_wait(ra: RankAnalysis, arrivals: list[Arrival]) -> int:
    """Move this rank's exposed waiting from ``communication`` to ``straggler_wait`` in its report.

    :return: the ns moved.
    """
    waiting = waiting_intervals(ra, arrivals)
    seg_s, seg_e, seg_step = ra.exposed_comm
    if waiting[0].size == 0 or seg_s.size == 0:
        return 0
    cut_s, cut_e, label = iv.label_segments((seg_s, seg_e), [waiting], extra_points=None)
    hit = label == 0
    step_of = seg_step[np.searchsorted(seg_s, cut_s[hit], side="right") - 1]
    moved = np.bincount(step_of, weights=(cut_e - cut_s)[hit], minlength=len(ra.report.steps))
    report = ra.report
    device = next(d for d in report.devices if d.device == ra.primary_device)
    total = int(moved.sum())
    _move(device.idle_by_cause_s, total / 1e9)
    for step_report, ns in zip(report.steps, moved, strict=True):
        before = step_report.idle_by_cause_s[Cause.COMMUNICATION.value]
        _move(step_report.idle_by_cause_s, float(ns) / 1e9)
        kept = step_report.idle_by_cause_s[Cause.COMMUNICATION.value] / before if before > 0 else 0.0
        # the wait is the first part of each collective, whichever it is: each kind keeps the same share
        step_report.exposed_comm_s = {k: v * kept for k, v in step_report.exposed_comm_s.items()}
    _move_by_dimension(ra, waiting)
    return total


def _move_by_dimension(ra: RankAnalysis, waiting: iv.Intervals) -> None:
    """The waiting taken out of each dimension's idle where it lies: the collective that waited is known."""
    s, e, step, dim = ra.comm_dims
    if s.size == 0:
        return
    cut_s, cut_e, label = iv.label_segments((s, e), [waiting], extra_points=None)
    hit = label == 0
    src = np.searchsorted(s, cut_s[hit], side="right") - 1
    names, code = np.unique(dim.astype(str), return_inverse=True)
    steps = ra.report.steps
    key = step[src] * names.size + code[src]
    moved = np.bincount(key, weights=(cut_e - cut_s)[hit], minlength=len(steps) * names.size)
    for flat in np.flatnonzero(moved).tolist():
        i, d = flat // names.size, str(names[flat % names.size])
        left = steps[i].comm_by_dim_s.get(d, 0.0) - float(moved[flat]) / 1e9
        if left > 1e-12:
            steps[i].comm_by_dim_s[d] = left
        else:
            steps[i].comm_by_dim_s.pop(d, None)
    for m in ra.report.communication.mesh:
        m.exposed_s = sum(s.comm_by_dim_s.get(m.dim, 0.0) for s in steps)


def _move(causes: dict[str, float], seconds: float) -> None:
    seconds = min(seconds, causes[Cause.COMMUNICATION.value])
    causes[Cause.COMMUNICATION.value] -= seconds
    causes[Cause.STRAGGLER_WAIT.value] += seconds


def job_report(ranks: list[RankAnalysis], duplicates: list[int], include_all: bool = False) -> JobReport:
    """Compare ranks; changes each rank's report in place (straggler wait).

    Per-step figures (step time, skew, straggler scores) use the steady steps unless ``include_all``.
    """
    reports = [ra.report for ra in ranks]
    world = max((r.world_size or 0 for r in reports), default=0) or None
    found = sorted(r.rank for r in reports)
    notes: list[str] = []
    sizes = {r.world_size for r in reports if r.world_size}
    if len(sizes) > 1:
        notes.append(f"ranks disagree on the world size: {sorted(sizes)}; are these traces from one job?")
    missing = missing_ranks(world, found)
    if missing:
        notes.append(f"{len(found)} of {world} ranks present: waits are relative to the ranks present")
        notes += mesh_gaps([r.communication.mesh for r in reports], set(found))
    enough = enough_steps(ranks, include_all)  # else one step's waits are arrival skew: no rank is named for them
    # before the waits for a late rank are moved out of communication
    skew = expert_skew(reports, include_all) if enough else []
    arrivals = match_collectives(ranks)
    if enough:
        for ra in ranks:
            apply_straggler_wait(ra, arrivals)

    own = {r.rank: own_step_times(r, include_all) for r in reports}
    last_by_step: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for a in arrivals:
        last_by_step[a.step][a.last] += max(a.waits.values())
    stragglers = _stragglers(reports, last_by_step, own)
    pace, stage_ranks = pipeline_pace(reports, include_all)
    notes += pace + skew
    stragglers = [x for x in stragglers if x.rank not in stage_ranks]
    if len(_shared(own)[0]) < MIN_STRAGGLER_STEPS:
        notes.append(f"{TOO_FEW_STEPS}: {len(_shared(own)[0])} steady step(s) shared by all ranks, "
                     f"at least {MIN_STRAGGLER_STEPS} needed; the waits at the collectives are the ranks' "
                     "arrival skew and stay communication")

    return JobReport(
        world_size=world, ranks_found=found, missing_ranks=missing, duplicate_ranks=duplicates,
        step_skew=step_skew(reports, include_all), rank_table=rank_table(reports, include_all),
        stragglers=stragglers,
        communication=job_communication(reports), notes=notes, steps=_job_steps(reports, last_by_step),
    )


def step_skew(reports: list[RankReport], include_all: bool = False) -> float | None:
    """Max / median over ranks of the mean step time (steady steps)."""
    means = [float(np.mean([s.dur_s for s in counted(r.steps, include_all)])) for r in reports if r.steps]
    median = float(median_of(means)) if means else 0.0
    return max(means) / median if median > 0 else None


def rank_table(reports: list[RankReport], include_all: bool = False) -> list[RankRow]:
    """One row per rank: mean (steady) step time, and less its wait for the others, utilization, largest idle
    cause."""
    rows = []
    for r in sorted(reports, key=lambda r: r.rank):
        d = r.primary()
        top = max(d.idle_by_cause_s.items(), key=lambda kv: kv[1])[0] if d.idle_s > 0 else "none"
        steps = counted(r.steps, include_all)
        step = float(np.mean([s.dur_s for s in steps])) if steps else 0.0
        wait = float(np.mean([s.idle_by_cause_s.get(Cause.STRAGGLER_WAIT.value, 0.0) for s in steps])) if steps else 0.0
        rows.append(RankRow(rank=r.rank, step_s=step, utilization=d.utilization, top_cause=top,
                            own_step_s=step - wait))
    return rows


def job_communication(reports: list[RankReport]) -> JobCommunication:
    """Exposed communication and straggler wait summed over ranks; overlap weighted by collective time."""
    comm_s = sum(r.communication.comm_s for r in reports)
    overlap = sum((r.communication.overlap_ratio or 0.0) * r.communication.comm_s for r in reports)
    return JobCommunication(
        exposed_s=sum(r.primary().idle_by_cause_s[Cause.COMMUNICATION.value] for r in reports),
        straggler_wait_s=sum(r.primary().idle_by_cause_s[Cause.STRAGGLER_WAIT.value] for r in reports),
        overlap_ratio=overlap / comm_s if comm_s else None,
        collectives=_merge_collectives(reports),
        parallelism=job_parallelism(reports),
        roles=_merge_roles(reports),
        collective_exposed_s=sum(r.communication.exposed_s for r in reports),
        mesh=job_mesh([r.communication.mesh for r in reports]),
    )


def job_parallelism(reports: list[RankReport]) -> str:
    """The style most ranks show (a rank with no collective in its window shows none)."""
    styles = [r.communication.parallelism for r in reports if r.communication.parallelism != "unknown"]
    return max(sorted(set(styles)), key=styles.count) if styles else "unknown"


def _merge_roles(reports: list[RankReport]) -> list[CommRole]:
    out: dict[str, CommRole] = {}
    for r in reports:
        for c in r.communication.roles:
            m = out.setdefault(c.role, CommRole(role=c.role, count=0, comm_s=0.0, exposed_s=0.0, bytes=0))
            m.count += c.count
            m.comm_s += c.comm_s
            m.exposed_s += c.exposed_s
            m.bytes += c.bytes
    return sorted(out.values(), key=lambda c: (-c.exposed_s, c.role))


def _job_steps(reports: list[RankReport], last_by_step: dict[int, dict[int, int]]) -> list[JobStep]:
    durations: dict[int, list[float]] = defaultdict(list)
    for r in reports:
        for s in r.steps:
            durations[s.step].append(s.dur_s)
    out = []
    for step, durs in sorted(durations.items()):
        median = float(median_of(durs))
        late = {r: ns for r, ns in last_by_step.get(step, {}).items() if ns > 0}
        last = max(late.items(), key=lambda kv: (kv[1], -kv[0]))[0] if late else None
        out.append(JobStep(step=step, skew=max(durs) / median if median > 0 and len(durs) > 1 else None,
                           last_rank=last, lateness_s=late[last] / 1e9 if last is not None else 0.0))
    return out


def own_step_times(r: RankReport, include_all: bool = False) -> dict[int, float]:
    """Step number -> step time minus the time spent waiting for other ranks (steady steps)."""
    return {s.step: s.dur_s - s.idle_by_cause_s[Cause.STRAGGLER_WAIT.value] for s in counted(r.steps, include_all)}


def _shared(own: dict[int, dict[int, float]]) -> tuple[list[int], dict[int, np.ndarray]]:
    """The steps every rank has, and each rank's own times over them."""
    common = sorted(set.intersection(*(set(t) for t in own.values()))) if own else []
    return common, {r: np.array([t[k] for k in common]) for r, t in own.items()}


def _scores(own: dict[int, dict[int, float]]) -> dict[int, tuple[float, float, float]]:
    """Per rank: median own step / fastest rank's median, and the 95 % interval of the per-step ratio
    to the fastest other rank in that step."""
    _, times = _shared(own)
    medians = {r: float(median_of(t)) for r, t in times.items() if t.size}
    fastest = min(medians.values()) if medians else 0.0
    out = {}
    for r, t in times.items():
        others = [times[q] for q in times if q != r]
        if not t.size or not others or fastest <= 0:
            out[r] = (1.0, 1.0, 1.0)
            continue
        best_other = np.min(np.stack(others), axis=0)
        ratios = t / np.where(best_other > 0, best_other, np.nan)
        ratios = ratios[np.isfinite(ratios)]
        low, high = score_interval(ratios)
        out[r] = (medians[r] / fastest, low, high)
    return out


def _stragglers(
    reports: list[RankReport], last_by_step: dict[int, dict[int, int]], own: dict[int, dict[int, float]],
) -> list[Straggler]:
    late_steps: dict[int, list[int]] = defaultdict(list)
    lateness: dict[int, list[int]] = defaultdict(list)
    for step, per_rank in sorted(last_by_step.items()):
        rank, ns = max(per_rank.items(), key=lambda kv: (kv[1], -kv[0]))
        if ns > 0:
            late_steps[rank].append(step)
            lateness[rank].append(ns)
    by_rank = {r.rank: r for r in reports}
    scores = _scores(own)
    n_shared = len(_shared(own)[0])
    out = []
    for rank, steps in late_steps.items():
        score, low, high = scores.get(rank, (1.0, 1.0, 1.0))
        if len(steps) < max(1, len(last_by_step) // 2) or not is_straggler(score, low, n_shared):
            continue
        cause, why = _why_late(by_rank[rank], [r for r in reports if r.rank != rank])
        out.append(Straggler(rank=rank, steps=steps, lateness_s=float(np.mean(lateness[rank])) / 1e9,
                             score=score, cause=cause, why=why, score_low=low, score_high=high))
    return sorted(out, key=lambda s: -s.lateness_s)


def _why_late(late: RankReport, others: list[RankReport]) -> tuple[str, str]:
    """The cause (or compute) where the late rank spends the most more than the others' median."""
    def per_step(r: RankReport) -> dict[str, float]:
        n = max(len(r.steps), 1)
        d = r.primary()
        out = {c.value: d.idle_by_cause_s[c.value] / n for c in HOST_CAUSES}
        out["compute"] = d.busy_s / n
        return out

    mine = per_step(late)
    theirs = [per_step(r) for r in others]
    best, excess, ref = "unattributed", 0.0, 0.0
    for key, value in mine.items():
        median = float(median_of([t[key] for t in theirs])) if theirs else 0.0
        if value - median > excess:
            best, excess, ref = key, value - median, median
    if excess <= 0:
        return "unknown", f"rank {late.rank} shows no host cause or compute above the other ranks"
    label = "longer compute kernels" if best == "compute" else best
    return best, (f"rank {late.rank}: {label} {mine[best] * 1e3:.2f} ms/step "
                  f"vs {ref * 1e3:.2f} ms/step median of the other ranks")


def _merge_collectives(reports: list[RankReport]) -> list[CollectiveStat]:
    """Sum counts, time and bytes of the same collective, group and size bucket over ranks."""
    merged: dict[tuple[str, str, str], list[float]] = {}
    for r in reports:
        for c in r.communication.collectives:
            m = merged.setdefault((c.collective, c.process_group, c.size_bucket), [0, 0.0, 0, 0.0, 0.0])
            m[0] += c.count
            m[1] += c.total_s
            m[2] += c.bytes
            if c.algbw_gbps:
                m[3] += c.bytes / c.algbw_gbps  # ns spent on the sized collectives
                if c.busbw_gbps:
                    m[4] = c.busbw_gbps / c.algbw_gbps
    out = []
    for (k, g, b), (count, total, nbytes, timed, factor) in sorted(merged.items(), key=lambda kv: -kv[1][1]):
        algbw = nbytes / timed if timed else None
        out.append(CollectiveStat(collective=k, process_group=g, size_bucket=b, count=int(count), total_s=total,
                                  bytes=int(nbytes), algbw_gbps=algbw,
                                  busbw_gbps=algbw * factor if (algbw and factor) else None))
    return out
