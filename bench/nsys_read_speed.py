"""Read speed of the Nsight Systems reader beside the Kineto reader: events/s and peak RSS.

Each reader runs alone (``api.read_timelines``: the file into Timelines, no analysis) in a
fresh process per measurement, on the real file and on scaled copies: the Nsight export by
``scale_nsys.py`` (rows duplicated with shifted times), the Kineto trace by
``scale_trace.py``, each Kineto scale chosen to hold about as many events as the Nsight copy
it stands beside. Events are the rows a reader turns into columns (device ops + host events).

    python bench/nsys_read_speed.py                       # scales 1, 10, 100; 3 runs each
    python bench/nsys_read_speed.py --scales 1,50 --repeat 5 --keep
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from benchlib import DEFAULT_SOURCE, REPO, Run, machine, mib, run_child, write_json
from scale_nsys import scale_nsys
from scale_trace import scale_trace

NSYS_SOURCE = REPO / "tests" / "data" / "cloverleaf_a100__perlmutter-cloverleaf-cuda.sqlite"
WORK = Path("/tmp/gpuidle-bench/nsys-read")


def events(run: Run) -> int:
    return int(run.child.get("device_ops", 0)) + int(run.child.get("host_events", 0))


def best(runs: list[Run]) -> Run:
    ok = [r for r in runs if r.ok]
    if not ok:
        raise SystemExit(f"every run failed: {runs[0].error}")
    return min(ok, key=lambda r: r.work_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,10,100", help="Nsight copies (comma-separated)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nsys-source", type=Path, default=NSYS_SOURCE)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the Kineto trace")
    ap.add_argument("--keep", action="store_true", help="keep and reuse the scaled files")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    src = REPO / "src"
    # events per copy of each source, from one read of each
    nsys_one = events(best([run_child("read", [str(args.nsys_source)], src=src)]))
    kineto_one = events(best([run_child("read", [str(args.source)], src=src)]))
    rows: list[dict[str, Any]] = []
    try:
        for scale in (int(s) for s in args.scales.split(",")):
            nsys_file = WORK / f"nsys-x{scale}.sqlite"
            if scale == 1:
                nsys_file = args.nsys_source
            elif not (args.keep and nsys_file.exists()):
                scale_nsys(args.nsys_source, nsys_file, scale)
            kineto_scale = max(nsys_one * scale / kineto_one, 0.01)
            kineto_file = WORK / f"kineto-x{kineto_scale:.3f}.json.gz"
            if not (args.keep and kineto_file.exists()):
                scale_trace(args.source, kineto_file, kineto_scale)
            runs: dict[str, list[Run]] = {"nsys": [], "kineto": []}
            for _ in range(args.repeat):  # interleaved: both readers see the same machine load
                runs["nsys"].append(run_child("read", [str(nsys_file)], src=src))
                runs["kineto"].append(run_child("read", [str(kineto_file)], src=src))
            for reader, path in (("nsys", nsys_file), ("kineto", kineto_file)):
                b = best(runs[reader])
                n = events(b)
                rows.append({"reader": reader, "scale": scale, "file": str(path), "file_bytes": path.stat().st_size,
                             "events": n, "work_s": b.work_s, "work_cpu_s": b.child.get("work_cpu_s"),
                             "events_per_s": n / b.work_s, "peak_rss": b.maxrss,
                             "rss_over_base": b.maxrss - int(b.child.get("base_rss", 0))})
                print(f"{reader:6} x{scale:<4} {n:>10,} events  {b.work_s:7.3f} s  {n / b.work_s:>12,.0f} ev/s  "
                      f"peak RSS {mib(b.maxrss)} MiB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(WORK, ignore_errors=True)
    print("\n| Nsight copies | nsys events | nsys ev/s | nsys peak RSS | Kineto events | Kineto ev/s | "
          "Kineto peak RSS | nsys/Kineto ev/s | RSS over imports per event (nsys / Kineto) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, k in zip(rows[::2], rows[1::2], strict=True):
        print(f"| {n['scale']} | {n['events']:,} | {n['events_per_s']:,.0f} | {mib(n['peak_rss'])} MiB | "
              f"{k['events']:,} | {k['events_per_s']:,.0f} | {mib(k['peak_rss'])} MiB | "
              f"{n['events_per_s'] / k['events_per_s']:.2f} | "
              f"{n['rss_over_base'] / n['events']:.0f} B / {k['rss_over_base'] / k['events']:.0f} B |")
    path = write_json("nsys_read_speed.json", {"machine": machine(), "rows": rows})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
