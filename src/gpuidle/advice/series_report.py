"""The report of a step tracker's job: each rank's steps analysed, the advice rules and the what-if plan
applied as for traces. Here, not in ``api``, so that the tracker itself (a producer) can build its summary."""

from __future__ import annotations

from collections.abc import Sequence

from gpuidle.advice.frameworks import in_framework
from gpuidle.advice.rules import recommend, straggler_recommendations
from gpuidle.advice.whatif import Proposal, plan
from gpuidle.analysis import series as step_series
from gpuidle.model import TRACKER_SOURCE, AnalysisReport, Source, StepSeries


def series_report(
    series: Sequence[StepSeries], paths: Sequence[str], skipped: Sequence[str] = (),
    duplicates: Sequence[int] = (), world_size: int | None = None, include_warmup: bool = False,
) -> AnalysisReport:
    """The report of the tracker's steps, one series per rank; the fixes in the framework's words (TensorFlow, JAX)."""
    reports = [step_series.rank_report(s) for s in series]
    job = step_series.job_report(list(series), reports, list(duplicates)) \
        if len(series) > 1 or (world_size or 1) > 1 else None
    proposals: list[Proposal] = []
    for r in reports:
        proposals.extend(recommend(r, include_all=include_warmup))
    if job is not None:
        proposals.extend(straggler_recommendations(job, reports, include_warmup))
    frameworks = {s.framework for s in series if s.framework not in (None, "pytorch")}
    framework = frameworks.pop() if len(frameworks) == 1 else None
    recs, combined = plan(in_framework(proposals, framework), reports, include_warmup, job)
    return AnalysisReport(
        source=Source(paths=list(paths), format=TRACKER_SOURCE, skipped=list(skipped), framework=framework),
        ranks=reports, job=job, recommendations=recs, combined=combined, include_warmup=include_warmup,
    )
