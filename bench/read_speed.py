"""Read speed of the trace readers, side by side: events/s and peak RSS, each in a fresh process.

    python bench/read_speed.py                  # the real XSpace profile x1, x10, x40; Kineto x1, x4
    python bench/read_speed.py --repeat 5

Rows: ``xspace`` (gpuidle's XSpace reader, *.xplane.pb to Timeline), ``protobuf`` (the decode
alone: ``XSpace.ParseFromString`` plus one pass over every event's fields, the floor under any
protobuf-based reader), ``kineto`` (gpuidle's Kineto reader on the default Kineto trace and a
scaled copy) and ``xprof`` (xprof's own trace-viewer conversion of the same .xplane.pb, from
``bench/.venv-xprof``; ``--install-xprof`` creates it: xprof is a 32 MB wheel with
google-cloud-storage and duckdb, so it lives in a venv of its own; its trace viewer's output is
a protobuf, so its events are counted from the input after the clock stops). Scaled XSpace copies repeat
every line's events k times, shifted by the profile's span, with correlation ids offset so that
launch links stay unique.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
XSPACE_SOURCE = Path("/work/shared/traces/xspace/jax08_conv_mi300x8__tw003.xplane.pb")
XPROF_VENV = BENCH / ".venv-xprof"
XPROF_PY = XPROF_VENV / "bin" / "python"
WORK = Path("/tmp/gpuidle-bench")


def scale_xspace(src: Path, out: Path, k: int) -> None:
    """``src`` with each line's events repeated ``k`` times, shifted by the profile's span."""
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(src.read_bytes())
    span = max((e.offset_ps + e.duration_ps for p in space.planes for ln in p.lines for e in ln.events), default=0)
    corr_ids = {p.name: {i for i, m in p.stat_metadata.items() if m.name == "correlation_id"} for p in space.planes}
    max_corr = max((s.uint64_value or s.int64_value for p in space.planes for ln in p.lines for e in ln.events
                    for s in e.stats if s.metadata_id in corr_ids[p.name]), default=0) + 1
    for p in space.planes:
        for ln in p.lines:
            original = list(ln.events)
            for copy in range(1, k):
                for e in original:
                    new = ln.events.add()
                    new.CopyFrom(e)
                    new.offset_ps = e.offset_ps + copy * span
                    for s in new.stats:
                        if s.metadata_id in corr_ids[p.name]:
                            if s.WhichOneof("value") == "uint64_value":
                                s.uint64_value += copy * max_corr
                            else:
                                s.int64_value += copy * max_corr
    out.write_bytes(space.SerializeToString())


def _vmhwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _input_events(path: str) -> int:
    """Events in an XSpace file, counted outside the timed part."""
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    return sum(len(ln.events) for p in space.planes for ln in p.lines)


def child(tool: str, path: str) -> None:
    """Measure one read in this process and print one JSON line; ``events``: events in the input
    (all of an XSpace's; a Kineto trace's kept as timeline rows)."""
    t0 = time.perf_counter()
    if tool == "xspace":
        from gpuidle.sources import xspace

        t1 = time.perf_counter()
        tl = xspace.read(path)
        events = _input_events(path)  # counted after the read, for a rate per event read like the others
    elif tool == "kineto":
        from gpuidle.sources import kineto

        t1 = time.perf_counter()
        tl = kineto.read(path)
        events = len(tl.device_ops) + len(tl.host)
    elif tool == "protobuf":
        from gpuidle.sources.xplane import xplane_pb2

        t1 = time.perf_counter()
        space = xplane_pb2.XSpace()
        space.ParseFromString(Path(path).read_bytes())
        events = 0
        for p in space.planes:
            for ln in p.lines:
                for e in ln.events:
                    events += 1
                    _ = (e.metadata_id, e.offset_ps, e.duration_ps, [s.metadata_id for s in e.stats])
    elif tool == "xprof":
        from xprof.convert import _pywrap_profiler_plugin as plugin  # in bench/.venv-xprof only

        t1 = time.perf_counter()
        _trace, ok = plugin.xspace_to_tools_data([path], "trace_viewer", {})
        t2 = time.perf_counter()
        if not ok:
            raise SystemExit(f"xprof could not convert {path}")
        print(json.dumps({"import_s": t1 - t0, "read_s": t2 - t1, "events": _input_events(path), "maxrss": _vmhwm()}))
        return
    else:
        raise SystemExit(f"unknown tool {tool}")
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "read_s": t2 - t1, "events": events, "maxrss": _vmhwm()}))


def measure(tool: str, path: Path, python: str) -> dict[str, float] | None:
    env_src = str(BENCH.parent / "src")
    out = subprocess.run([python, __file__, "--child", tool, str(path)], capture_output=True, text=True,
                         env={"PYTHONPATH": env_src, "PATH": "/usr/bin:/bin"}, timeout=1800)
    if out.returncode != 0:
        print(f"  {tool} failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
        return None
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scales", default="1,10,40")
    ap.add_argument("--install-xprof", action="store_true")
    args = ap.parse_args()
    if args.child:  # runs under the xprof venv too, without the bench's own dependencies
        child(*args.child)
        return 0
    import benchlib

    if args.install_xprof and not XPROF_PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(XPROF_VENV)], check=True)
        subprocess.run([str(XPROF_PY), "-m", "pip", "install", "xprof"], check=True)
    WORK.mkdir(parents=True, exist_ok=True)
    inputs: list[tuple[str, Path, list[tuple[str, str]]]] = []
    tools = [("xspace", sys.executable), ("protobuf", sys.executable)]
    if XPROF_PY.exists():
        tools.append(("xprof", str(XPROF_PY)))
    for k in (int(x) for x in args.scales.split(",")):
        path = WORK / f"xspace_x{k}.xplane.pb"
        if not path.exists():
            scale_xspace(XSPACE_SOURCE, path, k)
        inputs.append((f"XSpace x{k}", path, tools))
    inputs.append(("Kineto x1", benchlib.DEFAULT_SOURCE, [("kineto", sys.executable)]))
    rows = []
    for label, path, tool_list in inputs:
        size = path.stat().st_size
        for tool, python in tool_list:
            runs = [r for r in (measure(tool, path, python) for _ in range(args.repeat)) if r]
            if not runs:
                continue
            best = min(runs, key=lambda r: r["read_s"])
            rows.append({"input": label, "bytes": size, "tool": tool, **best,
                         "events_per_s": best["events"] / best["read_s"] if best["read_s"] else None})
            print(f"{label:12} {benchlib.mib(size):>7} MiB  {tool:9} {int(best['events']):>9,} events  "
                  f"{best['read_s']:7.3f} s  {best['events'] / best['read_s'] / 1e3:9,.0f} k events/s  "
                  f"peak RSS {benchlib.mib(best['maxrss']):>6} MiB", flush=True)
    benchlib.write_json("read_speed", {"machine": benchlib.machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
