"""A before/after pair of real GPU traces where only the data loading changed; skipped without CUDA.

    python -m pytest tests/gpu/test_after_states_gpu.py -q

The workload of ``gpuidle.live.workload`` (one rank, NCCL, real GPU compute) is profiled twice: with
slow batches, then without. The step the first trace's data fix predicts must match the step measured
in the second trace within 10 %, and the tracker's own gain must agree with the trace's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

from gpuidle.analysis.steps import counted  # noqa: E402
from gpuidle.api import analyze  # noqa: E402
from gpuidle.model import AnalysisReport  # noqa: E402

HANG_GUARD_S = 600
"""Not a performance bound: only so that a rendezvous that never completes fails the test."""
ITEM_DELAY_MS = 0.05
"""Per sample, 256 samples per batch: 12.8 ms of data wait per step."""


def _profiled(out: Path, *args: str) -> tuple[AnalysisReport, AnalysisReport]:
    """The job's profiled trace and its tracker report."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           "-m", "gpuidle.live.workload", "--out", str(out), "--steps", "24", "--device-ms", "0",
           "--dim", "2048", "--width", "4096", "--batch", "256", "--profile", "12:16", *args]
    proc = subprocess.run(cmd, env={**os.environ}, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (trace,) = (out / "profile").glob("rank0.*.pt.trace.json.gz")
    keep = os.environ.get("GPUIDLE_KEEP_TRACES")
    if keep:  # the pair, kept to be read back on machines without a GPU
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(trace, Path(keep) / f"{out.name}.pt.trace.json.gz")
    return analyze(trace), analyze(out)


def _step(report: AnalysisReport) -> float:
    steps = counted(report.ranks[0].steps)
    return sum(s.dur_s for s in steps) / len(steps)


def test_the_data_fix_predicts_the_trace_without_slow_batches(tmp_path: Path) -> None:
    before, tracked = _profiled(tmp_path / "before", "--item-delay-ms", str(ITEM_DELAY_MS))
    after, _ = _profiled(tmp_path / "after")
    fix = next(r for r in before.recommendations if r.id == "dataloader_workers")
    g = fix.gain
    assert g.basis == "measured"
    assert g.step_s_after is not None
    measured = _step(after)
    assert abs(g.step_s_after - measured) <= 0.10 * measured, (g.step_s_after, measured)
    # the tracker, timing every step on the device, sees the same data wait
    tracker_fix = next(r for r in tracked.recommendations if r.id == "dataloader_workers")
    assert tracker_fix.gain.step_s_saved == pytest.approx(g.step_s_saved, rel=0.25)
