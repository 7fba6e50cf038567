"""A run whose busy time holds a wait it could not time (a Keras fit not given ``callback.dataset()``) has no
utilization: every command says "not measured" where it would print the figure, and what it did not measure.

The report is a real trace's, marked as the Keras tracker marks such a run (``RankReport.unmeasured``); its
utilization would otherwise read as measured (``tests/test_tracker_keras.py`` runs the fit itself).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.advice import calc
from gpuidle.advice.fleet import fleet_job
from gpuidle.analysis.compare import compare, summarize
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport
from gpuidle.report.compare_text import CompareTerminalRenderer
from gpuidle.report.markdown import MarkdownRenderer
from gpuidle.report.terminal import TerminalRenderer

TRACE = DATA / "trace_compare__base__base.json.gz"


@pytest.fixture(scope="module")
def measured() -> AnalysisReport:
    return api.analyze([TRACE])


@pytest.fixture(scope="module")
def unmeasured(measured: AnalysisReport) -> AnalysisReport:
    ranks = [msgspec.structs.replace(r, unmeasured=["data_loading"]) for r in measured.ranks]
    return msgspec.structs.replace(measured, ranks=ranks)


def test_the_headline_says_not_measured(unmeasured: AnalysisReport, measured: AnalysisReport) -> None:
    figure = f"{measured.ranks[0].primary().utilization * 100:.1f} %"
    for text in (TerminalRenderer().render(unmeasured), MarkdownRenderer().render(unmeasured)):
        assert "utilization not measured" in text
        assert "data_loading counts as busy" in text
        assert f"utilization {figure}" not in text
    assert f"utilization {figure}" in TerminalRenderer().render(measured)


def test_compare_gives_no_utilization_and_no_change(unmeasured: AnalysisReport, measured: AnalysisReport) -> None:
    assert summarize(unmeasured).utilization is None
    assert summarize(unmeasured).not_measured == ["data_loading"]
    c = compare(unmeasured, measured)
    assert c.utilization_delta is None
    assert "before: utilization not measured (data_loading counts as busy)" in c.notes
    text = CompareTerminalRenderer().render(c)
    row = next(line for line in text.splitlines() if line.startswith("utilization"))
    assert row.split()[1:4] == ["not", "measured", f"{measured.utilization() * 100:.1f}"]
    assert row.split()[-1] == "n/a"


def test_history_cost_and_fleet_say_so(unmeasured: AnalysisReport, private_ledger: Path,
                                      capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    api.record_analysis(unmeasured, label="keras-unwrapped", ledger_path=private_ledger, kind="tracker")
    assert main(["history", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert run["utilization"] is None
    assert main(["history"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "keras-unwr" in line)
    assert "not measured" in row
    with pytest.raises(GpuidleError, match="utilization was not measured"):
        calc.cost_from_report(unmeasured, price_per_gpu_hour=2.0)
    job = fleet_job("job", str(tmp_path), unmeasured)
    assert job.utilization is None
    assert job.error == "utilization not measured (data_loading counts as busy)"
