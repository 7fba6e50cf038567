"""Reading a trace from object storage or a web server against reading it from disk.

A real trace, scaled up (``scale_trace.py``), is put on a local S3-compatible server (moto,
the one the tests use) and served by Python's HTTP server; ``gpuidle analyze URL --json``
then runs in a fresh process for each, interleaved with the local file, ``--repeat`` times.

Printed per input: the best wall time, work time (imports excluded), peak RSS of the process
tree, and the ratios to the local file. Streaming means the remote peak RSS stays near the
local one (a few MiB of read-ahead), however large the trace.

    python bench/remote_read.py                        # the default source, 4 copies, gzip
    python bench/remote_read.py --scale 8 --plain      # uncompressed JSON: 8x more bytes over the wire
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchlib import DEFAULT_SOURCE, REPO, machine, mib, run_child, write_json

sys.path.insert(0, str(REPO / "tests"))
from remote_servers import http_server, s3_server

FALLBACK_SOURCE = REPO / "tests" / "data" / "negative_queue_length_values_check__rank0.json.gz"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE if DEFAULT_SOURCE.exists() else FALLBACK_SOURCE)
    p.add_argument("--scale", type=float, default=4.0, help="copies of the source's steps")
    p.add_argument("--plain", action="store_true", help="uncompressed .json instead of .json.gz")
    p.add_argument("--repeat", type=int, default=3, help="runs per input (best kept)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench/remote"))
    p.add_argument("--out", default="remote_read.json", help="results file name under bench/out/")
    args = p.parse_args(argv)

    name = "rank0.json" if args.plain else "rank0.json.gz"
    shutil.rmtree(args.workdir, ignore_errors=True)
    (args.workdir / "job").mkdir(parents=True)
    trace = args.workdir / "job" / name
    subprocess.run([sys.executable, str(REPO / "bench" / "scale_trace.py"), str(args.source), str(trace),
                    "--scale", str(args.scale)], check=True, stdout=subprocess.DEVNULL)
    size = trace.stat().st_size
    results: dict[str, list[dict[str, float]]] = {"local": [], "s3": [], "http": []}
    try:
        with s3_server() as s3, http_server(args.workdir) as http_url:
            client: Any = s3.client()
            client.create_bucket(Bucket="bench")
            with open(trace, "rb") as f:
                client.upload_fileobj(f, "bench", f"job/{name}")
            os.environ.update(AWS_ACCESS_KEY_ID=s3.reader[0], AWS_SECRET_ACCESS_KEY=s3.reader[1],
                              AWS_ENDPOINT_URL_S3=s3.endpoint, AWS_DEFAULT_REGION="us-east-1")
            paths = {"local": str(trace), "s3": f"s3://bench/job/{name}", "http": f"{http_url}/job/{name}"}
            for _ in range(args.repeat):
                for kind, path in paths.items():
                    run = run_child("gpuidle", [path, "--no-ledger"])
                    if not run.ok:
                        raise SystemExit(f"{kind}: {run.error}")
                    results[kind].append({"wall_s": run.wall_s, "work_s": run.work_s,
                                          "peak_rss": float(run.tree_peak_rss)})
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)

    best = {k: {m: min(r[m] for r in runs) for m in ("wall_s", "work_s", "peak_rss")} for k, runs in results.items()}
    print(f"{args.source.name} x{args.scale:g}, {name}: {mib(size)} MiB; best of {args.repeat}")
    print(f"{'input':<7}{'wall s':>9}{'work s':>9}{'peak RSS MiB':>14}{'work / local':>14}{'RSS / local':>13}")
    for kind, b in best.items():
        print(f"{kind:<7}{b['wall_s']:>9.2f}{b['work_s']:>9.2f}{mib(b['peak_rss']):>14}"
              f"{b['work_s'] / best['local']['work_s']:>14.2f}{b['peak_rss'] / best['local']['peak_rss']:>13.2f}")
    write_json(args.out, {"machine": machine(), "source": str(args.source), "scale": args.scale, "bytes": size,
                          "runs": results, "best": best})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
