"""``gpuidle analyze`` of one job's ranks on a Dask cluster against the local process pool.

A small real rank trace is scaled (``--scale`` copies of its steps) and written once per rank,
``distributedInfo.rank`` = 0..N-1. A ``distributed.LocalCluster`` of 1, then 2 single-thread process
workers runs in this process; each analysis is a fresh client process (``--scheduler``) or a fresh
local run (``--workers``), so its peak RSS is its own. Printed:

- throughput: ranks per second per worker core, Dask against the local pool with as many cores
  (best of ``--repeat``, local and Dask runs interleaved, after one warm-up run that imports gpuidle in
  the workers); the client's import of distributed and a first connection to the scheduler are timed
  apart, before the analysis (which connects again);
- client peak RSS (``VmHWM``) as the ranks grow: flat when only per-rank summaries move;
- bytes moved to the client per rank: the pickled result of the per-rank function (what a Dask task
  returns), against the rank file's size on disk and decompressed.

Results also go to ``bench/out/cluster_scaling.json``.

    python bench/cluster_scaling.py                      # 64 ranks; RSS at 8, 16, 32, 64
    python bench/cluster_scaling.py --ranks 64 --scale 2 --repeat 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchlib import REPO, machine, mib, write_json
from scale_trace import load, scale_trace

SOURCE = REPO / "tests" / "data" / "trace_filter__sampled_rank-0.json.gz"

CHILD = """
import json, resource, sys, time
from gpuidle import api
folder, scheduler, workers = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
connect = 0.0
if scheduler:
    t0 = time.perf_counter()
    from distributed import Client
    Client(scheduler, set_as_default=False).close()
    connect = time.perf_counter() - t0
t0 = time.perf_counter()
report = api.analyze([folder], workers=workers, scheduler=scheduler)
wall = time.perf_counter() - t0
hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"wall_s": wall, "connect_s": connect, "ranks": len(report.ranks), "client_peak_rss": hwm}))
"""


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=SOURCE, help="the real rank trace to copy")
    p.add_argument("--ranks", type=int, default=64, help="ranks of the job")
    p.add_argument("--rss-ranks", default="8,16,32,64", help="job sizes for the client's peak RSS")
    p.add_argument("--scale", type=float, default=2.0, help="copies of the source's steps per rank")
    p.add_argument("--repeat", type=int, default=2, help="runs per setting (best kept)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench"), help="where traces are written")
    p.add_argument("--keep", action="store_true", help="keep the generated folder (and reuse it)")
    return p.parse_args(argv)


def _job(args: argparse.Namespace) -> Path:
    folder = args.workdir / f"cluster_{args.ranks}ranks_x{args.scale:g}"
    if not (args.keep and (folder / "DONE").exists()):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        source = load(args.source)
        for r in range(args.ranks):
            scale_trace(args.source, folder / f"rank{r:03d}.json.gz", args.scale, rank=r, world_size=args.ranks,
                        source=source)
        (folder / "DONE").write_text("")
    return folder


def _subset(folder: Path, n: int) -> Path:
    """The first ``n`` ranks of the job, as links in a folder of their own."""
    sub = folder.parent / f"{folder.name}_first{n}"
    shutil.rmtree(sub, ignore_errors=True)
    sub.mkdir()
    for f in sorted(folder.glob("rank*.json.gz"))[:n]:
        (sub / f.name).symlink_to(f)
    return sub


def _client(folder: Path, scheduler: str | None, workers: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), scheduler or "", str(workers)],
                          capture_output=True, text=True, check=True, cwd=REPO)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = min(runs, key=lambda r: r["wall_s"])
    return {**best, "client_peak_rss": max(r["client_peak_rss"] for r in runs)}


def _bytes_per_rank(folder: Path) -> dict[str, float]:
    from gpuidle.jobs.rank import analyze_file

    files = sorted(folder.glob("rank*.json.gz"))[:4]
    sent = [len(pickle.dumps(analyze_file(str(f)), protocol=5)) for f in files]
    return {"result_bytes": sum(sent) / len(sent), "file_bytes": sum(f.stat().st_size for f in files) / len(files),
            "json_bytes": sum(len(gzip.decompress(f.read_bytes())) for f in files) / len(files)}


def main(argv: list[str] | None = None) -> int:
    import distributed

    args = _args(argv)
    folder = _job(args)
    n = args.ranks
    print(f"{n} ranks of {args.source.name} x{args.scale:g} in {folder}", flush=True)
    out: dict[str, Any] = {"machine": machine(), "ranks": n, "scale": args.scale, "throughput": {}, "rss": {}}
    for cores in (1, 2):
        with distributed.LocalCluster(n_workers=cores, threads_per_worker=1, processes=True,
                                      dashboard_address=":0") as cluster:
            address = cluster.scheduler_address
            _client(folder, address, cores)  # warm-up: the workers import gpuidle
            runs = [(_client(folder, None, cores), _client(folder, address, cores)) for _ in range(args.repeat)]
            local = _best([a for a, _ in runs])
            remote = _best([b for _, b in runs])
            if cores == 2:
                for k in (int(x) for x in args.rss_ranks.split(",")):
                    sub = folder if k == n else _subset(folder, k)
                    out["rss"][k] = {"dask": _client(sub, address, cores)["client_peak_rss"],
                                     "local": _client(sub, None, cores)["client_peak_rss"]}
        out["throughput"][cores] = {"local": local, "dask": remote}
        print(f"{cores} worker core(s): local pool {n / local['wall_s'] / cores:6.2f} ranks/s/core "
              f"({local['wall_s']:.2f} s)   dask {n / remote['wall_s'] / cores:6.2f} ranks/s/core "
              f"({remote['wall_s']:.2f} s; import + connect before it {remote['connect_s']:.2f} s)   "
              f"dask/local {local['wall_s'] / remote['wall_s']:.2f}x", flush=True)
    print("client peak RSS (2 workers):")
    for k, rss in out["rss"].items():
        print(f"  {k:>4} ranks: dask client {mib(rss['dask']):>6} MiB   local parent {mib(rss['local']):>6} MiB")
    moved = _bytes_per_rank(folder)
    out["bytes_per_rank"] = moved
    print(f"bytes to the client per rank: {moved['result_bytes'] / 1024:.1f} KiB, against "
          f"{moved['file_bytes'] / 1024:.1f} KiB on disk ({moved['file_bytes'] / moved['result_bytes']:.1f}x) and "
          f"{moved['json_bytes'] / 1024:.1f} KiB of JSON ({moved['json_bytes'] / moved['result_bytes']:.1f}x)")
    print(f"results: {write_json('cluster_scaling.json', out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
