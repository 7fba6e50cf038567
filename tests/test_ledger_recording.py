"""The commands that measure record what they measured: run, monitor, summarize, bench; --no-ledger skips it."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from conftest import DATA
from gpuidle.cli import live as cli_live
from gpuidle.cli import main
from gpuidle.ledger import Ledger, LedgerError, Run
from gpuidle.model import UtilizationReport
from gpuidle.probes.storage import StorageResult
from test_live_monitor import FakeHost, RecordedBackend, full_sample

SMI_LOG = Path(__file__).parent / "data" / "smi" / "query_gpu_units.csv"


def only_run(path: Path) -> Run:
    with Ledger(path) as book:
        (run,) = book.runs()
    return run


def test_summarize_records_the_summary_and_its_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "l.sqlite"
    assert main(["summarize", str(SMI_LOG), "--json", "--label", "smi baseline", "--ledger", str(ledger)]) == 0
    printed = msgspec.json.decode(capsys.readouterr().out, type=UtilizationReport)
    run = only_run(ledger)
    assert (run.kind, run.label) == ("summarize", "smi baseline")
    report = msgspec.json.decode(run.report, type=UtilizationReport)
    assert report.schema == "gpuidle.utilization/1"
    assert report == printed
    assert [(f.path, f.sha256) for f in run.inputs] == [(str(SMI_LOG.resolve()),
                                                         hashlib.sha256(SMI_LOG.read_bytes()).hexdigest())]
    assert run.gpu_count == len(report.devices) > 0
    assert run.utilization == pytest.approx(sum(d.mean_util_pct for d in report.devices) / len(report.devices) / 100)
    with pytest.raises(LedgerError, match="is a summarize record"):  # compare takes analyses only
        run.analysis()


def test_monitor_records_when_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    ticks = [[full_sample(0, 95.0), full_sample(1, 40.0)]]
    monkeypatch.setattr(cli_live, "GPU_BACKEND", lambda: RecordedBackend(ticks))
    monkeypatch.setattr(cli_live, "HOST_BACKEND", lambda pid: FakeHost())
    ledger, log = tmp_path / "l.sqlite", tmp_path / "util.jsonl"
    assert main(["monitor", "--count", "3", "--interval", "0.1", "--out", str(log), "--quiet", "--json",
                 "--label", "night", "--ledger", str(ledger)]) == 0
    capsys.readouterr()
    run = only_run(ledger)
    assert (run.kind, run.label, run.gpu_model, run.gpu_count) == ("monitor", "night", "GPU0, GPU1", 2)
    assert run.utilization == pytest.approx(0.675)
    assert msgspec.json.decode(run.report, type=UtilizationReport).schema == "gpuidle.utilization/1"
    assert [f.path for f in run.inputs] == [str(log.resolve())]


def test_run_records_the_command_and_its_summary(tmp_path: Path) -> None:
    ledger, log, summary = tmp_path / "l.sqlite", tmp_path / "run.jsonl", tmp_path / "summary.json"
    command = [sys.executable, "-c", "pass"]
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "run", "--quiet", "--interval", "0.1", "--no-dcgm",
                           "--out", str(log), "--summary", str(summary), "--json", "--label", "noop",
                           "--ledger", str(ledger), "--", *command], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "recorded as run" not in proc.stderr  # said on a terminal only
    run = only_run(ledger)
    assert (run.kind, run.label, run.notes) == ("run", "noop", shlex.join(command))
    report = msgspec.json.decode(run.report, type=UtilizationReport)
    assert report.schema == "gpuidle.utilization/1"
    assert json.loads(run.report) == json.loads(summary.read_text())
    assert report.source.command == command
    assert [f.path for f in run.inputs] == [str(log.resolve())]
    if not report.devices:  # no GPU here: nothing to say about GPUs
        assert (run.gpu_model, run.gpu_count, run.utilization) == (None, None, None)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(40):
        (root / f"{i:03d}.bin").write_bytes(bytes(range(256)) * 16)
    return root


def test_bench_storage_records_its_result(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "l.sqlite"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["bench", "storage", str(folder), "--budget-s", "0.2", "--json", "--no-progress",
                 "--label", "local disk", "--ledger", str(ledger)]) == 0
    assert capsys.readouterr().err == "gpuidle: recorded as run 1 (local disk)\n"
    run = only_run(ledger)
    assert (run.kind, run.label) == ("bench", "local disk")
    result = msgspec.json.decode(run.report, type=StorageResult)
    assert result.schema == "gpuidle.bench.storage/1"
    assert result.listing.files == 40
    assert run.notes == f"bench storage {folder}"
    assert run.inputs == []  # the dataset is named, not hashed


def test_bench_records_on_rank_0_only(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "l.sqlite"
    monkeypatch.setenv("RANK", "1")
    assert main(["bench", "storage", str(folder), "--budget-s", "0.1", "--ledger", str(ledger)]) == 0
    capsys.readouterr()
    assert not ledger.exists()


def test_no_ledger_records_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "l.sqlite"
    assert main(["summarize", str(SMI_LOG), "--json", "--no-ledger", "--ledger", str(ledger)]) == 0
    assert capsys.readouterr().err == ""
    assert not ledger.exists()


def test_a_ledger_that_cannot_be_written_is_one_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_a_ledger = tmp_path / "notes.sqlite"
    not_a_ledger.write_text("not a database, but someone's notes\n" * 100)
    assert main(["summarize", str(SMI_LOG), "--json", "--ledger", str(not_a_ledger)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["schema"] == "gpuidle.utilization/1"
    assert out.err.startswith("gpuidle: warning: the run was not recorded in the ledger: ")
    assert out.err.count("\n") == 1
    assert not_a_ledger.read_text().startswith("not a database")


def test_the_files_written_and_the_run_are_said_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "l.sqlite"
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["analyze", str(DATA / "trace_compare__base__base.json.gz"), "--json", "--out", str(out),
                 "--html", str(page), "--ledger", str(ledger)]) == 0
    assert capsys.readouterr().err == f"gpuidle: wrote {out}, {page}; recorded as run 1\n"
    assert out.exists()
    assert page.exists()
