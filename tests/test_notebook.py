"""The library in a notebook: a report shows itself (the HTML page's renderer) and gives its tables as DataFrames."""

from __future__ import annotations

import html as htmlmod
import json
import re
import sys
from pathlib import Path

import pytest

import gpuidle
from conftest import DATA
from gpuidle.model import CAUSES
from gpuidle.report import html

EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
RANKS = [DATA / "trace_filter__sampled_rank-0.json.gz", DATA / "trace_filter__sampled_rank-1.json.gz"]


@pytest.fixture(scope="module")
def report() -> gpuidle.AnalysisReport:
    return gpuidle.analyze([EXAMPLE])


def test_every_way_to_a_report_gives_the_displayable_type(report: gpuidle.AnalysisReport, tmp_path: Path) -> None:
    assert type(report) is gpuidle.AnalysisReport
    assert isinstance(report, gpuidle.model.AnalysisReport)
    assert type(gpuidle.AnalysisReport.from_json(report.to_json())) is gpuidle.AnalysisReport
    assert type(gpuidle.with_cost(report, 2.5)) is gpuidle.AnalysisReport
    saved = tmp_path / "r.json"
    saved.write_text(report.to_json())
    _, before, after = gpuidle.compare_runs(str(saved), str(saved))
    assert type(before) is type(after) is gpuidle.AnalysisReport


def test_the_report_shows_itself_as_the_html_page(report: gpuidle.AnalysisReport) -> None:
    shown = report._repr_html_()
    (srcdoc,) = re.findall(r'srcdoc="([^"]*)"', shown)
    assert htmlmod.unescape(srcdoc) == html.render_report(report)
    assert shown.startswith("<iframe ")
    assert shown.endswith("</iframe>")
    assert 'sandbox="allow-same-origin"' in shown  # no script may run in it


def _json_steps(doc: dict) -> list[dict]:
    return [{"rank": r["rank"], "step": s["step"], "dur_s": s["dur_s"], "busy_s": s["busy_s"], "idle_s": s["idle_s"],
             **{c.value: s["idle_by_cause_s"].get(c.value, 0.0) for c in CAUSES}}
            for r in doc["ranks"] for s in r["steps"]]


@pytest.mark.parametrize("paths", [[EXAMPLE], RANKS], ids=["one rank", "two ranks"])
def test_frames_hold_the_json_report_row_for_row(paths: list[Path]) -> None:
    import pandas as pd

    report = gpuidle.analyze(paths)
    doc = json.loads(report.to_json())
    frames = report.to_frames()
    assert set(frames) == {"steps", "devices", "recommendations", "kernels", "ranks"}

    steps = frames["steps"]
    expected = _json_steps(doc)
    assert len(steps) == len(expected) > 0
    got = steps[list(expected[0])].to_dict("records")
    assert got == expected
    causes = [c.value for c in CAUSES]
    assert (steps[causes].sum(axis=1) - steps["idle_s"]).abs().max() < 1e-9  # causes add up to the idle

    devices = frames["devices"]
    want = [(r["rank"], d["device"], d["utilization"], d["busy_s"], d["idle_s"]) for r in doc["ranks"]
            for d in r["devices"]]
    assert list(devices[["rank", "device", "utilization", "busy_s", "idle_s"]].itertuples(index=False, name=None)) \
        == want

    recs = frames["recommendations"]
    assert recs["id"].tolist() == [r["id"] for r in doc["recommendations"]]
    assert recs["order"].tolist() == list(range(1, len(doc["recommendations"]) + 1))
    for row, rec in zip(recs.to_dict("records"), doc["recommendations"], strict=True):
        assert (row["cause"], row["rank"], row["confidence"]) == (rec["cause"], rec["rank"], rec["confidence"])
        for field, value in rec["gain"].items():  # every gain field, those added later too, is a column
            assert pd.isna(row[field]) if value is None else row[field] == value, field

    ranks = frames["ranks"]
    if doc["job"] is None:
        assert ranks.empty
    else:
        assert ranks["rank"].tolist() == [r["rank"] for r in doc["job"]["rank_table"]]
        assert ranks["step_s"].tolist() == [r["step_s"] for r in doc["job"]["rank_table"]]
    kernels = frames["kernels"]
    assert kernels["name"].tolist() == [k["name"] for r in doc["ranks"] for k in r["kernels"]["top"]]


def test_without_pandas_the_frames_say_what_to_install(report: gpuidle.AnalysisReport,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(gpuidle.GpuidleError, match=r"need pandas .*pip install 'gpuidle\[pandas\]'"):
        report.to_frames()
