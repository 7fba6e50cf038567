"""The figures of a run every command shows, each computed here once: step time, idle per step, GPUs, utilization.

``analyze`` (terminal, JSON, Markdown, HTML), ``history``, ``compare``, ``cost --from`` and the fleet table read
a run through these functions, so one run shows one step time and one GPU count whichever command prints it.

- **Step time**: per rank, the mean over its steady steps (the steps not marked ``excluded``; all of them with
  ``--include-warmup``, or where none is steady), as the fixes' gains start from; the job's is its slowest rank's.
  A rank without steps counts its window as one step.
- **Idle per step**, by cause: per rank, the mean over the same steady steps; the job's is the mean over its ranks.
  Its total is the steps' own idle (as each step adds its causes up in nanoseconds), not the causes' means summed.
- **GPUs**: the devices with work (busy time) in the analysed window, over the traced ranks; a rank whose
  devices show none counts its training device.
- **Utilization**: :meth:`AnalysisReport.utilization` (busy / window of each rank's training device, the mean
  over the ranks); not measured (None) where a rank's busy time holds a wait it could not tell apart: a Keras fit
  not given ``callback.dataset()`` counts its data wait as busy (``RankReport.unmeasured``).
"""

from __future__ import annotations

from gpuidle.analysis.steps import counted
from gpuidle.model import CAUSES, AnalysisReport, DeviceReport, RankReport, StepReport


def steady_steps(rank: RankReport, include_all: bool = False) -> list[StepReport]:
    """The steps the rank's per-step figures are the mean of."""
    return counted(rank.steps, include_all)


def rank_step_s(rank: RankReport, include_all: bool = False) -> float:
    """The rank's mean steady step, in seconds; its window where it has no steps."""
    steps = steady_steps(rank, include_all)
    return sum(s.dur_s for s in steps) / len(steps) if steps else rank.primary().window_s


def rank_idle_by_cause_s(rank: RankReport, include_all: bool = False) -> dict[str, float]:
    """The rank's idle per steady step by cause, in seconds; its window's where it has no steps."""
    steps = steady_steps(rank, include_all)
    if not steps:
        device = rank.primary()
        return {c.value: device.idle_by_cause_s.get(c.value, 0.0) for c in CAUSES}
    return {c.value: sum(s.idle_by_cause_s.get(c.value, 0.0) for s in steps) / len(steps) for c in CAUSES}


def step_s(report: AnalysisReport) -> float:
    """The job's steady step: the slowest traced rank's mean steady step (0 without ranks)."""
    return max((rank_step_s(r, report.include_warmup) for r in report.ranks), default=0.0)


def idle_by_cause_s(report: AnalysisReport) -> dict[str, float]:
    """Idle per steady step by cause, the mean over the traced ranks."""
    per_rank = [rank_idle_by_cause_s(r, report.include_warmup) for r in report.ranks]
    n = max(len(per_rank), 1)
    return {c.value: sum(p[c.value] for p in per_rank) / n for c in CAUSES}


def rank_idle_s(rank: RankReport, include_all: bool = False) -> float:
    """The rank's idle per steady step, every cause: the mean of its steady steps' idle (each step's, the sum of
    its causes in nanoseconds), so that one step shows the idle its device line shows; its window's without steps."""
    steps = steady_steps(rank, include_all)
    return sum(s.idle_s for s in steps) / len(steps) if steps else rank.primary().idle_s


def idle_s(report: AnalysisReport) -> float:
    """Idle per steady step, every cause, the mean over the traced ranks (:func:`idle_by_cause_s` summed, but
    without the float sum's last-digit drift: 26.605 ms read as 26.604999…)."""
    return sum(rank_idle_s(r, report.include_warmup) for r in report.ranks) / max(len(report.ranks), 1)


def steps(report: AnalysisReport) -> int:
    """Steady steps the figures are the mean of, summed over the ranks (a rank without steps counts one)."""
    return sum(max(len(steady_steps(r, report.include_warmup)), 1) for r in report.ranks)


def excluded_steps(report: AnalysisReport) -> list[str]:
    """The steps left out of the per-step figures, by reason: ``warmup: step 0``, ``no_gpu_work: rank 1 step 9``."""
    if report.include_warmup:
        return []
    by_reason: dict[str, list[str]] = {}
    for r in report.ranks:
        if not any(s.excluded is None for s in r.steps):
            continue  # nothing steady: every step counts
        prefix = f"rank {r.rank} " if len(report.ranks) > 1 else ""
        for s in r.steps:
            if s.excluded is not None:
                by_reason.setdefault(s.excluded, []).append(f"{prefix}step {s.step}")
    return [f"{reason}: {', '.join(names)}" for reason, names in by_reason.items()]


def rank_gpus(rank: RankReport) -> int:
    """Devices of one rank with work in its analysed window (at least one: its training device)."""
    return max(sum(1 for d in rank.devices if d.busy_s > 0), 1)


def gpus(report: AnalysisReport) -> int:
    """GPUs with work in the analysed window, over the traced ranks."""
    return sum(rank_gpus(r) for r in report.ranks)


def world_size(report: AnalysisReport) -> int:
    """The job's ranks as the traces record them, else the ranks traced: a trace folder may hold a part of a job."""
    if report.job is not None and report.job.world_size:
        return report.job.world_size
    return max((r.world_size or 0 for r in report.ranks), default=0) or len(report.ranks)


UNMEASURED_BUSY = ("data_loading",)
"""What a run may leave unmeasured inside its busy time (:attr:`RankReport.unmeasured`): its utilization is then
not known."""


def unmeasured(report: AnalysisReport) -> list[str]:
    """What the run's busy time holds unmeasured, each named once: its utilization is not known where any."""
    return list(dict.fromkeys(u for r in report.ranks for u in r.unmeasured if u in UNMEASURED_BUSY))


def steady_utilization(report: AnalysisReport) -> float:
    """Busy over the steady step, the utilization the fixes' gains start from (``advice.whatif``): the mean over
    the ranks of their busy time per steady step, over the job's own step (the slowest rank's steady step less its
    wait for the others). It differs from :func:`utilization` (busy over the whole window) by the steps left out."""
    busy, own = [], []
    for r in report.ranks:
        steps = steady_steps(r, report.include_warmup)
        if not steps:
            continue
        n = len(steps)
        busy.append(sum(s.busy_s for s in steps) / n)
        own.append(sum(s.dur_s - s.idle_by_cause_s.get("straggler_wait", 0.0) for s in steps) / n)
    job = max(own, default=0.0)
    return sum(busy) / len(busy) / job if busy and job > 0 else 0.0


def device_utilization(rank: RankReport, device: DeviceReport) -> float | None:
    """One device's utilization as the rank's report may claim it: None where its busy time holds an unmeasured
    wait."""
    return None if any(u in UNMEASURED_BUSY for u in rank.unmeasured) else device.utilization


def utilization(report: AnalysisReport) -> float | None:
    """The run's utilization (:meth:`AnalysisReport.utilization`); None where it was not measured."""
    return None if unmeasured(report) else report.utilization()
