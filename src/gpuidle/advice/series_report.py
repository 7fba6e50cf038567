"""The report of a step tracker's job: each rank's steps analysed, the advice rules and the what-if plan
applied as for traces. Here, not in ``api``, so that the tracker itself (a producer) can build its summary."""

from __future__ import annotations

from collections.abc import Sequence

from gpuidle.advice.advise import advise, framework_of
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
    frameworks: set[str | None] = {s.framework for s in series if s.framework not in (None, "pytorch")}
    framework = framework_of(frameworks)
    advice = advise(reports, job, framework, include_warmup)
    return AnalysisReport(
        source=Source(paths=list(paths), format=TRACKER_SOURCE, skipped=list(skipped), framework=framework),
        ranks=reports, job=job, recommendations=advice.recommendations, combined=advice.combined,
        declined=advice.declined, include_warmup=include_warmup,
    )
