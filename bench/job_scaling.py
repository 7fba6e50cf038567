"""``gpuidle analyze`` on a folder of N ranks: wall time per worker count, parent memory.

A real rank trace is scaled (``--scale`` copies of its steps) and written once per
rank, ``distributedInfo.rank`` = 0..N-1 and ``world_size`` = N. Each folder is then
analysed with ``--workers 1``, ``--workers 2``, ... in a fresh process per run.

Printed per run: wall time; CPU time of the parent and its workers together
(``cpu/wall`` is the parallelism actually obtained: on a shared machine, other jobs
take cores away); the parent's peak RSS (``VmHWM`` of the ``gpuidle`` process itself,
which holds only the per-rank results); the largest worker's peak RSS (``ru_maxrss``
of the finished pool processes, forked from the parent); and the peak RSS summed over
the whole process tree (sampled; shared pages count once per process).
Results also go to ``bench/out/job_scaling.json``.

    python bench/job_scaling.py                         # N = 1, 8, 32; workers 1 and 2
    python bench/job_scaling.py --ranks 4,16 --workers 1,2,4 --scale 2
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import DEFAULT_SOURCE, REPO, Run, machine, mib, run_child, snapshot, write_json
from scale_trace import load, scale_trace


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real rank trace to copy")
    p.add_argument("--ranks", default="1,8,32", help="job sizes N, comma-separated")
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    p.add_argument("--scale", type=float, default=1.0, help="copies of the source's steps per rank")
    p.add_argument("--repeat", type=int, default=1, help="runs per job size and worker count (best kept)")
    p.add_argument("--commit", help="measure gpuidle as of this commit, not the working tree")
    p.add_argument("--timeout", type=float, default=1800, help="kill a run after this many s")
    p.add_argument("--mem-limit-gib", type=float, default=16, help="kill a run above this RSS (whole tree)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench"), help="where traces are written")
    p.add_argument("--keep", action="store_true", help="keep the generated folders (and reuse them)")
    p.add_argument("--out", default="job_scaling.json", help="results file name under bench/out/")
    return p.parse_args(argv)


def _job(args: argparse.Namespace, n: int, source: dict[str, Any]) -> dict[str, Any]:
    folder = args.workdir / f"job_{n}ranks_x{args.scale:g}"
    done = folder / "DONE"
    if not (args.keep and done.exists()):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        t0 = time.perf_counter()
        for r in range(n):
            res = scale_trace(args.source, folder / f"rank{r}.json.gz", args.scale, rank=r, world_size=n,
                              source=source)
        done.write_text(f"{res.events} {res.bytes}\n", encoding="utf-8")
        print(f"  wrote {n} ranks in {folder}: {time.perf_counter() - t0:.1f} s", flush=True)
    events, size = (int(x) for x in done.read_text(encoding="utf-8").split())
    return {"folder": str(folder), "ranks": n, "events_per_rank": events, "json_bytes_per_rank": size,
            "file_bytes": sum(f.stat().st_size for f in folder.glob("*.json.gz"))}


def _best(runs: list[Run]) -> dict[str, Any]:
    good = [r for r in runs if r.ok]
    if not good:
        return {"ok": False, "error": runs[0].error}
    best = min(good, key=lambda r: r.wall_s)
    c = best.child
    return {"ok": True, "runs": len(good), "wall_s": best.wall_s, "wall_s_all": [r.wall_s for r in good],
            "work_s": best.work_s, "parent_peak_rss": max(r.maxrss for r in good),
            "parent_base_rss": int(c.get("base_rss", 0)),
            "worker_peak_rss": max(int(r.child.get("children_maxrss", 0)) for r in good),
            "tree_peak_rss": max(r.tree_peak_rss for r in good),
            "cpu_s": float(c["cpu_s"]), "children_cpu_s": float(c["children_cpu_s"])}


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    ranks = [int(x) for x in args.ranks.split(",") if x]
    workers = [int(x) for x in args.workers.split(",") if x]
    args.workdir.mkdir(parents=True, exist_ok=True)
    src, commit = snapshot(args.commit, args.workdir) if args.commit else (None, subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    print(f"source {args.source.name} x{args.scale:g} per rank; N = {ranks}; workers {workers}; "
          f"{machine()['cpus']} CPUs; gpuidle {'commit' if src else 'working tree at'} {commit[:12]}", flush=True)
    source = load(args.source)
    results = []
    for n in ranks:
        print(f"[{n} ranks]", flush=True)
        job = _job(args, n, source)
        job["by_workers"] = {}
        for i in range(args.repeat):
            for w in workers:
                run = run_child("gpuidle", [job["folder"], "--workers", str(w)], src=src, timeout_s=args.timeout,
                                mem_limit=int(args.mem_limit_gib * (1 << 30)))
                job["by_workers"].setdefault(w, []).append(run)
                state = (f"{run.wall_s:.2f} s wall, parent {mib(run.maxrss)} MiB, "
                         f"largest worker {mib(int(run.child.get('children_maxrss', 0)))} MiB" if run.ok else run.error)
                print(f"  run {i + 1}/{args.repeat} workers {w}: {state}", flush=True)
        job["by_workers"] = {w: _best(rs) for w, rs in job["by_workers"].items()}
        results.append(job)
        if not args.keep:
            shutil.rmtree(job["folder"], ignore_errors=True)
    print()
    head = (f"{'ranks':>5} {'JSON MiB':>9} {'events':>11} {'workers':>7} | {'wall s':>7} {'speedup':>7} "
            f"{'s/rank':>7} {'cpu s':>7} {'cpu/wall':>8} | {'parent MiB':>10} {'parent-base':>11} "
            f"{'worker MiB':>10} {'tree MiB':>9}")
    print(head)
    print("-" * len(head))
    for job in results:
        n = job["ranks"]
        base_wall = None
        for w, b in job["by_workers"].items():
            if not b["ok"]:
                print(f"{n:>5} {'':>9} {'':>11} {w:>7} | failed: {b['error']}")
                continue
            base_wall = base_wall or b["wall_s"]
            cpu = b["cpu_s"] + b["children_cpu_s"]
            print(f"{n:>5} {mib(job['json_bytes_per_rank'] * n):>9} {job['events_per_rank'] * n:>11,} {w:>7} | "
                  f"{b['wall_s']:>7.2f} {base_wall / b['wall_s']:>7.2f} {b['wall_s'] / n:>7.3f} "
                  f"{cpu:>7.2f} {cpu / b['wall_s']:>8.2f} | "
                  f"{mib(b['parent_peak_rss']):>10} {mib(b['parent_peak_rss'] - b['parent_base_rss']):>11} "
                  f"{mib(b['worker_peak_rss']):>10} {mib(b['tree_peak_rss']):>9}")
    path = write_json(args.out, {"machine": machine(), "source": str(args.source), "scale": args.scale,
                                 "gpuidle": {"commit": commit, "working_tree": src is None},
                                 "results": [{**j, "by_workers": {str(k): v for k, v in j["by_workers"].items()}}
                                             for j in results]})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
