"""CPU cost of sampling: ``gpuidle monitor`` at 10 Hz for 60 s, as a share of one core (target: at most 1 %).

    python bench/monitor_overhead.py                      # NVML when it works, else 8 synthetic GPUs
    python bench/monitor_overhead.py --seconds 20 --gpus 2 --backend synthetic

The sampler runs as in ``gpuidle run``: a background thread, the real psutil host probe
following a process tree (a small child process, as the wrapped command), the JSONL log,
and the exporter's latest-value sink. CPU time is the process's user + system time
(``getrusage``, all threads), which other jobs on a shared machine disturb far less than
wall time; the main thread only sleeps. Without NVML the synthetic backend measures
gpuidle's own share (building, encoding and writing samples), not the driver's.

A per-component breakdown (µs per call) follows the total; results go to
``bench/out/monitor_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuidle.live.exporter import LatestSample
from gpuidle.live.host import PsutilHost
from gpuidle.live.monitor import JsonlWriter, Monitor
from gpuidle.model import GpuInfo, GpuSample

OUT = Path(__file__).parent / "out"


class SyntheticBackend:
    """``n`` GPUs with every field filled, as NVML would return them (no driver calls)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.k = 0

    def open(self) -> list[GpuInfo]:
        return [GpuInfo(index=i, name="Synthetic GPU", uuid=f"GPU-{i:04d}", mem_total_mib=81920.0)
                for i in range(self.n)]

    def sample(self, t: float) -> list[GpuSample]:
        self.k += 1
        return [GpuSample(index=i, util_pct=float((self.k * 7 + i) % 101), mem_util_pct=40.0,
                          mem_used_mib=30000.0 + i, mem_total_mib=81920.0, sm_clock_mhz=1410.0, mem_clock_mhz=1593.0,
                          power_w=300.0, power_limit_w=400.0, temp_c=60.0, pcie_rx_mib_s=1200.0, pcie_tx_mib_s=300.0,
                          nvlink_rx_mib_s=5000.0, nvlink_tx_mib_s=5000.0, throttle_reasons=0, pids=[1000 + i])
                for i in range(self.n)]

    def close(self) -> None:
        pass


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def backend(kind: str, gpus: int) -> tuple[object, str]:
    if kind in ("auto", "nvml"):
        from gpuidle.live.nvml import NvmlBackend, NvmlUnavailable

        b = NvmlBackend()
        try:
            n = len(b.open())
            return b, f"nvml ({n} GPUs)"
        except NvmlUnavailable as err:
            if kind == "nvml":
                raise SystemExit(f"NVML: {err}") from None
    return SyntheticBackend(gpus), f"synthetic ({gpus} GPUs)"


def per_call(fn: object, n: int = 200) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn(float(i))  # type: ignore[operator]
    return (time.perf_counter() - t) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--gpus", type=int, default=8, help="synthetic GPUs when NVML is not used")
    ap.add_argument("--backend", choices=["auto", "nvml", "synthetic"], default="auto")
    ap.add_argument("--target-pct", type=float, default=1.0)
    args = ap.parse_args()

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gpu, label = backend(args.backend, args.gpus)
    host = PsutilHost(child.pid)
    with tempfile.TemporaryDirectory(prefix="gpuidle-bench-") as tmp:
        mon = Monitor(gpu, host, args.interval)  # type: ignore[arg-type]
        header = mon.open()
        writer = JsonlWriter(os.path.join(tmp, "bench.jsonl"))
        writer.header(header)
        latest = LatestSample(header)
        c0, w0 = cpu_seconds(), time.monotonic()
        mon.start([writer, latest])
        time.sleep(args.seconds)
        mon.stop()
        c1, w1 = cpu_seconds(), time.monotonic()
        writer.close()
        log_bytes = os.path.getsize(os.path.join(tmp, "bench.jsonl"))
        samples = writer.samples

        # where the time goes, one component at a time (µs per call)
        breakdown = {
            "host_light_us": per_call(lambda t: host.sample(t, False)),
            "host_full_us": per_call(lambda t: host.sample(t, True), 50),
            "gpu_sample_us": per_call(gpu.sample),  # type: ignore[attr-defined]
        }
        mon2 = Monitor(gpu, host, args.interval)  # type: ignore[arg-type]
        mon2.open()
        breakdown["monitor_sample_us"] = per_call(lambda t: mon2.sample())
        s = mon2.sample()
        import msgspec

        enc = msgspec.json.Encoder()
        breakdown["encode_us"] = per_call(lambda t: enc.encode(s))
    child.stdin.close()  # type: ignore[union-attr]
    child.wait()

    wall, cpu = w1 - w0, c1 - c0
    share = cpu / wall * 100
    result = {
        "backend": label, "interval_s": args.interval, "wall_s": round(wall, 2), "samples": samples,
        "cpu_s": round(cpu, 3), "cpu_pct_of_one_core": round(share, 3),
        "cpu_us_per_sample": round(cpu / max(samples, 1) * 1e6, 1), "log_bytes_per_s": round(log_bytes / wall),
        "late_ticks": mon.late_ticks, "target_pct": args.target_pct, "ok": share <= args.target_pct,
        "breakdown_us": {k: round(v, 1) for k, v in breakdown.items()},
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "monitor_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{label}: {samples} samples in {wall:.1f} s at {args.interval:g} s -> {cpu:.3f} CPU s = "
          f"{share:.2f} % of one core ({result['cpu_us_per_sample']} µs/sample; target <= {args.target_pct:g} %: "
          f"{'ok' if result['ok'] else 'OVER'})")
    print("breakdown (µs/call): " + ", ".join(f"{k} {v}" for k, v in result["breakdown_us"].items()))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
