"""Predictions against after-states: 2-rank gloo DDP jobs with injected causes, rerun with them removed.

Each job is the workload of ``gpuidle.live.workload`` (simulated device time, a real DataLoader and real
all-reduces) under ``torchrun``. The tool's predicted step after its recommended fixes must match the
step measured when the job is rerun without the causes it names (within 15 %: two ranks share two
cores with whatever else runs), with the right ranks and fixes in the right order. A fix hidden behind
the straggler is worth nothing alone and its full value once the straggler is fixed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuidle.analysis.steps import counted
from gpuidle.api import analyze
from gpuidle.model import AnalysisReport, Recommendation

pytest.importorskip("torch.distributed")

TOLERANCE = 0.15
HANG_GUARD_S = 600
"""Not a performance bound: only so that a rendezvous that never completes fails the test."""
STRAGGLER_MS = 60.0
DATA_MS = 30.0
BATCH = 64

DEVICE = ["--device-ms", "30"]
"""A step long enough that the all-reduce's jitter on two shared cores (a few ms) stays well inside the tolerance."""

JOBS = {
    "clean": DEVICE,
    "straggler": [*DEVICE, "--straggler-rank", "0", "--straggler-ms", str(STRAGGLER_MS)],
    "data": [*DEVICE, "--data-rank", "1", "--item-delay-ms", str(DATA_MS / BATCH)],
    "both": [*DEVICE, "--straggler-rank", "0", "--straggler-ms", str(STRAGGLER_MS),
             "--data-rank", "1", "--item-delay-ms", str(DATA_MS / BATCH)],
    "comm": ["--comm-mb", "16", "--device-ms", "4"],
}


def _run(out: Path, args: list[str]) -> AnalysisReport:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "gpuidle.live.workload", "--out", str(out), "--steps", "30", "--every", "10",
           "--log-every", "100", "--batch", str(BATCH), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return analyze(out)  # one path, not a list: the library takes either


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AnalysisReport]:
    root = tmp_path_factory.mktemp("after-states")
    return {name: _run(root / name, args) for name, args in JOBS.items()}


def measured_step(report: AnalysisReport) -> float:
    """The job's step as measured: the slowest rank's mean steady step (a reference, not the tool's model)."""
    return max(sum(s.dur_s for s in counted(r.steps)) / len(counted(r.steps)) for r in report.ranks)


def heads(report: AnalysisReport) -> list[Recommendation]:
    return [r for r in report.recommendations if r.alternative_to is None and not r.gain.minor]


def within(predicted: float, measured: float) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


def test_straggler_alone(jobs: dict[str, AnalysisReport]) -> None:
    report, after = jobs["straggler"], measured_step(jobs["clean"])
    top = heads(report)[0]
    assert (top.id, top.rank) == ("straggler_rank_0", 0)
    assert top.gain.basis == "measured"
    assert top.evidence["excess_ms"]["compute"] == pytest.approx(STRAGGLER_MS, rel=TOLERANCE)
    assert report.combined is not None
    assert within(report.combined.step_s_after, after), (report.combined.step_s_after, after)


def test_data_on_one_rank(jobs: dict[str, AnalysisReport]) -> None:
    report, after = jobs["data"], measured_step(jobs["clean"])
    top = heads(report)[0]
    assert (top.id, top.rank, top.confidence) == ("dataloader_workers", 1, "high")
    # rank 1 is late because of its data: the straggler finding is the same idle, an alternative
    straggler = next(r for r in report.recommendations if r.id == "straggler_rank_1")
    assert straggler.alternative_to == "dataloader_workers"
    assert report.combined is not None
    assert within(report.combined.step_s_after, after), (report.combined.step_s_after, after)


def test_a_data_fix_hidden_behind_the_straggler_shows_after_it(jobs: dict[str, AnalysisReport]) -> None:
    report = jobs["both"]
    first, second = heads(report)[:2]
    assert (first.id, first.rank) == ("straggler_rank_0", 0)
    assert (second.id, second.rank) == ("dataloader_workers", 1)
    # alone, rank 1's data fix saves nothing: rank 0 sets the pace
    assert second.gain.step_s_saved == pytest.approx(0.0, abs=0.02 * measured_step(report))
    assert second.gain.after == "straggler_rank_0"
    assert second.gain.step_s_saved_after == pytest.approx(DATA_MS * 1e-3, rel=TOLERANCE)
    # after the straggler fix alone the job runs as the data-only job does; after both, as the clean one
    assert first.gain.step_s_after is not None
    assert within(first.gain.step_s_after, measured_step(jobs["data"])), (first.gain.step_s_after,
                                                                          measured_step(jobs["data"]))
    assert report.combined is not None
    assert report.combined.fixes[:2] == ["straggler_rank_0", "dataloader_workers"]
    assert within(report.combined.step_s_after, measured_step(jobs["clean"])), (report.combined.step_s_after,
                                                                                measured_step(jobs["clean"]))


def test_exposed_communication(jobs: dict[str, AnalysisReport]) -> None:
    # the fix is modelled (a range); its after-state cannot be measured on the CPU: gloo reduces on the same
    # two cores the compute runs on, so DDP's bf16 hook saved -2 % to 23 % of the exposed time in three
    # reruns here, for reasons a GPU's NCCL does not share. What is checked: the cause, the fix, its range
    report = jobs["comm"]
    for r in report.ranks:
        d = r.primary()
        assert max(d.idle_by_cause_s, key=lambda c: d.idle_by_cause_s[c]) == "communication"
    # on a busy machine one rank can be measurably slower than the other all run long, and is then named a
    # straggler in its own right (seen in loaded runs, either rank), the communication fix then its alternative on
    # the same idle; else the communication fix leads
    seen = [(r.id, r.alternative_to, r.gain.step_s_saved) for r in report.recommendations]
    top = next(r for r in report.recommendations if r.id == "comm_compression")
    others = [r for r in heads(report) if not r.id.startswith("straggler_rank_")]
    assert (others and others[0] is top) or (top.alternative_to or "").startswith("straggler_rank_"), seen
    g = top.gain
    assert g.basis == "modelled"
    assert g.assumption is not None
    assert "halves the bytes" in g.assumption
    assert g.step_s_saved_low is not None
    assert g.step_s_saved_high is not None
    assert 0 < g.step_s_saved_low < g.step_s_saved < g.step_s_saved_high
    # at most half of the exposed communication of the rank that sets the pace: the bytes halved
    exposed = max(sum(s.idle_by_cause_s["communication"] for s in counted(r.steps)) / len(counted(r.steps))
                  for r in report.ranks)
    assert g.step_s_saved_high <= exposed / 2 + 1e-9


def test_every_gain_is_a_range_around_its_nominal(jobs: dict[str, AnalysisReport]) -> None:
    for report in jobs.values():
        for rec in report.recommendations:
            g = rec.gain
            if g.step_s_saved is None:
                continue
            assert g.step_s_saved_low is not None
            assert g.step_s_saved_high is not None
            assert g.step_s_saved_low <= g.step_s_saved <= g.step_s_saved_high
            if g.basis == "measured":
                assert g.step_s_saved_low == g.step_s_saved == g.step_s_saved_high
            else:
                assert g.assumption
