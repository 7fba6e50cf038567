"""One number for one run, whichever command shows it.

Every bundled trace with device activity, analysed once: its utilization as ``analyze --json`` gives it, as the
ledger keeps it (``history --json``), as ``compare`` reads the written report and the recorded run, as the fleet
table gives the job, and as the terminal, HTML and Markdown reports print it, all equal; each against busy over
busy + idle computed here from the report's own device, which must add up to its window.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from test_reference import GPU_TRACES

EXAMPLE = DATA.parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
TRACES = [EXAMPLE, *(DATA / n for n in GPU_TRACES), DATA / "cloverleaf_a100__perlmutter-cloverleaf-cuda.sqlite"]


def gpuidle(*args: str, ledger: Path | None) -> str:
    mine = ["--ledger", str(ledger)] if ledger is not None else []
    proc = subprocess.run([sys.executable, "-m", "gpuidle", *args, *mine], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout


def printed_percent(text: str, pattern: str) -> float:
    match = re.search(pattern + r"\s*([0-9.]+) %", text)
    assert match is not None, text[:2000]
    return float(match.group(1)) / 100


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.split("__")[0])
def test_every_command_shows_the_same_utilization(trace: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    written = tmp_path / "report.json"
    gpuidle("analyze", str(trace), "--json", "--out", str(written), ledger=ledger)
    report = json.loads(written.read_text())
    (rank,) = report["ranks"]
    device = max(rank["devices"], key=lambda d: (d["busy_s"], -d["device"]))
    assert device["busy_s"] + device["idle_s"] == pytest.approx(device["window_s"], abs=1e-9)
    expected = device["busy_s"] / device["window_s"] if device["window_s"] else 0.0
    assert device["utilization"] == pytest.approx(expected, abs=1e-12)

    (run,) = json.loads(gpuidle("history", "--json", ledger=ledger))
    assert run["utilization"] == pytest.approx(expected, abs=1e-12)
    for before in (str(written), str(run["id"])):
        compared = json.loads(gpuidle("compare", before, str(written), "--json", ledger=ledger))
        assert compared["before"]["utilization"] == pytest.approx(expected, abs=1e-12)
        assert compared["after"]["utilization"] == pytest.approx(expected, abs=1e-12)

    job = tmp_path / "fleet" / "job"
    job.mkdir(parents=True)
    shutil.copy(trace, job / trace.name)
    (row,) = json.loads(gpuidle("analyze", str(job.parent), "--json", "--no-ledger", ledger=ledger))["jobs"]
    assert row["utilization"] == pytest.approx(expected, abs=1e-12)

    shown = f"device {device['device']}"
    terminal = gpuidle("analyze", str(trace), "--no-ledger", "--color", "never", ledger=ledger)
    assert printed_percent(terminal, re.escape(shown) + r".*?utilization") == pytest.approx(expected, abs=5e-4)
    page = tmp_path / "report.html"
    gpuidle("analyze", str(trace), "--no-ledger", "--html", str(page), ledger=ledger)
    card = re.search(rf"GPU {device['device']}\b.*?<div class=\"big [^\"]*\">([0-9.]+) %</div>", page.read_text())
    assert card is not None
    assert float(card.group(1)) / 100 == pytest.approx(expected, abs=5e-4)
    markdown = gpuidle("analyze", str(trace), "--no-ledger", "--format", "md", ledger=ledger)
    assert printed_percent(markdown, re.escape(shown) + r": utilization") == pytest.approx(expected, abs=5e-4)


def test_a_jobs_utilization_is_one_number_in_every_command(tmp_path: Path) -> None:
    """Two ranks: the run's utilization is the mean of its ranks' devices in the ledger, compare, the fleet table
    and the cost, computed here from the written report."""
    ledger = tmp_path / "ledger.sqlite"
    job = tmp_path / "fleet" / "job"
    job.mkdir(parents=True)
    for name in ("trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz"):
        shutil.copy(DATA / name, job / name)
    written = tmp_path / "report.json"
    gpuidle("analyze", str(job), "--json", "--out", str(written), ledger=ledger)
    ranks = json.loads(written.read_text())["ranks"]
    devices = [max(r["devices"], key=lambda d: (d["busy_s"], -d["device"])) for r in ranks]
    expected = sum(d["busy_s"] / d["window_s"] for d in devices) / len(devices)
    (run,) = json.loads(gpuidle("history", "--json", ledger=ledger))
    assert run["utilization"] == pytest.approx(expected, abs=1e-12)
    compared = json.loads(gpuidle("compare", str(written), str(run["id"]), "--json", ledger=ledger))
    assert compared["before"]["utilization"] == pytest.approx(expected, abs=1e-12)
    assert compared["after"]["utilization"] == pytest.approx(expected, abs=1e-12)
    (row,) = json.loads(gpuidle("analyze", str(job.parent), "--json", "--no-ledger", ledger=ledger))["jobs"]
    assert row["utilization"] == pytest.approx(expected, abs=1e-12)
    cost = json.loads(gpuidle("cost", "--from", str(written), "--hours", "2", "--json", ledger=None))
    assert cost["cost"]["utilization"] == pytest.approx(expected, abs=1e-12)
