"""A big trace read in one process against every core, beside GNU ``gzip -dc`` of the same file.

A real trace is scaled to about ``--target-mib`` MiB of JSON (``scale_trace.py``), or ``--trace`` is
used as it is. In each round, side by side: ``gzip -dc FILE > /dev/null``; ``gpuidle analyze FILE
--json`` in a fresh process with ``GPUIDLE_READ_WORKERS=1`` (the reader in that process) and with the
default (chunks read by one worker per core: threads where the compiled scanner is built, else
processes); with ``--no-scanner`` also both again as installed without a C compiler (msgspec decodes
every chunk), so that the compiled scanner's gain is measured side by side. Printed: the best wall time
of each (the whole process), its ratio to ``gzip -dc``, and the peak RSS of the process tree against the
JSON's size; then, for every core, the CPU time of the main
process and of its worker processes, or of the one process and all its threads, against its wall time.

    python bench/read_workers.py                           # 256 MiB
    python bench/read_workers.py --target-mib 1024 --repeat 2 --no-scanner
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import time
from pathlib import Path

from benchlib import DEFAULT_SOURCE, MIB, Run, machine, run_child
from scale_trace import copy_bytes, load, scale_trace

WORKERS_ENV = "GPUIDLE_READ_WORKERS"
NO_SCANNER_ENV = "GPUIDLE_BENCH_NO_SCANNER"


def _trace(args: argparse.Namespace) -> Path:
    if args.trace is not None:
        return Path(args.trace)
    path = args.workdir / f"workers_{args.target_mib:g}mib.json.gz"
    if not path.exists():
        args.workdir.mkdir(parents=True, exist_ok=True)
        source = load(args.source)
        scale_trace(args.source, path, args.target_mib * MIB / copy_bytes(args.source, source=source),
                    source=source)
    return path


def _json_bytes(path: Path) -> int:
    with gzip.open(path, "rb") as f:
        return sum(len(b) for b in iter(lambda: f.read(16 << 20), b""))


def _gzip_dc(path: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["gzip", "-dc", str(path)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def _gpuidle(path: Path, workers: str | None, scanner: bool = True) -> Run:
    saved = os.environ.pop(WORKERS_ENV, None)
    if workers is not None:
        os.environ[WORKERS_ENV] = workers
    if not scanner:
        os.environ[NO_SCANNER_ENV] = "1"
    try:
        return run_child("gpuidle", [str(path)])
    finally:
        os.environ.pop(WORKERS_ENV, None)
        os.environ.pop(NO_SCANNER_ENV, None)
        if saved is not None:
            os.environ[WORKERS_ENV] = saved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to scale")
    p.add_argument("--target-mib", type=float, default=256, help="MiB of JSON of the scaled trace")
    p.add_argument("--trace", help="a trace to read as it is (no scaling)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench"))
    p.add_argument("--no-scanner", action="store_true", help="also both runs without the compiled scanner")
    args = p.parse_args()
    path = _trace(args)
    size = _json_bytes(path)
    print(f"{machine()}\n{path.name}: {path.stat().st_size / MIB:.1f} MiB gzip, {size / MIB:.0f} MiB JSON, "
          f"{os.cpu_count()} cores")
    best: dict[str, float] = {}
    peak: dict[str, int] = {}
    cpu: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):
        best["gzip -dc"] = min(best.get("gzip -dc", 1e9), _gzip_dc(path))
        arms = [("gpuidle, one process", "1", True), ("gpuidle, every core", None, True)]
        if args.no_scanner:
            arms += [("no scanner, one process", "1", False), ("no scanner, every core", None, False)]
        for name, workers, scanner in arms:
            run = _gpuidle(path, workers, scanner)
            if not run.ok:
                print(f"{name}: {run.error}")
                return 1
            best[name] = min(best.get(name, 1e9), run.wall_s)
            peak[name] = max(peak.get(name, 0), run.tree_peak_rss)
            mine, workers_cpu = float(run.child["work_cpu_s"]), float(run.child["children_cpu_s"])
            if mine < cpu.get(name, (1e9, 0.0))[0]:
                cpu[name] = (mine, workers_cpu)
    floor = best["gzip -dc"]
    for name, wall in best.items():
        rss = f"   peak RSS {peak[name] / MIB:,.0f} MiB = {peak[name] / size:.2f}x the JSON" if name in peak else ""
        print(f"{name:<24} {wall:6.2f} s   {wall / floor:5.2f}x gzip -dc{rss}")
    if args.no_scanner:
        for how in ("one process", "every core"):
            print(f"the scanner's gain, {how}: {best[f'no scanner, {how}'] / best[f'gpuidle, {how}']:.2f}x")
    mine, workers_cpu = cpu["gpuidle, every core"]
    if workers_cpu > 0.1 * mine:  # worker processes (a few ms of children are the ledger's git call)
        print(f"every core: CPU of the process that inflates, cuts, merges and analyses {mine:.2f} s, of its "
              f"workers {workers_cpu:.2f} s (the run with the least of the first); on N cores the work takes no "
              f"less than the larger of {mine:.2f} s and {workers_cpu:.2f} s / N")
    else:
        wall = best["gpuidle, every core"]
        print(f"every core (threads): CPU of the process, all its threads, {mine:.2f} s in {wall:.2f} s of wall "
              f"time: {mine / wall:.2f} cores busy on average")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
