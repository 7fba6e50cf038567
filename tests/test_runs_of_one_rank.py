"""A folder that keeps every run of one worker: the newest run is analysed, and the report itself says so (its
JSON, the Markdown, the terminal, the ledger's record), not stderr alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.cli import main
from gpuidle.ledger import Ledger

TRACE = DATA / "trace_compare__base__base.json.gz"


def test_the_runs_left_out_are_said_in_the_report(tmp_path: Path, private_ledger: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "worker0"
    folder.mkdir()
    for i in range(3):
        shutil.copy(TRACE, folder / f"run{i}.pt.trace.json.gz")
    said = "is in 3 files (runs of the same rank)"
    assert main(["analyze", str(folder), "--json", "--out", str(tmp_path / "r.json")]) in (0, 1)
    assert said in capsys.readouterr().err
    (rank,) = json.loads((tmp_path / "r.json").read_text())["ranks"]
    assert any(said in n for n in rank["notes"])
    assert main(["analyze", str(folder), "--format", "md", "--no-ledger"]) in (0, 1)
    assert said in capsys.readouterr().out
    with Ledger(private_ledger) as book:
        (run,) = book.runs()
    assert any(said in n for n in run.analysis().ranks[0].notes)
