"""The report of a step tracker's job: each rank's steps analysed, the advice rules and the what-if plan
applied as for traces. Here, not in ``api``, so that the tracker itself (a producer) can build its summary."""

from __future__ import annotations

from collections.abc import Sequence

from gpuidle.advice.frameworks import in_framework
from gpuidle.advice.rules import recommend, straggler_recommendations
from gpuidle.advice.whatif import Proposal, plan
from gpuidle.analysis import series as step_series
from gpuidle.model import TRACKER_SOURCE, AnalysisReport, Gain, RankReport, Recommendation, Source, StepSeries


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
    recs = [*measure_first(reports), *recs]
    return AnalysisReport(
        source=Source(paths=list(paths), format=TRACKER_SOURCE, skipped=list(skipped), framework=framework),
        ranks=reports, job=job, recommendations=recs, combined=combined, include_warmup=include_warmup,
    )


MEASURE = {
    "data_loading": (
        "Data wait not measured: give fit the dataset through callback.dataset(ds)",
        "model.fit(callback.dataset(train_ds), epochs=epochs, callbacks=[callback])\n"
        "# without it the tracker sees each train call whole: the wait for its batch counts as compute"),
}
"""How to measure what a tracker run could not, per idle cause (:attr:`RankReport.unmeasured`)."""


def measure_first(reports: Sequence[RankReport]) -> list[Recommendation]:
    """For each idle cause a run could not measure, how to measure it: the first fix, with no gain promised (the
    idle it hides counts as busy until it is measured)."""
    out = []
    for cause in dict.fromkeys(c for r in reports for c in r.unmeasured):
        title, fix = MEASURE.get(cause, (f"{cause} not measured in this run", "# see the notes of the report"))
        ranks = sorted(r.rank for r in reports if cause in r.unmeasured)
        out.append(Recommendation(
            id=f"measure_{cause}", cause=cause, title=title, evidence={"ranks": ranks, "not_measured": cause},
            fix=fix, confidence="high", rank=ranks[0] if len(ranks) == 1 else None,
            gain=Gain(step_s_saved=None, utilization_after=None,
                      reason=f"{cause} was not measured: its time counts as busy until it is")))
    return out
