"""Many jobs in one submit: which folders are jobs, one report per job, each in the ledger, and the fleet table.

The table's figures are recomputed here from each job's own report (the training device of each rank, picked
by hand) and checked against the cost formula of one job (``advice.calc``), which is separate code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.advice import calc
from gpuidle.errors import GpuidleError
from gpuidle.ledger import Ledger
from gpuidle.model import CAUSES, AnalysisReport

PAIR = [DATA / f"trace_filter__sampled_rank-{r}.json.gz" for r in (0, 1)]
ALEXNET = DATA / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"


def gpuidle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuidle", *args], capture_output=True, text=True, timeout=300)


def _fleet(root: Path, broken: bool = True) -> Path:
    """Three job folders (two ranks; one trace; one good and one bad rank) and a folder that is no job."""
    for name, files in {"ddp": PAIR, "alexnet": [ALEXNET], "partial": PAIR[:1]}.items():
        (root / name).mkdir(parents=True)
        for f in files:
            shutil.copy(f, root / name)
    if broken:
        (root / "partial" / "rank1.json").write_text("not json")
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("no traces here")
    return root


def _reference_row(report: AnalysisReport, hours: float) -> tuple[int, dict[str, float]]:
    """GPUs and GPU-hours idle per cause, from the report's own devices, picked here."""
    gpus = sum(max(sum(d.busy_s > 0 for d in r.devices), 1) for r in report.ranks)  # with work in the window
    shares = {c.value: 0.0 for c in CAUSES}
    for r in report.ranks:
        device = sorted(r.devices, key=lambda d: (-d.busy_s, d.device))[0]
        for c in shares:
            shares[c] += device.idle_by_cause_s[c] / device.window_s / len(report.ranks)
    return gpus, {c: gpus * hours * s for c, s in shares.items()}


def test_fleet_table_reports_and_ledger(tmp_path: Path, private_ledger: Path) -> None:
    root = _fleet(tmp_path / "jobs")
    out = tmp_path / "reports"
    proc = gpuidle("analyze", str(root), "--json", "--out-dir", str(out), "--price-per-gpu-hour", "2.5",
                   "--hours", "3")
    assert proc.returncode == 1, proc.stderr  # the partial job left a file out, and says so
    fleet = json.loads(proc.stdout)
    assert [j["name"] for j in fleet["jobs"]] == ["alexnet", "ddp", "partial"]  # "notes" holds no traces
    assert fleet["failed_jobs"] == 0
    (partial,) = (j for j in fleet["jobs"] if j["name"] == "partial")
    assert len(partial["skipped"]) == 1
    assert "rank1.json" in partial["skipped"][0]
    totals = {c.value: 0.0 for c in CAUSES}
    with Ledger.for_reading(private_ledger) as book:
        runs = {r.label: r for r in book.runs()}
    for row in fleet["jobs"]:
        report = AnalysisReport.from_json((out / f"{row['name']}.json").read_text())
        assert row["report"] == str(out / f"{row['name']}.json")
        gpus, by_cause = _reference_row(report, 3.0)
        assert row["gpus"] == gpus
        assert row["idle_gpu_hours_by_cause"] == pytest.approx(by_cause, rel=1e-9, abs=1e-12)
        wasted = calc.cost_from_report(report, 2.5, 3.0).wasted_gpu_hours
        assert row["idle_gpu_hours"] == pytest.approx(wasted, rel=1e-9)  # the causes add up to the waste
        assert row["top_fix"] == report.recommendations[0].title
        assert runs[row["name"]].id == row["run_id"]  # recorded, labelled by the job's name
        assert runs[row["name"]].analysis().to_json() == report.to_json()
        for c in totals:
            totals[c] += by_cause[c]
    assert fleet["idle_gpu_hours_by_cause"] == pytest.approx(totals, rel=1e-9, abs=1e-12)
    assert fleet["cost_by_cause"] == pytest.approx({c: 2.5 * h for c, h in totals.items()}, rel=1e-9, abs=1e-12)
    assert fleet["cost"] == pytest.approx(2.5 * sum(totals.values()), rel=1e-9)


def test_the_text_table_names_every_job_and_the_fleet(tmp_path: Path) -> None:
    root = _fleet(tmp_path / "jobs", broken=False)
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(root), "--no-ledger", "--price", "4"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["job", "GPUs", "util", "idle"]
    assert [ln.split()[0] for ln in lines[1:6]] == ["alexnet", "ddp", "partial", "fleet", "cost"]
    fleet = api.fleet_report(api.analyze_jobs([root]).results, [str(root)], 1.0, 4.0)
    assert lines[4].split()[1:3] == [str(fleet.gpus), f"{fleet.idle_gpu_hours:.2f}"]
    assert lines[5].split()[1] == f"{fleet.cost:.2f}"


def test_a_job_with_no_readable_rank_is_its_own_error(tmp_path: Path) -> None:
    root = _fleet(tmp_path / "jobs", broken=False)
    (root / "dead").mkdir()
    (root / "dead" / "rank0.json").write_text("[1, 2")
    proc = gpuidle("analyze", str(root), "--json", "--no-ledger")
    assert proc.returncode == 1
    fleet = json.loads(proc.stdout)
    (dead,) = (j for j in fleet["jobs"] if j["name"] == "dead")
    assert "rank0.json" in dead["error"]
    assert "\n" not in dead["error"]
    assert fleet["failed_jobs"] == 1
    assert {j["name"] for j in fleet["jobs"] if j["error"] is None} == {"alexnet", "ddp", "partial"}
    assert "dead: not analysed" in proc.stderr


def test_a_folder_with_traces_is_one_job_even_with_subfolders(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    for f in PAIR:
        shutil.copy(f, job)
    _fleet(job / "old")  # folders of other jobs below a job's traces are not read
    jobs = api.analyze_jobs([job])
    assert not jobs.fleet
    (only,) = jobs.results
    assert only.report is not None
    assert [r.rank for r in only.report.ranks] == [0, 1]


@pytest.mark.parametrize(("case", "needle"), [
    ("empty", "no trace files"),
    ("mixed", "not both"),
    ("out-dir inside", "inside the input"),
    ("html", "take one job"),
    ("out-dir one job", "--out-dir is for a folder of jobs"),
])
def test_refused_in_one_line(tmp_path: Path, case: str, needle: str) -> None:
    root = _fleet(tmp_path / "jobs", broken=False)
    args = {
        "empty": [str(root / "notes")],
        "mixed": [str(root), str(PAIR[0])],
        "out-dir inside": [str(root), "--out-dir", str(root / "reports")],
        "html": [str(root), "--html", str(tmp_path / "r.html")],
        "out-dir one job": [str(root / "ddp"), "--out-dir", str(tmp_path / "r")],
    }[case]
    proc = gpuidle("analyze", "--no-ledger", *args)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpuidle: error:")
    assert needle in line
    assert not (root / "reports").exists()


def test_analyze_refuses_a_folder_of_jobs(tmp_path: Path) -> None:
    root = _fleet(tmp_path / "jobs", broken=False)
    with pytest.raises(GpuidleError, match="folder of jobs"):
        api.analyze([root])


def test_a_fleet_table_wider_than_the_terminal_is_laid_out_to_fit(tmp_path: Path) -> None:
    """At 80 columns no line is longer; each job keeps its utilization, idle GPU-hours and largest cause, and the
    last line says how wide the full table is."""
    root = _fleet(tmp_path / "jobs")
    wide = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(root), "--no-ledger"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "400"}).stdout
    narrow = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(root), "--no-ledger"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"}).stdout
    full = max(len(line) for line in wide.splitlines())
    assert full > 80
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert narrow.splitlines()[-1] == f"(every cause of every job: a terminal {full} columns wide, or --json)"
    for line in wide.splitlines()[1:]:
        if line.startswith(("alexnet", "ddp")):
            job, _gpus, util, idle = line.split()[:4]
            assert any(x.split()[:4][0] == job and x.split()[2:4] == [util, idle] for x in narrow.splitlines())


def test_a_cut_says_so_and_one_job_is_one_job() -> None:
    """In the compact table a line cut to the width ends with an ellipsis (a cut never reads as the whole), and the
    note counts in the singular where there is one."""
    from gpuidle.advice.fleet import fleet_report
    from gpuidle.model import FleetJob
    from gpuidle.report.fleet import render_fleet

    fix = "Load batches in parallel: more DataLoader workers, pinned memory, prefetching"
    job = FleetJob(name="ddp", path="/jobs/ddp", gpus=8, utilization=0.5, idle_gpu_hours=4.0,
                   idle_gpu_hours_by_cause={c.value: 4.0 if c.value == "data_loading" else 0.0 for c in CAUSES},
                   top_fix=fix)
    broken = FleetJob(name="bad", path="/jobs/bad", error="no GPU activity in any trace of this folder, none at all")
    text = render_fleet(fleet_report(["/jobs"], [job, broken]), width=60)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 60
    top = next(line for line in lines if "top fix:" in line)
    error = next(line for line in lines if "error:" in line)
    assert top.endswith("…")
    assert fix.startswith(top.split("top fix: ")[1][:-1])
    assert error.endswith("…")
    assert "2 jobs;" in text
    assert "; 1 job without a report" in text
    one = render_fleet(fleet_report(["/jobs"], [job]), width=200)
    assert "1 job;" in one
    assert "jobs" not in one.replace("/jobs", "")
