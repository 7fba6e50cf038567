"""Start-up and whole-process speed of ``gpuidle analyze --json`` on a 20-30 MB real trace.

Each round runs, back to back and each in a fresh process:

- ``python``: the interpreter alone (``python -c pass``), the cost nobody avoids;
- ``import``: ``python -c "import gpuidle.cli"``, what every command pays before its work;
- ``floor``: gunzip + ``orjson.loads`` of the trace, the least a JSON reader does;
- ``gpuidle``: ``gpuidle analyze TRACE --json --no-ledger`` (the installed command), the whole job;
- ``hta``: HolisticTraceAnalysis load + temporal + idle-time breakdown, when ``bench/.venv-hta`` exists.

Printed: the median wall time of each over the rounds, and the median of the per-round
ratios gpuidle/floor and hta/gpuidle (tools of one round share the machine's state).

    python bench/startup.py                 # 15 rounds on tests/data's 25.8 MB ResNet50 trace
    python bench/startup.py --rounds 30 --trace other.json.gz
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "negative_queue_length_values_check__rank0.json.gz"
HTA_PY = ROOT / "bench" / ".venv-hta" / "bin" / "python"

FLOOR = "import gzip, sys, orjson; orjson.loads(gzip.open(sys.argv[1], 'rb').read())"
HTA = ("import sys, os\nfrom hta.trace_analysis import TraceAnalysis\n"
       "d = os.path.dirname(os.path.abspath(sys.argv[1]))\n"
       "a = TraceAnalysis(trace_files={0: os.path.basename(sys.argv[1])}, trace_dir=d)\n"
       "a.get_temporal_breakdown(visualize=False)\na.get_idle_time_breakdown(visualize=False)\n")


SCRIPT = Path(sys.executable).with_name("gpuidle")
GPUIDLE = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "gpuidle"]
"""The ``gpuidle`` command as installed beside this interpreter (``python -m gpuidle`` adds runpy's 3 ms)."""


def commands(trace: Path) -> dict[str, list[str]]:
    py = sys.executable
    out = {
        "python": [py, "-c", "pass"],
        "import": [py, "-c", "import gpuidle.cli"],
        "floor": [py, "-c", FLOOR, str(trace)],
        "gpuidle": [*GPUIDLE, "analyze", str(trace), "--json", "--no-ledger"],
    }
    if HTA_PY.exists():
        out["hta"] = [str(HTA_PY), "-c", HTA, str(trace)]
    return out


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    cmds = commands(args.trace)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for cmd in cmds.values():  # warm the page cache and .pyc files
        wall(cmd)
    for _ in range(args.rounds):
        for name, cmd in cmds.items():
            times[name].append(wall(cmd))
    print(f"{args.trace.name}: {args.trace.stat().st_size / 1e6:.1f} MB on disk, {args.rounds} rounds")
    for name, ts in times.items():
        print(f"  {name:8s} median {statistics.median(ts) * 1e3:7.1f} ms   best {min(ts) * 1e3:7.1f} ms")
    ratio = statistics.median(g / f for g, f in zip(times["gpuidle"], times["floor"], strict=True))
    print(f"  gpuidle / floor      {ratio:.2f}x  (target <= 1.0)")
    imports = statistics.median(times["import"]) - statistics.median(times["python"])
    print(f"  import gpuidle.cli - python: {imports * 1e3:.1f} ms  (target < 80)")
    if "hta" in times:
        speedup = statistics.median(h / g for h, g in zip(times["hta"], times["gpuidle"], strict=True))
        print(f"  hta / gpuidle        {speedup:.1f}x  (target >= 10)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
