"""Make a Kineto trace N times as long from a real one, for benchmarks.

Copy ``k`` of the source events is shifted by ``k`` trace spans (rounded up to whole
microseconds, so integer timestamps stay integers), gets fresh ids (``correlation``,
flow ``id``, ``External id`` and the other per-event counters are offset by ``k``
times their maximum + 1, so launch -> kernel links stay intact and never collide
across copies) and renumbered ``ProfilerStep#N`` names. Metadata events (``ph: "M"``)
are written once. A fractional scale keeps, in its last copy, only the events that
start in the first part of the span (``scale=0.4``: the first 40 % of the trace).

The source is small and is loaded whole; the output is written event by event with
orjson, so a 1 GiB trace needs no more memory than the source.

    python bench/scale_trace.py SRC.json.gz OUT.json.gz --scale 40 [--rank 3 --world-size 32]
"""

from __future__ import annotations

import argparse
import gzip
import io
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

ID_ARGS = ("correlation", "External id", "Record function id", "Sequence number", "Ev Idx")
"""Per-event counters in ``args`` that must stay unique per copy; ``correlation`` is
shared with the flow ``id`` of ``ac2g`` arrows, so the two get one common offset."""

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
LAYOUTS = ("indent", "compact")


@dataclass
class ScaleResult:
    path: str
    scale: float
    copies: int
    events: int
    bytes: int
    """Decompressed size of the written JSON."""
    file_bytes: int
    span_us: int
    source_events: int


def load(path: str | Path) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    obj = orjson.loads(raw)
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise SystemExit(f"{path}: not a Chrome trace with a traceEvents list")
    return obj


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class _Plan:
    """What one source trace needs for copying: span, id offsets, step offset."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        t0, t1 = math.inf, -math.inf
        maxima = dict.fromkeys(ID_ARGS, -1)
        flow_max = -1
        steps: list[int] = []
        for e in events:
            ts = e.get("ts")
            if _num(ts) and e.get("ph") != "M":
                t0 = min(t0, ts)
                dur = e.get("dur")
                t1 = max(t1, ts + (dur if _num(dur) and dur > 0 else 0))
            if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
                flow_max = max(flow_max, e["id"])
            a = e.get("args")
            if isinstance(a, dict):
                for k in ID_ARGS:
                    v = a.get(k)
                    if isinstance(v, int) and v > maxima[k]:
                        maxima[k] = v
            name = e.get("name")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                m = _STEP.match(name)
                if m:
                    steps.append(int(m.group(1)))
        if t0 == math.inf:
            raise SystemExit("the source trace has no timed events")
        self.t0 = t0
        self.span_us = max(1, math.ceil(t1 - t0))
        corr = max(maxima["correlation"], flow_max) + 1
        self.id_step = {k: v + 1 for k, v in maxima.items()}
        self.id_step["correlation"] = corr
        self.flow_step = corr
        self.step_step = (max(steps) - min(steps) + 1) if steps else 0


def _copy_event(e: dict[str, Any], k: int, plan: _Plan) -> dict[str, Any]:
    if k == 0:
        return e
    out = dict(e)
    ts = out.get("ts")
    if _num(ts):
        out["ts"] = ts + k * plan.span_us
    if "id" in out and isinstance(out["id"], int) and out.get("ph") in ("s", "f", "t"):
        out["id"] = out["id"] + k * plan.flow_step
    a = out.get("args")
    if isinstance(a, dict):
        a2 = None
        for key in ID_ARGS:
            v = a.get(key)
            if isinstance(v, int) and v >= 0:
                if a2 is None:
                    a2 = dict(a)
                a2[key] = v + k * plan.id_step[key]
        if a2 is not None:
            out["args"] = a2
    name = out.get("name")
    if plan.step_step and isinstance(name, str) and name.startswith("ProfilerStep#"):
        m = _STEP.match(name)
        if m:
            out["name"] = f"ProfilerStep#{int(m.group(1)) + k * plan.step_step}"
    return out


def scaled_events(
    events: list[dict[str, Any]], scale: float, plan: _Plan | None = None,
) -> Iterator[dict[str, Any]]:
    """The events of ``scale`` copies, one at a time (metadata once, first)."""
    plan = plan or _Plan(events)
    yield from (e for e in events if e.get("ph") == "M")
    timed = [e for e in events if e.get("ph") != "M"]
    whole = int(scale)
    frac = scale - whole
    for k in range(whole):
        for e in timed:
            yield _copy_event(e, k, plan)
    if frac > 1e-9:
        cut = plan.t0 + frac * plan.span_us
        for e in timed:
            ts = e.get("ts")
            if _num(ts) and ts < cut:
                yield _copy_event(e, whole, plan)


class _Counting(io.RawIOBase):
    """Counts the bytes written through it (the decompressed size)."""

    def __init__(self, sink: BinaryIO) -> None:
        self.sink = sink
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.n += len(b)
        self.sink.write(b)
        return len(b)


def _dump(key: str, value: Any) -> bytes:
    return orjson.dumps(key) + b": " + orjson.dumps(value, option=orjson.OPT_INDENT_2)


def scale_trace(
    src: str | Path,
    dst: str | Path,
    scale: float,
    rank: int | None = None,
    world_size: int | None = None,
    layout: str = "indent",
    gzip_level: int = 6,
    source: dict[str, Any] | None = None,
) -> ScaleResult:
    """Write ``dst`` (gzip when it ends in ``.gz``): ``src`` scaled ``scale`` times.

    :param layout: ``indent`` writes each event over several lines, close to the size
        Kineto's own output has; ``compact`` writes one event per line, no spaces.
    :param source: the already-loaded source trace, to save reloading it.
    """
    if scale <= 0:
        raise ValueError("scale must be above 0")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    trace = source if source is not None else load(src)
    events = trace["traceEvents"]
    plan = _Plan(events)
    keys = list(trace)
    at = keys.index("traceEvents")
    head = {k: trace[k] for k in keys[:at]}
    tail = {k: trace[k] for k in keys[at + 1:]}
    if rank is not None or world_size is not None:
        info = dict(trace.get("distributedInfo") or {})
        if rank is not None:
            info["rank"] = rank
        if world_size is not None:
            info["world_size"] = world_size
        if "distributedInfo" in tail:
            tail["distributedInfo"] = info
        else:
            head["distributedInfo"] = info
    option = orjson.OPT_INDENT_2 if layout == "indent" else 0
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(dst, "wb") as raw:
        zipped = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=gzip_level, mtime=0) \
            if dst.name.endswith(".gz") else None
        counter = _Counting(zipped if zipped is not None else raw)  # type: ignore[arg-type]
        out = io.BufferedWriter(counter, buffer_size=1 << 20)
        out.write(b"{\n")
        for k, v in head.items():
            out.write(_dump(k, v) + b",\n")
        out.write(b'"traceEvents": [\n')
        dumps = orjson.dumps
        first = True
        for e in scaled_events(events, scale, plan):
            if not first:
                out.write(b",\n")
            out.write(dumps(e, option=option))
            first = False
            n += 1
        out.write(b"\n]")
        for k, v in tail.items():
            out.write(b",\n" + _dump(k, v))
        out.write(b"\n}\n")
        out.flush()
        if zipped is not None:
            zipped.close()
    return ScaleResult(
        path=str(dst), scale=scale, copies=math.ceil(scale), events=n, bytes=counter.n,
        file_bytes=dst.stat().st_size, span_us=plan.span_us, source_events=len(events),
    )


def copy_bytes(src: str | Path, layout: str = "indent", source: dict[str, Any] | None = None) -> int:
    """Decompressed size of one copy of ``src`` in ``layout`` (to pick a scale for a size)."""
    trace = source if source is not None else load(src)
    option = orjson.OPT_INDENT_2 if layout == "indent" else 0
    return sum(len(orjson.dumps(e, option=option)) + 2 for e in trace["traceEvents"] if e.get("ph") != "M")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a real Kineto trace scaled N times (more steps).")
    p.add_argument("src", help="a Kineto trace, .json or .json.gz")
    p.add_argument("dst", help="output path; .gz compresses")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--scale", type=float, help="how many copies of the source (fractions allowed)")
    g.add_argument("--target-mib", type=float, help="pick the scale that gives about this many MiB decompressed")
    p.add_argument("--rank", type=int, help="set distributedInfo.rank")
    p.add_argument("--world-size", type=int, help="set distributedInfo.world_size")
    p.add_argument("--layout", choices=LAYOUTS, default="indent")
    p.add_argument("--gzip-level", type=int, default=6)
    args = p.parse_args(argv)
    source = load(args.src)
    scale = args.scale
    if scale is None:
        scale = args.target_mib * (1 << 20) / copy_bytes(args.src, args.layout, source)
    res = scale_trace(args.src, args.dst, scale, args.rank, args.world_size, args.layout,
                      args.gzip_level, source)
    sys.stdout.write(orjson.dumps(asdict(res)).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
