"""The compiled reader against the pure one, on a CUDA, a ROCm-like and a distinct-names trace.

Three traces of about ``--target-mib`` MiB of JSON each are synthesized under ``--workdir`` (gzip, as
profilers write them): the real CUDA trace of ``--source`` scaled (``scale_trace.py``); the same with every
copy's size written as ROCm writes it, a string (``"bytes": "616"``: one such field once sent its whole chunk to
the generic decoder); and many small events whose names are all distinct (each string is built once).
Each is read by the reader alone (``api.read_timelines``) and analysed whole (``gpuidle analyze --json``), in
fresh processes, with the compiled scanner and with ``GPUIDLE_READER=python``, side by side: the paths
interleaved run by run, the best of ``--repeat`` kept. Printed: the best wall time of the work (imports
excluded) of each, and the pure path's time over the compiled one's (above 1: the compiled reader is faster).

    python bench/reader_paths.py                        # 64 MiB each, 3 rounds
    python bench/reader_paths.py --target-mib 256 --repeat 2
    python bench/reader_paths.py --commit f268117        # also the code of a commit (its scanner built here)
    python bench/reader_paths.py --traces cuda --target-mib 256
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import orjson

from benchlib import DEFAULT_SOURCE, MIB, REPO, Run, machine, run_child, snapshot, write_json
from scale_trace import copy_bytes, load, scale_trace

READER_ENV = "GPUIDLE_READER"
NO_SCANNER_ENV = "GPUIDLE_BENCH_NO_SCANNER"
PATHS = ("compiled", "python")


def cuda_trace(source: Path, dst: Path, target_mib: float) -> None:
    trace = load(source)
    scale_trace(source, dst, target_mib * MIB / copy_bytes(source, source=trace), source=trace, gzip_level=1)


def rocm_trace(source: Path, dst: Path, target_mib: float) -> None:
    """The CUDA trace with each copy's size a string, as ROCm's tracer writes hipMemcpy's."""
    trace = load(source)
    for e in trace["traceEvents"]:
        args = e.get("args")
        if isinstance(args, dict) and isinstance(args.get("bytes"), int):
            args["bytes"] = str(args["bytes"])
    scale_trace(source, dst, target_mib * MIB / copy_bytes(source, source=trace), source=trace, gzip_level=1)


def distinct_names_trace(dst: Path, target_mib: float) -> None:
    """Small events, each of a name of its own: a host op launching a kernel, one step after another."""
    with gzip.open(dst, "wb", compresslevel=1) as out:
        out.write(b'{"traceEvents": [\n')
        written, i = 0, 0
        while written < target_mib * MIB:
            ts = 1_000_000 + i * 10
            step = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op_{i:07d}", "pid": 1, "tid": 1, "ts": ts,
                     "dur": 4},
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                     "ts": ts + 1, "dur": 2, "args": {"correlation": i}},
                    {"ph": "X", "cat": "kernel", "name": f"void kernel_{i:07d}<float>(float*)", "pid": 0,
                     "tid": 7, "ts": ts + 3, "dur": 5, "args": {"device": 0, "stream": 7, "correlation": i}}]
            text = b",\n".join(map(orjson.dumps, step)) + b",\n"
            out.write(text)
            written += len(text)
            i += 1
        out.write(orjson.dumps({"ph": "X", "cat": "cpu_op", "name": "end", "pid": 1, "tid": 1,
                                "ts": 1_000_000 + i * 10, "dur": 1}) + b"\n]}\n")


def built(src: Path) -> Path:
    """``src`` with its scanner compiled in place, as an install with a C compiler has it."""
    sources = src / "gpuidle" / "sources"
    ext = sources / ("_kscan" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    if not ext.exists():
        parts = [sources / "_kscan.c", *sorted((sources / "kscan").glob("*.c"))]
        subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O3", "-I", sysconfig.get_paths()["include"],
                        *map(str, parts), "-o", str(ext)], check=True)
    return src


def measure(tool: str, trace: Path, path: str, src: Path | None) -> Run:
    """One run; the pure path by ``GPUIDLE_READER=python``, and by the scanner's import failing as unbuilt for
    code older than that switch (``GPUIDLE_BENCH_NO_SCANNER``)."""
    saved = {k: os.environ.pop(k, None) for k in (READER_ENV, NO_SCANNER_ENV)}
    if path == "python":
        os.environ[READER_ENV] = "python"
        os.environ[NO_SCANNER_ENV] = "1"
    try:
        return run_child(tool, [str(trace)], src=src)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-mib", type=float, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpuidle-bench"))
    parser.add_argument("--commit", help="also measure the code of this commit (exported, its scanner built)")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the synthesized traces")
    parser.add_argument("--traces", default="cuda,rocm,distinct", help="which of cuda, rocm, distinct")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    traces: dict[str, Path] = {}
    for name, make in (("cuda", lambda p: cuda_trace(args.source, p, args.target_mib)),
                       ("rocm", lambda p: rocm_trace(args.source, p, args.target_mib)),
                       ("distinct", lambda p: distinct_names_trace(p, args.target_mib))):
        if name not in args.traces.split(","):
            continue
        path = args.workdir / f"paths_{name}_{args.target_mib:g}mib.json.gz"
        if not path.exists():
            make(path)
        traces[name] = path
    codes: dict[str, Path | None] = {"tree": REPO / "src"}
    if args.commit:
        src, commit = snapshot(args.commit, args.workdir)
        codes[commit[:8]] = built(src)
    best: dict[tuple[str, str, str, str], float] = {}
    runs: list[dict[str, Any]] = []
    try:
        for _ in range(args.repeat):
            for trace_name, trace in traces.items():
                for tool in ("read", "gpuidle"):
                    for code, src in codes.items():
                        for path in PATHS:
                            run = measure(tool, trace, path, src)
                            if not run.ok:
                                print(f"{code} {trace_name} {tool} {path}: {run.error}", file=sys.stderr)
                                continue
                            key = (code, trace_name, tool, path)
                            best[key] = min(best.get(key, float("inf")), run.work_s)
                            runs.append({"code": code, "trace": trace_name, "tool": tool, "path": path,
                                         "work_s": run.work_s, "wall_s": run.wall_s, "maxrss": run.maxrss})
    finally:
        if not args.keep:
            for path in traces.values():
                path.unlink(missing_ok=True)
    print(f"best of {args.repeat}, the work alone (s); pure/compiled: above 1, the compiled reader is faster")
    for code in codes:
        for trace_name in traces:
            for tool in ("read", "gpuidle"):
                c, p = best.get((code, trace_name, tool, "compiled")), best.get((code, trace_name, tool, "python"))
                if c is None or p is None:
                    continue
                what = "reader" if tool == "read" else "analyze"
                print(f"{code:>8} {trace_name:>8} {what:>7}: compiled {c:6.2f}  python {p:6.2f}  "
                      f"pure/compiled {p / c:5.2f}x")
    write_json("reader_paths.json", {"machine": machine(), "target_mib": args.target_mib, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
