"""One measurement in a fresh process: prints one JSON line with its time and peak RSS.

Run by the benchmark scripts, each call in its own interpreter, so that the peak
RSS (``ru_maxrss``) belongs to that measurement alone. Only the standard library
is imported up front: the HTA measurement runs in HTA's own virtual environment.

    python bench/measure_child.py floor TRACE         # floor_gc: the same, garbage collector on
    python bench/measure_child.py gpuidle PATH [gpuidle analyze options...]
    python bench/measure_child.py gpuidle_error PATH   # the same, for a file it must refuse (exit 2)
    python bench/measure_child.py hta TRACE_DIR
    python bench/measure_child.py read TRACE          # the reader alone (api.read_timelines), any format

Printed: ``tool``, ``import_s`` (importing the tool), ``work_s`` (the measured work,
imports excluded: gpuidle's analysis modules too, imported up front as the floor imports orjson),
``maxrss`` (peak RSS of this process, bytes: ``VmHWM``, the high-water mark of this process's own
address space; ``ru_maxrss`` is printed too but Linux carries it over ``exec`` from the process that
forked the child, so it reads at least the launcher's RSS), ``children_maxrss`` (largest ``ru_maxrss`` among its
finished child processes, bytes; 0 if none), ``base_rss`` (RSS after the imports,
bytes), ``work_cpu_s`` (CPU time of the work in this process: less disturbed than
``work_s`` when other jobs share the cores), ``children_cpu_s`` (gpuidle: the CPU time of the worker
processes that decoded the trace), plus tool-specific counts.

With ``GPUIDLE_BENCH_NO_SCANNER=1`` gpuidle runs as installed without a C compiler: the compiled scanner
is not imported, and every chunk is decoded by msgspec (in worker processes where every core is used).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

if os.environ.get("GPUIDLE_BENCH_NO_SCANNER") == "1":
    sys.modules["gpuidle.sources._kscan"] = None  # type: ignore[assignment]  # its import fails, as unbuilt


def _status(key: str) -> int:
    """A size from ``/proc/self/status`` in bytes (``VmRSS`` now, ``VmHWM`` peak)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_now() -> int:
    return _status("VmRSS")


def _floor(path: str, collect: bool = False) -> tuple[float, float, dict[str, object]]:
    """gunzip the whole file and ``orjson.loads`` it: the least any JSON reader must do.

    Python's cyclic garbage collector is off unless ``collect``: with it on, the millions of
    dicts ``loads`` creates set off full collections whose cost grows faster than the
    file (more than half the time at 100 MiB), which is no part of a lower bound.
    """
    t0 = time.perf_counter()
    import gc
    import gzip

    import orjson
    t1 = time.perf_counter()
    c1 = time.process_time()
    base = _rss_now()
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if not collect:
        gc.disable()
    obj = orjson.loads(raw)
    events = len(obj["traceEvents"])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, {"events": events, "json_bytes": len(raw), "base_rss": base,
                              "work_cpu_s": time.process_time() - c1}


def _gpuidle(path: str, extra: list[str], expect: int = 0) -> tuple[float, float, dict[str, object]]:
    """``gpuidle analyze PATH --json``, through the command's own process entry (:func:`gpuidle.cli.run`).

    The modules ``analyze`` loads on first use are imported before the clock starts, as the floor imports
    orjson first (``wall`` still holds both whole processes). Its run is recorded in a fresh ledger of its
    own: a first run's cost, not one that grows with the ledger of the machine the benchmark runs on.
    """
    import atexit
    import shutil
    import tempfile

    ledger_dir = tempfile.mkdtemp(prefix="gpuidle-bench-")
    atexit.register(shutil.rmtree, ledger_dir, True)
    os.environ["GPUIDLE_LEDGER"] = os.path.join(ledger_dir, "ledger.sqlite")
    t0 = time.perf_counter()
    import gc

    from gpuidle.cli import COLLECT_EVERY, run
    gc.set_threshold(COLLECT_EVERY, *gc.get_threshold()[1:])  # as the process entry (run) sets it before it imports
    import gpuidle
    import gpuidle.api
    import gpuidle.cli.analyze
    import gpuidle.ledger  # with the two above: what analyze imports on first use
    t1 = time.perf_counter()
    c1 = time.process_time()
    base = _rss_now()
    sys.argv = ["gpuidle", "analyze", path, "--json", "--out", os.devnull, "--no-progress", *extra]
    rc = run()  # the command's own process entry: its collector settings, its objects frozen at the end
    t2 = time.perf_counter()
    if rc != expect:
        raise SystemExit(f"gpuidle analyze exited {rc}, not {expect}")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the reader's worker processes, reaped by now
    return t1 - t0, t2 - t1, {"base_rss": base, "gpuidle_from": os.path.dirname(gpuidle.__file__),
                              "work_cpu_s": time.process_time() - c1,
                              "children_cpu_s": children.ru_utime + children.ru_stime}


def _hta(trace_dir: str) -> tuple[float, float, dict[str, object]]:
    """HolisticTraceAnalysis: load the folder, temporal and idle-time breakdowns."""
    import logging
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis
    t1 = time.perf_counter()
    logging.disable(logging.WARNING)  # HTA logs every parse step at WARNING
    c1 = time.process_time()
    base = _rss_now()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    t2 = time.perf_counter()
    temporal = analysis.get_temporal_breakdown(visualize=False)
    idle, _ = analysis.get_idle_time_breakdown(visualize=False)
    t3 = time.perf_counter()
    return t1 - t0, t3 - t1, {"base_rss": base, "load_s": t2 - t1, "breakdowns_s": t3 - t2,
                              "work_cpu_s": time.process_time() - c1,
                              "temporal_rows": len(temporal), "idle_rows": len(idle)}


def _read(path: str) -> tuple[float, float, dict[str, object]]:
    """The reader alone: the file into Timelines (every rank), no analysis."""
    t0 = time.perf_counter()
    from gpuidle.api import read_timelines
    t1 = time.perf_counter()
    c1 = time.process_time()
    base = _rss_now()
    timelines = read_timelines(path)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, {"base_rss": base, "work_cpu_s": time.process_time() - c1,
                              "format": timelines[0].meta.format, "ranks": len(timelines),
                              "device_ops": sum(len(t.device_ops) for t in timelines),
                              "host_events": sum(len(t.host) for t in timelines)}


def main(argv: list[str]) -> int:
    tool, path, extra = argv[0], argv[1], argv[2:]
    if tool == "floor":
        imp, work, info = _floor(path)
    elif tool == "floor_gc":
        imp, work, info = _floor(path, collect=True)
    elif tool == "gpuidle":
        imp, work, info = _gpuidle(path, extra)
    elif tool == "gpuidle_error":
        imp, work, info = _gpuidle(path, extra, expect=2)
    elif tool == "hta":
        imp, work, info = _hta(path)
    elif tool == "read":
        imp, work, info = _read(path)
    else:
        raise SystemExit(f"unknown tool {tool!r}")
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"tool": tool, "import_s": imp, "work_s": work, "maxrss": _status("VmHWM"),
           "ru_maxrss": me.ru_maxrss * 1024, "children_maxrss": kids.ru_maxrss * 1024,
           "cpu_s": me.ru_utime + me.ru_stime,
           "children_cpu_s": kids.ru_utime + kids.ru_stime, **info}
    sys.stdout.flush()
    print("@@" + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
