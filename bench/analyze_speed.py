"""How fast, and in how much memory, ``gpuidle analyze --json`` reads one trace.

For each size, a real trace is scaled to about that many MiB of decompressed JSON
(``scale_trace.py``), then three measurements run side by side, each in a fresh
process, ``--repeat`` times in turn:

- floor: gunzip + ``orjson.loads`` of the whole file, the least a JSON reader does
  (garbage collector off; ``--tools ...,floor_gc`` adds the same with it on);
- gpuidle: ``gpuidle analyze FILE --json``;
- hta: HolisticTraceAnalysis (``TraceAnalysis`` load + ``get_temporal_breakdown`` +
  ``get_idle_time_breakdown``), from its own virtual environment ``bench/.venv-hta``.

Times are the measured work (interpreter start-up and imports excluded; best of the
repeats); ``wall`` is the whole process. Ratios are the median over rounds of the
ratio within a round (the tools run back to back in each round); those marked ``cpu``
use the CPU time of the work, which other jobs on the machine disturb less. Peak RSS is the process's own
high-water mark (``VmHWM``; largest of the repeats). Results also go to
``bench/out/analyze_speed.json``.

    python bench/analyze_speed.py                  # 10 and 100 MiB
    python bench/analyze_speed.py --full           # 10, 100 and 1024 MiB
    python bench/analyze_speed.py --sizes 10,50,200 --repeat 5 --tools floor,gpuidle
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import (
    DEFAULT_SOURCE,
    HTA_PY,
    MIB,
    REPO,
    Run,
    hta_available,
    install_hta,
    machine,
    mib,
    run_child,
    snapshot,
    write_json,
)
from scale_trace import copy_bytes, load, scale_trace

TOOLS = ("floor", "gpuidle", "hta")
OPTIONAL = ("floor_gc",)
LARGE = 512 * MIB
"""Sizes from here on are measured ``--repeat-large`` times (default once)."""


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to scale")
    p.add_argument("--sizes", default="10,100", help="decompressed sizes in MiB, comma-separated")
    p.add_argument("--full", action="store_true", help="add the 1 GiB size")
    p.add_argument("--tools", default=",".join(TOOLS),
                   help=f"which of {','.join(TOOLS + OPTIONAL)} to run (floor_gc: the floor with the "
                   "garbage collector on)")
    p.add_argument("--repeat", type=int, default=3, help="runs per tool and size below 512 MiB")
    p.add_argument("--repeat-large", type=int, default=1, help="runs per tool and size from 512 MiB")
    p.add_argument("--hta-max-mib", type=float, default=math.inf, help="skip HTA above this size")
    p.add_argument("--mem-limit-gib", type=float, default=16, help="kill a measurement above this RSS")
    p.add_argument("--timeout", type=float, default=1200, help="kill a measurement after this many s")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench"), help="where traces are written")
    p.add_argument("--keep", action="store_true", help="keep the generated traces (and reuse them)")
    p.add_argument("--commit", help="measure gpuidle as of this commit (exported to --workdir), "
                   "not the working tree")
    p.add_argument("--install-hta", action="store_true", help="create bench/.venv-hta first")
    p.add_argument("--out", default="analyze_speed.json", help="results file name under bench/out/")
    return p.parse_args(argv)


def _generate(args: argparse.Namespace, size_mib: float, source: dict[str, Any], per_copy: int) -> dict[str, Any]:
    path = args.workdir / f"scaled_{size_mib:g}MiB.json.gz"
    meta = path.with_name(path.name + ".meta.json")
    scale = size_mib * MIB / per_copy
    if args.keep and path.exists() and meta.exists():
        known = json.loads(meta.read_text(encoding="utf-8"))
        if known.get("source") == str(args.source) and known.get("scale") == scale:
            print(f"  reusing {path.name}", flush=True)
            return known["trace"]
    t0 = time.perf_counter()
    res = scale_trace(args.source, path, scale, source=source)
    print(f"  wrote {path.name}: scale {scale:.2f}, {res.events:,} events, {mib(res.bytes)} MiB JSON, "
          f"{mib(res.file_bytes)} MiB gzip, {time.perf_counter() - t0:.1f} s", flush=True)
    trace = {"path": str(path), "scale": scale, "events": res.events, "json_bytes": res.bytes,
             "file_bytes": res.file_bytes}
    meta.write_text(json.dumps({"source": str(args.source), "scale": scale, "trace": trace}), encoding="utf-8")
    return trace


def _measure(tool: str, trace: dict[str, Any], args: argparse.Namespace) -> Run:
    limits = {"timeout_s": args.timeout, "mem_limit": int(args.mem_limit_gib * (1 << 30))}
    if tool in ("floor", "floor_gc"):
        return run_child(tool, [trace["path"]], **limits)
    if tool == "gpuidle":
        return run_child("gpuidle", [trace["path"]], src=args.src, **limits)
    folder = Path(trace["path"] + ".hta")
    folder.mkdir(exist_ok=True)
    link = folder / "rank0.json.gz"
    if not link.exists():
        link.symlink_to(trace["path"])
    return run_child("hta", [str(folder)], python=HTA_PY, **limits)


def _summary(runs: list[Run]) -> dict[str, Any]:
    good = [r for r in runs if r.ok]
    if not good:
        return {"ok": False, "error": runs[0].error if runs else "not run"}
    works = [r.work_s for r in good]
    return {
        "ok": True, "runs": len(good), "work_s": min(works), "work_s_median": statistics.median(works),
        "work_s_all": works, "wall_s": min(r.wall_s for r in good),
        "import_s": min(float(r.child["import_s"]) for r in good),
        "work_cpu_s": min(float(r.child.get("work_cpu_s", "nan")) for r in good),
        "maxrss": max(r.maxrss for r in good), "base_rss": max(int(r.child.get("base_rss", 0)) for r in good),
        "tree_peak_rss": max(r.tree_peak_rss for r in good),
        "extra": {k: v for k, v in good[0].child.items()
                  if k not in ("tool", "work_s", "import_s", "maxrss", "base_rss", "work_cpu_s")},
    }


def _paired(runs: dict[str, list[Run]], a: str, b: str, key: str) -> float | None:
    """Median over rounds of ``a``'s time over ``b``'s in the same round: both ran back to
    back, so a busy spell on the shared machine hits both rather than one."""
    def value(r: Run) -> float:
        return r.wall_s if key == "wall_s" else float(r.child.get(key, "nan"))

    pairs = [value(x) / value(y) for x, y in zip(runs.get(a, []), runs.get(b, []), strict=False)
             if x.ok and y.ok and value(y) > 0]
    pairs = [p for p in pairs if not math.isnan(p)]
    return statistics.median(pairs) if pairs else None


def _fmt_s(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _get(res: dict[str, Any], tool: str, key: str) -> Any:
    t = res["tools"].get(tool)
    return t.get(key) if t and t.get("ok") else None


def _tables(results: list[dict[str, Any]], tools: list[str]) -> str:
    lines = []
    head = f"{'size MiB':>8} {'events':>11}"
    for t in tools:
        head += f" | {t + ' s':>10} {'wall s':>7} {'RSS MiB':>8}"
    lines.append(head)
    lines.append("-" * len(head))
    for r in results:
        row = f"{mib(r['json_bytes']):>8} {r['events']:>11,}"
        for t in tools:
            tr = r["tools"].get(t, {})
            if tr.get("ok"):
                row += f" | {_fmt_s(tr['work_s']):>10} {_fmt_s(tr['wall_s']):>7} {mib(tr['maxrss']):>8}"
            else:
                row += f" | {('failed: ' + tr.get('error', 'skipped'))[:28]:>28}"
        lines.append(row)
    lines.append("")
    head = (f"{'size MiB':>8} | {'gpuidle/floor':>13} {'(cpu)':>5} {'HTA/gpuidle':>11} {'(cpu)':>5} "
            f"{'(wall)':>6} | "
            f"{'RSS/JSON':>8} {'(RSS-base)/JSON':>15} {'floor RSS/JSON':>14} {'HTA RSS/JSON':>12} | "
            f"{'gpuidle ns/ev':>13} {'floor ns/ev':>11} {'HTA ns/ev':>9}")
    lines.append(head)
    lines.append("-" * len(head))
    for r in results:
        size, ev = r["json_bytes"], r["events"]

        def f(v: float | None, spec: str = ".2f") -> str:
            return "-" if v is None else format(v, spec)

        g_rss, g_base = _get(r, "gpuidle", "maxrss"), _get(r, "gpuidle", "base_rss")
        fl_rss, h_rss = _get(r, "floor", "maxrss"), _get(r, "hta", "maxrss")

        def ns(t: str, r: dict[str, Any] = r, ev: int = ev) -> float | None:
            w = _get(r, t, "work_s")
            return None if w is None else w / ev * 1e9

        lines.append(
            f"{mib(size):>8} | {f(r['ratios'].get('gpuidle_over_floor')):>13} "
            f"{f(r['ratios'].get('gpuidle_over_floor_cpu')):>5} "
            f"{f(r['ratios'].get('hta_over_gpuidle'), '.1f'):>11} "
            f"{f(r['ratios'].get('hta_over_gpuidle_cpu'), '.1f'):>5} "
            f"{f(r['ratios'].get('hta_over_gpuidle_wall'), '.1f'):>6} | "
            f"{f(_ratio(g_rss, size)):>8} {f(_ratio(None if g_rss is None else g_rss - (g_base or 0), size)):>15} "
            f"{f(_ratio(fl_rss, size)):>14} {f(_ratio(h_rss, size)):>12} | "
            f"{f(ns('gpuidle'), '.0f'):>13} {f(ns('floor'), '.0f'):>11} {f(ns('hta'), '.0f'):>9}")
    return "\n".join(lines)


def _targets(results: list[dict[str, Any]]) -> list[str]:
    """The targets, judged as they are set: on the whole process (start-up and imports included); the work alone
    is printed beside it."""
    out = []
    for r in results:
        size = mib(r["json_bytes"]) + " MiB"
        ratios = r["ratios"]
        hw, hg = ratios.get("hta_over_gpuidle_wall"), ratios.get("hta_over_gpuidle")
        if hw is not None:
            out.append(f"{size}: >= 10x faster than HTA, whole process: {hw:.1f}x (the work alone {hg:.1f}x) -> "
                       f"{'met' if hw >= 10 else 'MISSED'}")
        fw, gf = ratios.get("gpuidle_over_floor_wall"), ratios.get("gpuidle_over_floor")
        if fw is not None:
            out.append(f"{size}: not slower than the orjson floor, whole process: gpuidle/floor {fw:.2f} (the work "
                       f"alone {gf:.2f}) -> {'met' if fw <= 1.0 else 'MISSED'}")
        gfc = ratios.get("gpuidle_over_floor_gc")
        if gfc is not None:
            out.append(f"{size}:   ... the work against the floor with the garbage collector on: gpuidle/floor_gc "
                       f"{gfc:.2f} -> {'met' if gfc <= 1.0 else 'MISSED'}")
        rss = _get(r, "gpuidle", "maxrss")
        if rss is not None:
            q = rss / r["json_bytes"]
            out.append(f"{size}: peak RSS <= 1.5x JSON: {q:.2f}x -> {'met' if q <= 1.5 else 'MISSED'}")
        if r["json_bytes"] >= 1000 * MIB and _get(r, "gpuidle", "wall_s") is not None:
            out.append(f"{size}: {_get(r, 'gpuidle', 'wall_s'):.1f} s wall (against gzip -dc: bench/read_workers.py)")
    per_ev = [(r["events"], _get(r, "gpuidle", "work_s")) for r in results]
    per_ev = [(e, w) for e, w in per_ev if w is not None]
    if len(per_ev) >= 2:
        costs = [w / e * 1e9 for e, w in per_ev]
        spread = costs[-1] / costs[-2]
        out.append("linear in events: gpuidle ns/event " + " -> ".join(f"{c:.0f}" for c in costs)
                   + f" (last two sizes: x{spread:.2f}) -> {'met' if spread <= 1.25 else 'MISSED'}")
    return out


def _head() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.install_hta:
        install_hta()
    tools = [t for t in args.tools.split(",") if t]
    unknown = set(tools) - set(TOOLS + OPTIONAL)
    if unknown:
        print(f"unknown tools: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if "hta" in tools and not hta_available():
        print(f"HTA is not installed ({HTA_PY}); run with --install-hta, or --tools floor,gpuidle",
              file=sys.stderr)
        return 2
    sizes = [float(s) for s in args.sizes.split(",") if s]
    if args.full and 1024 not in sizes:
        sizes.append(1024.0)
    sizes.sort()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.src, commit = snapshot(args.commit, args.workdir) if args.commit else (None, _head())
    print(f"source {args.source.name}; sizes {sizes} MiB; tools {tools}; {machine()['cpus']} CPUs; "
          f"gpuidle {'commit ' + commit[:12] if args.src else 'working tree at ' + commit[:12]}", flush=True)
    source = load(args.source)
    per_copy = copy_bytes(args.source, source=source)
    results: list[dict[str, Any]] = []
    for size in sizes:
        print(f"[{size:g} MiB]", flush=True)
        trace = _generate(args, size, source, per_copy)
        repeat = args.repeat if trace["json_bytes"] < LARGE else args.repeat_large
        runs: dict[str, list[Run]] = {t: [] for t in tools}
        for i in range(repeat):
            for tool in tools:
                if tool == "hta" and size > args.hta_max_mib:
                    continue
                run = _measure(tool, trace, args)
                runs[tool].append(run)
                state = (f"{run.work_s:.3f} s work, {run.wall_s:.3f} s wall, {mib(run.maxrss)} MiB peak"
                         if run.ok else run.error)
                print(f"  run {i + 1}/{repeat} {tool:8s} {state}", flush=True)
        summary = {t: _summary(rs) if rs else {"ok": False, "error": f"skipped above {args.hta_max_mib:g} MiB"}
                   for t, rs in runs.items()}
        ratios = {
            "gpuidle_over_floor": _paired(runs, "gpuidle", "floor", "work_s"),
            "gpuidle_over_floor_cpu": _paired(runs, "gpuidle", "floor", "work_cpu_s"),
            "gpuidle_over_floor_wall": _paired(runs, "gpuidle", "floor", "wall_s"),
            "gpuidle_over_floor_gc": _paired(runs, "gpuidle", "floor_gc", "work_s"),
            "hta_over_gpuidle": _paired(runs, "hta", "gpuidle", "work_s"),
            "hta_over_gpuidle_cpu": _paired(runs, "hta", "gpuidle", "work_cpu_s"),
            "hta_over_gpuidle_wall": _paired(runs, "hta", "gpuidle", "wall_s"),
        }
        results.append({"size_mib": size, **trace, "repeat": repeat, "tools": summary, "ratios": ratios})
        if not args.keep:
            Path(trace["path"]).unlink(missing_ok=True)
            Path(trace["path"] + ".meta.json").unlink(missing_ok=True)
            shutil.rmtree(trace["path"] + ".hta", ignore_errors=True)
    print()
    print(_tables(results, tools))
    print()
    for line in _targets(results):
        print(line)
    path = write_json(args.out, {"machine": machine(), "source": str(args.source),
                                 "gpuidle": {"commit": commit, "working_tree": args.src is None},
                                 "results": results,
                                 "targets": _targets(results)})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
