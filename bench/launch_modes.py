"""``bench allreduce`` standalone (``--nproc 2``) against the same under torchrun, side by side.

Both launch modes should measure the same thing: this runs them alternately, ``--repeat``
times each, on gloo over the CPU, and prints per operation and size the median busbw of
each mode and their ratio (standalone / torchrun), then the small-message latency.
``--src`` measures another checkout's ``src`` (e.g. ``/work/main/src``, before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ARGS = ["bench", "allreduce", "--device", "cpu", "--json", "--no-ledger", "--no-progress"]


def measure(mode: str, src: Path, extra: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # as a user's shell has it
    env["PYTHONPATH"] = str(src)
    if mode == "standalone":
        cmd = [sys.executable, "-m", "gpuidle", *ARGS, "--nproc", "2", *extra]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "gpuidle", *ARGS, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed: {proc.stderr.strip().splitlines()[-1:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each mode, alternately (default 3)")
    ap.add_argument("--ops", default="broadcast,all_reduce")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="16M")
    ap.add_argument("--src", type=Path, default=REPO / "src", help="the src folder to measure")
    a = ap.parse_args()
    extra = ["--ops", a.ops, "--min-bytes", a.min_bytes, "--max-bytes", a.max_bytes]
    busbw: dict[tuple[str, str, int], list[float]] = {}
    latency: dict[tuple[str, str], list[float]] = {}
    for i in range(a.repeat):
        for mode in (("standalone", "torchrun") if i % 2 == 0 else ("torchrun", "standalone")):
            r = measure(mode, a.src, extra)
            for row in r["rows"]:
                if row.get("busbw_gbps") is not None:
                    busbw.setdefault((row["op"], mode, row["bytes"]), []).append(row["busbw_gbps"])
            for s in r["summaries"]:
                if s.get("latency_us") is not None:
                    latency.setdefault((s["op"], mode), []).append(s["latency_us"])
    print(f"src {a.src}, {a.repeat} runs of each mode, median over runs")
    print(f"{'op':<11} {'size':>9} {'standalone':>11} {'torchrun':>9} {'ratio':>6}   (busbw GB/s)")
    for op, size in sorted({(k[0], k[2]) for k in busbw}):
        s, t = busbw.get((op, "standalone", size)), busbw.get((op, "torchrun", size))
        if s and t:
            ms, mt = statistics.median(s), statistics.median(t)
            print(f"{op:<11} {size:>9} {ms:>11.3f} {mt:>9.3f} {ms / mt:>6.2f}")
    for op in sorted({k[0] for k in latency}):
        s, t = latency.get((op, "standalone")), latency.get((op, "torchrun"))
        if s and t:
            ms, mt = statistics.median(s), statistics.median(t)
            print(f"{op:<11} latency   {ms:>9.1f} µs {mt:>7.1f} µs {ms / mt:>5.2f}   runs: {s} / {t}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
