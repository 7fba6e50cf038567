"""The advice of a job, one way for traces and tracker runs alike: every rank's rules on its steady step, each
fix kept only where its preconditions hold, the stragglers' fixes, the stack's wording, the what-if plan, and
what must be measured first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from gpuidle.advice.cuda import CUDA_APPLICATION, for_cuda
from gpuidle.advice.frameworks import in_framework
from gpuidle.advice.rules import recommend, straggler_recommendations
from gpuidle.advice.whatif import Proposal, plan
from gpuidle.model import Combined, Declined, Gain, JobReport, RankReport, Recommendation

SAID_ABOVE = frozenset({"host_activity"})
"""Unmeasured causes the block of what the trace can tell already names, with how to record them (a trace of
device events alone: :mod:`gpuidle.analysis.trace_quality`): never a fix."""


class Advice(msgspec.Struct, frozen=True):
    recommendations: list[Recommendation]
    combined: Combined | None
    declined: list[Declined]


def framework_of(frameworks: set[str | None]) -> str | None:
    """The one framework a job's inputs name, whose wording its fixes take; None (PyTorch's, the rules' own) where
    they name none or several."""
    known = {f for f in frameworks if f}
    return known.pop() if len(known) == 1 else None


def advise(reports: Sequence[RankReport], job: JobReport | None, framework: str | None,
           include_all: bool = False, accumulation: Mapping[int, int] | None = None) -> Advice:
    """The job's fixes in the order to apply them, their combined effect, and the fixes declined with the
    precondition that failed; ``accumulation``: per rank, how often its all-reduce sequence repeats in a step."""
    proposals: list[Proposal] = []
    declined: list[Declined] = []
    for r in reports:
        kept, no = recommend(r, (accumulation or {}).get(r.rank, 1), include_all=include_all)
        proposals.extend(kept)
        declined.extend(no)
    if job is not None:
        proposals.extend(straggler_recommendations(job, list(reports), include_all))
    if framework == CUDA_APPLICATION:
        proposals = for_cuda(proposals)
    recs, combined = plan(in_framework(proposals, framework), reports, include_all, job)
    # how to measure what a tracker run could not comes before the fixes it would size
    recs = sorted(recs, key=lambda x: not (x.id == "record_cpu_activity" and any(r.unmeasured for r in reports)))
    first = [m for m in measure_first(reports) if m.evidence["not_measured"] not in SAID_ABOVE]
    return Advice([*first, *recs], combined, declined)


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
