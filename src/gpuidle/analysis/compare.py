"""Before and after: two analysis reports in, a typed :class:`~gpuidle.model.Comparison` out.

A run is summarised per step, not per window: two profiles rarely cover the same number
of steps, but a step is the unit of work that must get faster. Utilization is busy over
window, summed over the primary device of every rank; the step time is the median and idle by
cause the mean over every step of every rank.

Two runs are *not comparable* when the work per step changed under them: another GPU
model, another world size, or another batch size (when both runs record one). The
comparison is still computed, and says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuidle.model import (
    CAUSES,
    AnalysisReport,
    Comparison,
    CostDelta,
    RecommendationChange,
    RunSummary,
)

DEFAULT_PRICED_STEPS = 1000


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the report itself does not say about a run."""

    ref: str = ""
    label: str | None = None
    batch_size: int | None = None
    gpu_model: str | None = None
    """Overrides the device names of the trace (a ledger record may know better)."""


def gpu_model(report: AnalysisReport) -> str | None:
    """The primary devices' names, e.g. ``NVIDIA A100-SXM4-80GB``; None when the traces do not say."""
    names = sorted({n for r in report.ranks if (n := r.primary().name)})
    return ", ".join(names) if names else None


def world_size(report: AnalysisReport) -> int:
    """GPUs in the job: as recorded by the traces, else one per rank found."""
    if report.job is not None and report.job.world_size:
        return report.job.world_size
    recorded = [r.world_size for r in report.ranks if r.world_size]
    return max(recorded) if recorded else len(report.ranks)


def median_step_s(report: AnalysisReport) -> float:
    """The median step time over all ranks' steps (a rank without steps counts its window as one step).

    The median, as the tracker reports it: one slow step (a checkpoint, the first) does not move it.
    """
    durations = [d for r in report.ranks for d in ([s.dur_s for s in r.steps] or [r.primary().window_s])]
    return statistics.median(durations) if durations else 0.0


def summarize(report: AnalysisReport, info: RunInfo | None = None) -> RunSummary:
    """The per-step figures of one run."""
    info = info or RunInfo()
    primaries = [r.primary() for r in report.ranks]
    steps = sum(max(len(r.steps), 1) for r in report.ranks)
    return RunSummary(
        ref=info.ref, label=info.label,
        gpu_model=info.gpu_model or gpu_model(report),
        world_size=world_size(report), batch_size=info.batch_size,
        ranks=len(report.ranks), steps=steps,
        utilization=report.utilization(),
        step_s=median_step_s(report),
        idle_s=sum(d.idle_s for d in primaries) / steps,
        idle_by_cause_s={c.value: sum(d.idle_by_cause_s.get(c.value, 0.0) for d in primaries) / steps
                         for c in CAUSES},
        recommendations=[r.id for r in report.recommendations],
    )


def compare(
    before: AnalysisReport,
    after: AnalysisReport,
    before_info: RunInfo | None = None,
    after_info: RunInfo | None = None,
    price_per_gpu_hour: float | None = None,
    steps: int | None = None,
) -> Comparison:
    """Compare two runs; ``price_per_gpu_hour`` adds what ``steps`` steps cost before and after."""
    a, b = summarize(before, before_info), summarize(after, after_info)
    differences: list[str] = []
    if a.gpu_model and b.gpu_model and a.gpu_model != b.gpu_model:
        differences.append(f"GPU model differs: {a.gpu_model} vs {b.gpu_model}")
    if a.world_size != b.world_size:
        differences.append(f"world size differs: {a.world_size} vs {b.world_size} GPUs")
    if a.batch_size is not None and b.batch_size is not None and a.batch_size != b.batch_size:
        differences.append(f"batch size differs: {a.batch_size} vs {b.batch_size}")
    notes: list[str] = []
    if (a.batch_size is None) != (b.batch_size is None):
        side = "before" if a.batch_size is None else "after"
        notes.append(f"the batch size of the {side} run is not recorded (gpuidle analyze --batch-size)")
    kinds = ({r.window.kind for r in before.ranks}, {r.window.kind for r in after.ranks})
    if kinds[0] != kinds[1]:
        notes.append(f"the windows were found differently: {', '.join(sorted(kinds[0]))} vs "
                      f"{', '.join(sorted(kinds[1]))}")
    if a.ranks != b.ranks:
        notes.append(f"{a.ranks} rank(s) analysed before, {b.ranks} after")
    return Comparison(
        before=a, after=b, comparable=not differences, differences=differences, notes=notes,
        utilization_delta=b.utilization - a.utilization,
        step_s_delta=b.step_s - a.step_s,
        speedup=a.step_s / b.step_s if b.step_s > 0 else None,
        idle_by_cause_delta_s={c: b.idle_by_cause_s[c] - a.idle_by_cause_s[c] for c in a.idle_by_cause_s},
        recommendations=_recommendation_changes(before, after),
        cost=None if price_per_gpu_hour is None else _cost(a, b, price_per_gpu_hour, steps),
    )


def _recommendation_changes(before: AnalysisReport, after: AnalysisReport) -> list[RecommendationChange]:
    """Resolved first (by the gain they had), then new (by gain), then remaining."""
    old = {r.id: r for r in before.recommendations}
    new = {r.id: r for r in after.recommendations}
    out: list[RecommendationChange] = []
    for rid, r in old.items():
        status = "remaining" if rid in new else "resolved"
        out.append(RecommendationChange(id=rid, cause=r.cause, title=r.title, status=status,
                                        gain_before_s=r.gain.step_s_saved,
                                        gain_after_s=new[rid].gain.step_s_saved if rid in new else None))
    for rid, r in new.items():
        if rid not in old:
            out.append(RecommendationChange(id=rid, cause=r.cause, title=r.title, status="new",
                                            gain_before_s=None, gain_after_s=r.gain.step_s_saved))
    order = {"resolved": 0, "new": 1, "remaining": 2}
    return sorted(out, key=lambda c: (order[c.status], -max(c.gain_before_s or 0.0, c.gain_after_s or 0.0)))


def _cost(a: RunSummary, b: RunSummary, price: float, steps: int | None) -> CostDelta:
    n = steps or DEFAULT_PRICED_STEPS

    def cost(s: RunSummary) -> float:
        return s.step_s * n * s.world_size * price / 3600.0

    return CostDelta(price_per_gpu_hour=price, steps=n, before=cost(a), after=cost(b), saved=cost(a) - cost(b))
