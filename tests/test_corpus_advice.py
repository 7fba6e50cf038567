"""The audited corpus (``../shared/corpus``, its README gives the expert's truth for each trace): what the report
says on each, checked against that truth. Skipped where the corpus is absent."""

from __future__ import annotations

from functools import cache

import pytest

from gpuidle.api import analyze
from gpuidle.model import AnalysisReport
from shared_traces import corpus


@cache
def report_of(name: str) -> AnalysisReport:
    return analyze([str(corpus(name))])


def test_deepep_under_its_own_namespace_is_the_exposed_all_to_all() -> None:
    """DeepSeek's DeepEP kernels (``dpsk::ep::``): 113 ms of expert all-to-all on their own stream, 4.2 ms of it
    exposed; the GPU's compute is the rest."""
    report = report_of("deepseek_dualpipe_h800_rank0.json.gz")
    (rank,) = report.ranks
    comm = rank.communication
    assert {c.collective for c in comm.collectives} == {"all_to_all"}
    assert sum(c.total_s for c in comm.collectives) == pytest.approx(0.1134, abs=0.001)
    assert comm.exposed_s == pytest.approx(0.0042, abs=0.0002)
    assert rank.primary().idle_by_cause_s["communication"] == pytest.approx(0.0042, abs=0.0002)
    assert [m.dim for m in comm.mesh if m.count] == ["ep"]


def test_one_step_per_rank_names_no_straggler() -> None:
    """DLRM on 8 ranks, one step each, starts skewed by up to 7.5 ms: the waits are arrival skew, no straggler,
    no rank the others wait for in the all-to-all."""
    report = report_of("dlrm_8rank_v100")
    assert report.job is not None
    assert report.job.stragglers == []
    assert all(r.primary().idle_by_cause_s["straggler_wait"] == 0.0 for r in report.ranks)
    assert not any("waits least" in n for n in report.job.notes)
    assert "straggler_wait" not in {r.cause for r in report.recommendations}
