"""One number for one run, whichever command shows it.

Every bundled trace with device activity, analysed once: its utilization, steady step, idle per steady step and
GPU count as ``analyze --json`` gives them, as the ledger keeps them (``history --json``), as ``compare`` reads
the written report and the recorded run, as ``cost --from`` and the fleet table give the job, and as the
terminal, HTML and Markdown reports print them, all equal; each against the figure computed here from the
report's own devices and steps: busy over busy + idle (which must add up to the window), the mean over the steps
not marked ``excluded``, the devices with busy time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA
from gpuidle.report.common import ms, pct
from test_reference import GPU_TRACES

EXAMPLE = DATA.parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
TRACES = [EXAMPLE, *(DATA / n for n in GPU_TRACES), DATA / "cloverleaf_a100__perlmutter-cloverleaf-cuda.sqlite",
          DATA / "jax08_conv_mi300x8__tw003.xplane.pb"]


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


def steady_figures(rank: dict[str, Any]) -> tuple[float, float, int]:
    """The mean steady step and idle per steady step (every step where none is steady; the window where there are
    no steps), and the devices with busy time, from one rank of a written report."""
    steps = rank["steps"]
    steady = [s for s in steps if s["excluded"] is None] or steps
    device = max(rank["devices"], key=lambda d: (d["busy_s"], -d["device"]))
    gpus = max(sum(d["busy_s"] > 0 for d in rank["devices"]), 1)
    if not steady:
        return device["window_s"], device["idle_s"], gpus
    idle = sum(s["idle_s"] for s in steady) / len(steady)
    for s in steady:  # each step's idle is its causes added up
        assert s["idle_s"] == pytest.approx(sum(s["idle_by_cause_s"].values()), abs=1e-12)
    return sum(s["dur_s"] for s in steady) / len(steady), idle, gpus


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.split("__")[0])
def test_every_command_shows_the_same_figures(trace: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    written = tmp_path / "report.json"
    gpuidle("analyze", str(trace), "--json", "--out", str(written), ledger=ledger)
    report = json.loads(written.read_text())
    (rank,) = report["ranks"]
    device = max(rank["devices"], key=lambda d: (d["busy_s"], -d["device"]))
    assert device["busy_s"] + device["idle_s"] == pytest.approx(device["window_s"], abs=1e-9)
    expected = device["busy_s"] / device["window_s"] if device["window_s"] else 0.0
    assert device["utilization"] == pytest.approx(expected, abs=1e-12)
    step, idle, gpus = steady_figures(rank)

    (run,) = json.loads(gpuidle("history", "--json", ledger=ledger))
    assert run["utilization"] == pytest.approx(expected, abs=1e-12)
    assert run["step_s"] == pytest.approx(step, abs=1e-12)
    assert run["gpu_count"] == gpus
    for before in (str(written), str(run["id"])):
        compared = json.loads(gpuidle("compare", before, str(written), "--json", ledger=ledger))
        for side in (compared["before"], compared["after"]):
            assert side["utilization"] == pytest.approx(expected, abs=1e-12)
            assert side["step_s"] == pytest.approx(step, abs=1e-12)
            assert side["idle_s"] == pytest.approx(idle, abs=1e-9)
            assert side["gpus"] == gpus
    cost = json.loads(gpuidle("cost", "--from", str(written), "--hours", "1", "--json", ledger=None))["cost"]
    assert (cost["gpus"], cost["utilization"]) == (gpus, pytest.approx(expected, abs=1e-12))

    job = tmp_path / "fleet" / "job"
    job.mkdir(parents=True)
    shutil.copy(trace, job / trace.name)
    (row,) = json.loads(gpuidle("analyze", str(job.parent), "--json", "--no-ledger", ledger=ledger))["jobs"]
    assert row["utilization"] == pytest.approx(expected, abs=1e-12)
    assert row["gpus"] == gpus

    shown = f"device {device['device']}"
    terminal = gpuidle("analyze", str(trace), "--no-ledger", "--color", "never", ledger=ledger)
    if len(rank["devices"]) == 1:  # several: a table of devices, and the run's line below
        assert printed_percent(terminal, re.escape(shown) + r".*?utilization") == pytest.approx(expected, abs=5e-4)
    page = tmp_path / "report.html"
    gpuidle("analyze", str(trace), "--no-ledger", "--html", str(page), ledger=ledger)
    card = re.search(rf"GPU {device['device']}\b.*?<div class=\"big [^\"]*\">([0-9.]+) %</div>", page.read_text())
    assert card is not None
    assert float(card.group(1)) / 100 == pytest.approx(expected, abs=5e-4)
    markdown = gpuidle("analyze", str(trace), "--no-ledger", "--format", "md", ledger=ledger)
    assert printed_percent(markdown, re.escape(shown) + r": utilization") == pytest.approx(expected, abs=5e-4)
    run_line = (f"{gpus} GPU{'' if gpus == 1 else 's'} with work", f"steady step {ms(step)}",
                f"idle {ms(idle)} per steady step", f"utilization {pct(expected)}")
    for text, sep in ((terminal, " · "), (markdown, ", "), (page.read_text(), " · ")):
        assert sep.join(run_line) in text


def test_a_jobs_figures_are_one_number_in_every_command(tmp_path: Path) -> None:
    """Two ranks: the run's utilization is the mean of its ranks' devices, its steady step the slowest rank's and its
    GPUs the two traced, in the ledger, compare, the fleet table and the cost, computed here from the written
    report."""
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
    # the job's steady step is its slowest rank's, as the job's rank table gives each; its GPUs, one per rank
    table = json.loads(written.read_text())["job"]["rank_table"]
    step = max(steady_figures(r)[0] for r in ranks)
    assert step == pytest.approx(max(row["step_s"] for row in table), abs=1e-12)
    assert run["step_s"] == pytest.approx(step, abs=1e-12)
    assert (compared["before"]["step_s"], compared["before"]["gpus"]) == (pytest.approx(step, abs=1e-12), 2)
    assert (cost["cost"]["gpus"], row["gpus"], run["gpu_count"]) == (2, 2, 2)


@pytest.mark.parametrize("trace", [DATA / "h200_dataloader__after.pt.trace.json.gz",
                                   DATA / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"],
                         ids=lambda p: p.name.split("__")[0])
def test_the_fixes_start_from_the_steady_utilization_the_run_line_prints(trace: Path) -> None:
    """Where steps are left out the window's utilization and the steady steps' differ; the fixes' ``utilization
    before`` is the steady one, computed here from the steady steps, and the run line prints both, named."""
    from gpuidle import api
    from gpuidle.report.common import RenderOptions
    from gpuidle.report.terminal import TerminalRenderer

    report = api.analyze([trace])
    (rank,) = report.ranks
    steady = [s for s in rank.steps if s.excluded is None]
    expected = sum(s.busy_s for s in steady) / sum(s.dur_s - s.idle_by_cause_s["straggler_wait"] for s in steady)
    befores = [r.gain.utilization_before for r in report.recommendations if r.gain.utilization_before is not None]
    assert befores
    assert befores == [pytest.approx(expected, abs=1e-12)] * len(befores)
    assert pct(expected) != pct(report.utilization())
    run = next(line for line in TerminalRenderer().render(report, RenderOptions(width=300)).splitlines()
               if line.startswith("run:"))
    assert run.endswith(f"utilization {pct(report.utilization())} ({pct(expected)} over the steady steps)")
