"""``gpuidle history``: what each column says, and which runs ``--kind`` finds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuidle import ledger
from gpuidle.cli import main
from gpuidle.report.common import ms

DATA = Path(__file__).parent / "data"
RANKS = [DATA / "trace_filter__sampled_rank-0.json.gz", DATA / "trace_filter__sampled_rank-1.json.gz"]


def _row(out: str, needle: str) -> str:
    return next(line for line in out.splitlines() if needle in line)


def test_a_partial_folder_shows_ranks_found_of_world_size(private_ledger: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", *map(str, RANKS), "--label", "two-of-job", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["ranks"]) == 2
    assert main(["history"]) == 0
    out = capsys.readouterr().out
    row = _row(out, "two-of-job")
    assert "2 of 128" in row           # two traces of a 128-rank job, not "128"
    assert main(["compare", "two-of-job", "two-of-job"]) == 0
    assert "before: 2 of 128 GPU(s)" in capsys.readouterr().out  # compare says it as history does
    assert "steady step" in out        # the statistic is named in the header
    steady = [[s["dur_s"] for s in r["steps"] if s["excluded"] is None] for r in report["ranks"]]
    slowest = max(sum(own) / len(own) for own in steady)
    assert ms(slowest) in row          # the slowest rank's mean steady step, as analyze's fixes start from it


def test_kind_bench_finds_the_records_of_bench_sub_commands(private_ledger: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ledger.record("bench allreduce", b"{}", "ar", [], path=private_ledger)
    ledger.record("bench", b"{}", "plain", [], path=private_ledger)
    ledger.record("summarize", b"{}", "other", [], path=private_ledger)
    assert main(["history", "--kind", "bench", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in rows] == ["plain", "ar"]
    assert main(["history", "--kind", "bench", "--limit", "1", "--json"]) == 0
    assert [r["label"] for r in json.loads(capsys.readouterr().out)] == ["plain"]


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_table_keeps_to_columns_with_its_figures_whole(width: int, private_ledger: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Piped, the table takes COLUMNS: a narrow one leaves columns out and says which, never a figure cut."""
    assert main(["analyze", *map(str, RANKS), "--label", "two-of-job", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["history"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    util = sum(max(r["devices"], key=lambda d: d["busy_s"])["utilization"] for r in report["ranks"]) / 2
    row = _row(out, f"{util * 100:.1f} %")
    assert row.split()[0] == "1"
    assert ("not shown at" in out) == (width < 120)


def test_a_record_from_before_shows_todays_figures(private_ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record kept with a median step and one GPU (as gpuidle once stored them) is shown with the figures analyze
    gives its report: the steady step and the GPUs with work, computed here from the report."""
    assert main(["analyze", str(RANKS[0]), "--json", "--no-ledger"]) == 0
    text = capsys.readouterr().out
    report = json.loads(text)
    ledger.record("analyze", text, "old", [], path=private_ledger, step_s=123.0, gpu_count=99, utilization=0.5)
    assert main(["history", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    (rank,) = report["ranks"]
    steady = [s["dur_s"] for s in rank["steps"] if s["excluded"] is None]
    device = max(rank["devices"], key=lambda d: d["busy_s"])
    assert run["step_s"] == pytest.approx(sum(steady) / len(steady), abs=1e-12)
    assert run["gpu_count"] == sum(d["busy_s"] > 0 for d in rank["devices"])
    assert run["utilization"] == pytest.approx(device["busy_s"] / device["window_s"], abs=1e-12)
