"""Before and after: two analysis reports in, a typed :class:`~gpuidle.model.Comparison` out.

A run is summarised per step, not per window: two profiles rarely cover the same number
of steps, but a step is the unit of work that must get faster. Every figure is the one
``analyze`` shows (:mod:`gpuidle.analysis.figures`): the steady step, idle per steady step by
cause, the GPUs with work, utilization; the steps left out are named.

Two runs are *not comparable* when the work per step changed under them: another GPU
model, another GPU count or world size, or another batch size (when both runs record one). The
comparison is still computed, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuidle.analysis import figures
from gpuidle.model import (
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


def summarize(report: AnalysisReport, info: RunInfo | None = None) -> RunSummary:
    """The per-step figures of one run."""
    info = info or RunInfo()
    idle = figures.idle_by_cause_s(report)
    return RunSummary(
        ref=info.ref, label=info.label,
        gpu_model=info.gpu_model or gpu_model(report),
        world_size=figures.world_size(report), batch_size=info.batch_size,
        ranks=len(report.ranks), steps=figures.steps(report),
        utilization=figures.utilization(report),
        step_s=figures.step_s(report),
        idle_s=figures.idle_s(report),
        idle_by_cause_s=idle,
        recommendations=[r.id for r in report.recommendations],
        gpus=figures.gpus(report), excluded_steps=figures.excluded_steps(report),
        not_measured=figures.unmeasured(report),
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
    if a.gpus != b.gpus:
        differences.append(f"GPUs differ: {a.gpus} vs {b.gpus}")
    elif a.world_size != b.world_size:
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
    for side, s in (("before", a), ("after", b)):
        if s.not_measured:
            notes.append(f"{side}: utilization not measured ({', '.join(s.not_measured)} counts as busy)")
        if s.excluded_steps:
            notes.append(f"{side}: left out of the per-step figures, as analyze leaves them out: "
                         f"{'; '.join(s.excluded_steps)}")
    if a.ranks != b.ranks:
        notes.append(f"{a.ranks} rank(s) analysed before, {b.ranks} after")
    return Comparison(
        before=a, after=b, comparable=not differences, differences=differences, notes=notes,
        utilization_delta=None if a.utilization is None or b.utilization is None else b.utilization - a.utilization,
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
        return s.step_s * n * s.gpus * price / 3600.0

    return CostDelta(price_per_gpu_hour=price, steps=n, before=cost(a), after=cost(b), saved=cost(a) - cost(b))
