"""Real NVML on a machine with an NVIDIA GPU; skipped elsewhere.

    python -m pytest tests/gpu -q

Checks that every query answers a value of the right kind or an explicit N/A, that the
sampler keeps its interval with the real driver, and that ``gpuidle run`` finds the GPU a
CUDA workload uses (when torch with CUDA is installed).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from gpuidle.cli import main
from gpuidle.live import nvml
from gpuidle.live.host import PsutilHost
from gpuidle.live.monitor import JsonlWriter, Monitor
from gpuidle.model import MonitorSample
from gpuidle.sources import smi


def _nvml_ok() -> bool:
    try:
        nvml.init()
    except nvml.NvmlUnavailable:
        return False
    return True


pytestmark = pytest.mark.skipif(not _nvml_ok(), reason="no NVIDIA driver or GPU (NVML unavailable)")


def _in(v: float | None, lo: float, hi: float) -> bool:
    return v is None or lo <= v <= hi


def test_backend_reads_every_device() -> None:
    b = nvml.NvmlBackend()
    infos = b.open()
    assert infos
    assert all(g.name and g.uuid and (g.mem_total_mib or 0) > 0 for g in infos)
    first = b.sample(0.0)
    second = b.sample(1.0)
    assert [g.index for g in second] == [g.index for g in infos]
    for g in second:
        assert g.util_pct is not None, "utilization.gpu should be readable outside MIG mode"
        assert _in(g.util_pct, 0, 100)
        assert _in(g.mem_util_pct, 0, 100)
        assert g.mem_used_mib is not None
        assert 0 <= g.mem_used_mib <= (g.mem_total_mib or 0)
        assert _in(g.power_w, 0, 2000)
        assert _in(g.power_limit_w, 1, 2000)
        assert _in(g.temp_c, 0, 120)
        assert _in(g.sm_clock_mhz, 0, 5000)
        assert _in(g.mem_clock_mhz, 0, 20000)
        assert g.throttle_reasons is None or g.throttle_reasons >= 0
        assert g.pids is None or all(p > 0 for p in g.pids)
        for rate in (g.pcie_rx_mib_s, g.pcie_tx_mib_s, g.nvlink_rx_mib_s, g.nvlink_tx_mib_s):
            assert rate is None or rate >= 0
    assert all(g.pcie_rx_mib_s is None or g.pcie_rx_mib_s >= 0 for g in first)
    b.close()


def test_monitor_keeps_its_interval(tmp_path: Path) -> None:
    m = Monitor(nvml.NvmlBackend(), PsutilHost(None), interval_s=0.1)
    path = tmp_path / "gpu.jsonl"
    writer = JsonlWriter(path)
    writer.header(m.open())
    got: list[MonitorSample] = []
    stop = threading.Event()
    m.run([writer, got.append], stop, max_samples=20)
    writer.close()
    m.stop()
    assert len(got) == 20
    steps = [b.t - a.t for a, b in itertools.pairwise(got)]
    assert sum(steps) / len(steps) == pytest.approx(0.1, rel=0.2)
    s = smi.read(path)
    assert s.devices
    assert all(len(d) == 20 for d in s.devices)


def test_monitor_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--count", "5", "--interval", "0.1", "--json", "--quiet", "--no-dcgm"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpu_unavailable"] is None
    assert report["devices"]


def test_run_finds_the_gpu_a_cuda_job_uses(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    code = textwrap.dedent("""
        import time, torch
        x = torch.randn(4096, 4096, device="cuda:0")
        end = time.time() + 4
        while time.time() < end:
            for _ in range(20):
                x = torch.tanh(x @ x)
            torch.cuda.synchronize()
    """)
    summary = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "run", "--quiet", "--interval", "0.2", "--no-dcgm",
                           "--out", str(tmp_path / "run.jsonl"), "--summary", str(summary), "--json",
                           "--", sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(summary.read_text())
    end = json.loads((tmp_path / "run.jsonl").read_text().splitlines()[-1])
    # the job's pid is seen on the device, unless NVML lists pids of another namespace (containers)
    if end.get("devices"):
        assert 0 in end["devices"]
        assert [d["device"] for d in report["devices"]] == end["devices"]
    busy = [d for d in report["devices"] if d["device"] == 0]
    assert busy
    assert busy[0]["mean_util_pct"] > 30
