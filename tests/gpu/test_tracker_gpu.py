"""The step tracker on a real CUDA device; skipped without one.

    python -m pytest tests/gpu/test_tracker_gpu.py -q

Checks that phases are timed with CUDA events and read lazily (no synchronize per step),
that device times agree with a synchronized measurement, that NVTX ranges and a profiled
window work, and, under torchrun with NCCL, the DDP job view (two ranks need two GPUs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

from gpuidle.api import analyze  # noqa: E402
from gpuidle.live.tracker import CudaClock, StepTracker  # noqa: E402
from gpuidle.model import TRACKER_SUMMARY, AnalysisReport  # noqa: E402


def _train(tracker: StepTracker, steps: int, size: int = 2048, sync: bool = False) -> None:
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.ReLU(), torch.nn.Linear(size, size)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [torch.randn(256, size).pin_memory() for _ in range(4)]
    for x in tracker.loader(batches[k % 4] for k in range(steps)):
        with tracker.phase("h2d"):
            x = x.to(dev, non_blocking=True)
        with tracker.phase("forward"):
            loss = model(x).square().mean()
        with tracker.phase("backward"):
            loss.backward()
        with tracker.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
            if sync:
                loss.item()
        tracker.step()


def test_phases_are_timed_on_the_device_without_a_synchronize_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    syncs: list[int] = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (syncs.append(1), real(*a, **k))[1])
    tracker = StepTracker(tmp_path, log=lambda _: None, nvtx=True)
    assert tracker.timing == "device"
    assert isinstance(tracker._dev, CudaClock)
    _train(tracker, 60, sync=True)  # .item() every step: the device is never more than a step behind
    assert tracker.forced_waits == 0
    assert syncs == []
    report = tracker.close()
    assert report is not None
    (rank,) = report.ranks
    d = rank.primary()
    assert d.name == torch.cuda.get_device_name()
    assert 0 < d.utilization <= 1
    assert sum(d.idle_by_cause_s.values()) == pytest.approx(d.idle_s, abs=1e-9)
    assert not any("device timing unavailable" in n for n in rank.notes)


def test_device_time_agrees_with_a_synchronized_measurement(tmp_path: Path) -> None:
    size = 4096
    a = torch.randn(size, size, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ a
    end.record()
    end.synchronize()
    reference_ms = start.elapsed_time(end) / 10
    tracker = StepTracker(tmp_path, log=lambda _: None, phases=["forward"], compute_phases=["forward"])
    for _ in range(20):
        with tracker.phase("forward"):
            a @ a
        tracker.step()
    tracker.close()
    rows = [json.loads(x) for x in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    device_ms = sorted(r["device_phases"]["forward"] / 1e6 for r in rows if r["type"] == "step")[10]
    assert device_ms == pytest.approx(reference_ms, rel=0.25)


def test_a_device_far_ahead_is_waited_for_only_past_the_lag(tmp_path: Path) -> None:
    tracker = StepTracker(tmp_path, log=lambda _: None, resolve_lag=2)
    _train(tracker, 30, size=4096)  # no sync: the host runs ahead until the queue fills
    tracker.close()
    steps = [r for r in (tmp_path / "rank-0.jsonl").read_text().splitlines() if '"type":"step"' in r]
    assert len(steps) == 30


def test_profiled_window_is_a_gpu_trace_gpuidle_reads(tmp_path: Path) -> None:
    tracker = StepTracker(tmp_path, log=lambda _: None)
    where = tracker.profile(range(5, 8))
    _train(tracker, 10, size=1024)
    tracker.close()
    report = analyze([where])
    assert report.source.format == "kineto"
    assert [s.step for s in report.ranks[0].steps] == [5, 6, 7]


def test_ddp_with_nccl_under_torchrun(tmp_path: Path) -> None:
    n = min(2, torch.cuda.device_count())
    args = ["--device-ms", "0", "--batch", "512", "--width", "2048", "--dim", "1024", "--steps", "60"]
    if n == 2:
        args += ["--straggler-rank", "1", "--straggler-ms", "20"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "gpuidle.live.workload", "--out", str(tmp_path), *args]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = AnalysisReport.from_json((tmp_path / TRACKER_SUMMARY).read_bytes())
    assert all(r.communication.collectives for r in report.ranks)
    assert all(not any("device timing unavailable" in x for x in r.notes) for r in report.ranks)
    if n == 2:
        assert report.job is not None
        assert [s.rank for s in report.job.stragglers] == [1]
        assert report.recommendations[0].id == "straggler_rank_1"


def test_the_timed_all_reduce_averages_inside_nccl() -> None:
    """With no hook of the user's, the tracker times DDP's all-reduce with NCCL's AVG (no division pass of its
    own): the gradients are those of DDP without the tracker, and every bucket is timed (one rank a GPU)."""
    from ddp_grads import launch

    result = launch(min(2, torch.cuda.device_count()))
    assert result["averaged_in_nccl"] == [True]
    assert result["max_diff"] <= 1e-6
    assert result["steps"] == 3
    assert all(n >= 1 for n in result["buckets"])
    assert all(ns > 0 for ns in result["comm_ns"])
