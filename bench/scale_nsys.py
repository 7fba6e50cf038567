"""Make an Nsight Systems SQLite export N times as long from a real one, for benchmarks.

The export is copied whole (SQLite's backup API, read-only source), then every activity
table (CUDA kernels, copies, sets, runtime calls, synchronizations, NVTX ranges, OS runtime
calls) gets ``N - 1`` more copies of its rows, copy ``k`` shifted by ``k`` spans of the
trace, its correlation ids offset by ``k`` times their maximum + 1 (launch -> kernel links
stay intact and never collide across copies). Columns are named from the table itself, so
any Nsight version's column set is scaled.

    python bench/scale_nsys.py SRC.sqlite OUT.sqlite --scale 40
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
          "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "OSRT_API")


def scale_nsys(src: Path, out: Path, scale: int) -> dict[str, int]:
    """Write ``out``; return its row count per scaled table and the file size."""
    if out.exists():
        out.unlink()
    source = sqlite3.connect(f"file:{src.resolve()}?mode=ro&immutable=1", uri=True)
    db = sqlite3.connect(out)
    source.backup(db)
    source.close()
    tables = [t for t in TABLES if db.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0]]
    cols = {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in tables}
    lo = min(db.execute(f"SELECT min(start) FROM {t}").fetchone()[0] or 0 for t in tables)
    hi = max(db.execute(f'SELECT max("end") FROM {t}').fetchone()[0] or 0 for t in tables)
    span = hi - lo + 1
    corr_step = 1 + max(db.execute(f"SELECT coalesce(max(correlationId), 0) FROM {t}").fetchone()[0]
                        for t in tables if "correlationId" in cols[t])
    with db:
        for t in tables:
            def expr(c: str, k: int) -> str:
                if c in ("start", "end"):
                    return f'"{c}" + {k * span}'
                if c == "correlationId":
                    return f"correlationId + {k * corr_step}"
                return f'"{c}"'

            names = ", ".join(f'"{c}"' for c in cols[t])
            rows = db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for k in range(1, scale):
                db.execute(f"INSERT INTO {t} ({names}) SELECT {', '.join(expr(c, k) for c in cols[t])} "
                           f"FROM {t} WHERE rowid <= {rows}")
    counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    db.close()
    return {**counts, "file_bytes": out.stat().st_size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--scale", type=int, default=10)
    args = ap.parse_args()
    print(json.dumps(scale_nsys(args.src, args.out, args.scale)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
