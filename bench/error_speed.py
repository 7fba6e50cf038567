"""How fast ``gpuidle analyze`` refuses a damaged trace, next to how fast it reads the good one.

For each size, a real trace is scaled to about that many MiB of plain JSON
(``scale_trace.py``), then copied twice: once with a bad byte near its end, once cut
off inside its last events. Each of the three is analysed in a fresh process, ``--repeat``
times in turn (best time kept). Error detection is linear when the damaged files take
about as long as the good one at every size, and when each column grows with the size by
the same factor as the size itself.

Then two gzip bombs are refused: ``{"traceEvents": [`` followed by ``--bomb-mib`` of
spaces, and one event whose name is that long (each a small ``.gz``). Their time and peak
RSS should not depend on the bomb's size past the per-event limit.

    python bench/error_speed.py                         # 16 and 128 MiB, 1 GiB bombs
    python bench/error_speed.py --sizes 16,64,256 --repeat 3
    python bench/error_speed.py --commit main --timeout 300   # the same for another commit

Times are the work (imports excluded), best of the repeats, and its CPU time, which other
jobs on a shared machine disturb less. Results also go to ``bench/out/error_speed.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import zlib
from pathlib import Path
from typing import Any

from benchlib import DEFAULT_SOURCE, MIB, Run, machine, mib, run_child, snapshot, write_json
from scale_trace import copy_bytes, load, scale_trace

KINDS = ("good", "bad byte at end", "truncated")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to scale")
    p.add_argument("--sizes", default="16,128", help="plain JSON sizes in MiB, comma-separated")
    p.add_argument("--repeat", type=int, default=2, help="runs per file")
    p.add_argument("--bomb-mib", type=int, default=1024, help="decompressed size of each gzip bomb (0: none)")
    p.add_argument("--timeout", type=float, default=600, help="kill a measurement after this many s")
    p.add_argument("--mem-limit-gib", type=float, default=8, help="kill a measurement above this RSS")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench"), help="where traces are written")
    p.add_argument("--commit", help="measure gpuidle as of this commit, not the working tree")
    return p.parse_args(argv)


def _damaged(good: Path, kind: str) -> Path:
    """A copy of ``good`` with a bad byte in its last events, or cut off inside them."""
    out = good.with_name(f"{good.stem}.{kind.replace(' ', '_')}.json")
    shutil.copyfile(good, out)
    size = good.stat().st_size
    with open(out, "r+b") as f:
        f.seek(max(0, size - (64 << 10)))
        tail = f.read()
        at = tail.rfind(b'"dur":')
        if kind == "truncated":
            f.truncate(size - len(tail) + at + 3)
        else:
            f.seek(size - len(tail) + at + 5)  # the ':' after "dur"
            f.write(b"\x01")
    return out


def _bomb(path: Path, size: int, name: bool) -> Path:
    """``{"traceEvents": [`` + ``size`` spaces (or one event named by ``size`` letters), gzipped in a stream."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = (b"a" if name else b" ") * MIB
    with open(path, "wb") as f:
        f.write(z.compress(b'{"traceEvents": [{"ph": "X", "name": "' if name else b'{"traceEvents": ['))
        for _ in range(size // MIB):
            f.write(z.compress(block))
        f.write(z.compress(b'"}]}' if name else b"]}"))
        f.write(z.flush())
    return path


def _measure(path: Path, kind: str, args: argparse.Namespace) -> Run:
    tool = "gpuidle" if kind == "good" else "gpuidle_error"
    return run_child(tool, [str(path), "--no-ledger"], src=args.src, timeout_s=args.timeout,
                     mem_limit=int(args.mem_limit_gib * (1 << 30)))


def _best(runs: list[Run]) -> dict[str, Any]:
    good = [r for r in runs if r.ok]
    if not good:
        return {"ok": False, "error": runs[0].error if runs else "not run"}
    return {"ok": True, "work_s": min(r.work_s for r in good), "maxrss": max(r.maxrss for r in good),
            "cpu_s": min(float(r.child.get("work_cpu_s", "nan")) for r in good)}


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.src, commit = snapshot(args.commit, args.workdir) if args.commit else (None, "working tree")
    sizes = sorted(float(s) for s in args.sizes.split(",") if s)
    print(f"source {args.source.name}; sizes {sizes} MiB; gpuidle {commit[:12]}", flush=True)
    source = load(args.source)
    per_copy = copy_bytes(args.source, source=source)
    results: list[dict[str, Any]] = []
    for size in sizes:
        good = args.workdir / f"errors_{size:g}MiB.json"
        res = scale_trace(args.source, good, size * MIB / per_copy, source=source)
        files = {"good": good, **{k: _damaged(good, k) for k in KINDS[1:]}}
        runs: dict[str, list[Run]] = {k: [] for k in KINDS}
        for i in range(args.repeat):
            for kind in KINDS:
                run = _measure(files[kind], kind, args)
                runs[kind].append(run)
                print(f"  {mib(res.bytes)} MiB {kind:16s} run {i + 1}: "
                      + (f"{run.work_s:.3f} s, {mib(run.maxrss)} MiB peak" if run.ok else run.error), flush=True)
        results.append({"size_mib": size, "json_bytes": res.bytes, **{k: _best(v) for k, v in runs.items()}})
        for f in files.values():
            f.unlink(missing_ok=True)
    bombs: dict[str, Any] = {}
    if args.bomb_mib:
        for label, name in (("spaces", False), ("long name", True)):
            path = _bomb(args.workdir / f"bomb_{label.replace(' ', '_')}.json.gz", args.bomb_mib * MIB, name)
            run = _measure(path, "bomb", args)
            bombs[label] = {"gz_bytes": path.stat().st_size, **_best([run])}
            print(f"  bomb, {args.bomb_mib} MiB of {label} ({path.stat().st_size / MIB:.1f} MiB .gz): "
                  + (f"{run.work_s:.3f} s, {mib(run.maxrss)} MiB peak" if run.ok else run.error), flush=True)
            path.unlink()

    def s(r: dict[str, Any], kind: str, key: str = "work_s") -> float | None:
        return r[kind][key] if r[kind]["ok"] else None

    def ratio(a: float | None, b: float | None) -> str:
        return _fmt(a / b if a and b else None)

    print()
    head = (f"{'MiB':>6} | {'good s':>7} {'bad end s':>9} {'trunc s':>8} | {'bad/good':>8} {'trunc/good':>10} | "
            f"{'cpu: bad/good':>13} {'trunc/good':>10}")
    print(head)
    print("-" * len(head))
    for r in results:
        g, b, t = s(r, "good"), s(r, "bad byte at end"), s(r, "truncated")
        gc, bc, tc = (s(r, k, "cpu_s") for k in KINDS)
        print(f"{mib(r['json_bytes']):>6} | {_fmt(g, '.3f'):>7} {_fmt(b, '.3f'):>9} {_fmt(t, '.3f'):>8} | "
              f"{ratio(b, g):>8} {ratio(t, g):>10} | {ratio(bc, gc):>13} {ratio(tc, gc):>10}")
    if len(results) >= 2:
        lo, hi = results[0], results[-1]
        growth = hi["json_bytes"] / lo["json_bytes"]
        for key in ("work_s", "cpu_s"):
            print(f"\nsize x{growth:.1f} ({mib(lo['json_bytes'])} -> {mib(hi['json_bytes'])} MiB): {key} x "
                  + ", ".join(f"{k} {ratio(s(hi, k, key), s(lo, k, key))}" for k in KINDS), end="")
        print()
    for label, b in bombs.items():
        print(f"bomb of {args.bomb_mib} MiB {label}: "
              + (f"refused in {b['work_s']:.2f} s, {mib(b['maxrss'])} MiB peak RSS" if b["ok"] else b["error"]))
    path = write_json("error_speed.json", {"machine": machine(), "source": str(args.source), "gpuidle": commit,
                                           "results": results, "bombs": bombs})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
