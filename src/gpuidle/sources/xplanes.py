"""Decode an XSpace into planes of column arrays: from ``*.xplane.pb`` or from its Chrome-trace JSON.

An XSpace (what ``jax.profiler.trace`` and ``tf.profiler.experimental`` write, one file per host)
holds a plane per device (``/device:GPU:0``) and one for the host (``/host:CPU``); each plane has
lines (device streams, host threads) of events whose names and stat names sit in per-plane
metadata tables. The ``.pb`` is decoded with the protobuf runtime against the published schema
(``xplane/xplane.proto``); ``jax.profiler.trace(..., create_perfetto_trace=True)`` also writes
the same space as Chrome-trace JSON (a process per plane, a thread per line, stats as ``args``),
read here into the same columns. Only the stats gpuidle uses are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from gpuidle.errors import CorruptInput, GpuidleError, NotATrace
from gpuidle.model import I64
from gpuidle.sources.jsonstream import TraceStream
from gpuidle.sources.kineto_columns import MAX_SPAN_US, MAX_TS_US

CORRELATION = "correlation_id"
STEP = "step_num"
HLO_OP = "hlo_op"
HLO_MODULE = "hlo_module"
MODULE_NAME = "module_name"
MEMCPY_DETAILS = "memcpy_details"
FLOW_STATS = ("_p", "_pt", "_c", "_ct")
_KEPT = {CORRELATION, STEP, HLO_OP, HLO_MODULE, MODULE_NAME, MEMCPY_DETAILS, *FLOW_STATS}
_BYTES = re.compile(r"(?:size|num_bytes|bytes):\s*(\d+)")


class ProtobufMissing(GpuidleError):
    """The protobuf runtime is not installed: XSpace profiles cannot be decoded."""


@dataclass(slots=True)
class Line:
    """One XLine (a device stream or a host thread), one entry per event; times in ns."""

    id: int
    name: str
    start: I64
    end: I64
    name_id: I64
    """Index into :attr:`Space.strings`."""
    correlation: I64
    step: I64
    """``step_num`` of a step marker; -1 elsewhere."""
    hlo_op: I64
    """String id of the ``hlo_op`` stat (or ``module_name``); -1."""
    nbytes: I64
    producer: I64
    """Flow id this event produces (``_pt``/``_p`` interned), -1 none."""
    consumer: I64


@dataclass(slots=True)
class Plane:
    name: str
    stats: dict[str, Any]
    lines: list[Line]


@dataclass(slots=True)
class Space:
    planes: list[Plane]
    hostnames: list[str]
    strings: list[str]
    events: int
    """Events decoded (all lines)."""
    notes: list[str] = field(default_factory=list)


class _Builder:
    """Interns names and flow ids across planes and turns per-line lists into arrays."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sid: dict[str, int] = {}
        self.flows: dict[tuple[int, int], int] = {}
        self.events = 0

    def intern(self, s: str) -> int:
        return self.sid.setdefault(s, len(self.sid))

    def flow(self, kind: Any, ident: Any) -> int:
        try:
            key = (int(kind), int(ident))
        except (TypeError, ValueError):
            return -1
        return self.flows.setdefault(key, len(self.flows))

    def line(self, ident: int, name: str, start: I64, end: I64, names: list[int],
             stats: dict[int, dict[str, Any]]) -> Line:
        n = start.size
        self.events += n
        cols = {k: np.full(n, -1, dtype=np.int64) for k in
                ("corr", "step", "op", "bytes", "producer", "consumer")}
        for row, st in stats.items():
            _put(cols, row, st, self)
        return Line(ident, name, start, end, np.asarray(names, dtype=np.int64), cols["corr"], cols["step"],
                    cols["op"], cols["bytes"], cols["producer"], cols["consumer"])


def _int(v: Any) -> int:
    """A stat's integer value; -1 where it holds no number (text), None-free.

    :raises OverflowError: infinity, or a number beyond 64 bits.
    """
    try:
        n = int(v)
    except (TypeError, ValueError):
        try:
            n = int(float(v))
        except (TypeError, ValueError):
            return -1
    if not -(1 << 63) <= n < 1 << 63:
        raise OverflowError(f"{n} is beyond 64 bits")
    return n


def _stat_int(st: dict[str, Any], name: str, b: _Builder) -> int:
    """Stat ``name`` of an event as an integer (:func:`_int`).

    :raises CorruptInput: a value no 64-bit integer holds (infinity, 2⁶⁴ − 1 as a step number).
    """
    try:
        return _int(st[name])
    except OverflowError:
        shown = str(st[name]) if len(str(st[name])) <= 40 else str(st[name])[:37] + "..."
        raise CorruptInput(f"{b.path}: an event's {name} stat is {shown}, beyond a 64-bit integer",
                           "a damaged profile; record it again") from None


def _put(cols: dict[str, I64], row: int, st: dict[str, Any], b: _Builder) -> None:
    if CORRELATION in st:
        cols["corr"][row] = _stat_int(st, CORRELATION, b)
    if STEP in st:
        cols["step"][row] = _stat_int(st, STEP, b)
    op = st.get(HLO_OP) or st.get(MODULE_NAME)
    if op:
        cols["op"][row] = b.intern(str(op))
    if st.get(HLO_MODULE):  # interned only: the module names (jit_train_step) tell the framework
        b.intern(str(st[HLO_MODULE]))
    if MEMCPY_DETAILS in st and (m := _BYTES.search(str(st[MEMCPY_DETAILS]))) and len(m.group(1)) < 19:
        cols["bytes"][row] = int(m.group(1))
    if "_p" in st:
        cols["producer"][row] = b.flow(st.get("_pt", 0), st["_p"])
    if "_c" in st:
        cols["consumer"][row] = b.flow(st.get("_ct", 0), st["_c"])


# ----------------------------------------------------------------------------------
# *.xplane.pb
# ----------------------------------------------------------------------------------


def _xplane_module() -> Any:
    try:
        from gpuidle.sources.xplane import xplane_pb2
    except ImportError as err:
        raise ProtobufMissing("reading XSpace profiles (*.xplane.pb) needs the protobuf runtime",
                              "pip install 'gpuidle[xspace]'") from err
    return xplane_pb2


def _stat_value(stat: Any, stat_names: dict[int, str]) -> Any:
    which = stat.WhichOneof("value")
    if which is None:
        return None
    value = getattr(stat, which)
    return stat_names.get(value, "") if which == "ref_value" else value


def read_pb(path: str) -> Space:
    """Decode one ``.xplane.pb``.

    :raises CorruptInput: bytes that do not parse as the XSpace message (truncated, another message).
    :raises NotATrace: a message that parses but holds no host or device plane.
    """
    pb = _xplane_module()
    from google.protobuf.message import DecodeError

    with open(path, "rb") as f:
        data = f.read()
    space = pb.XSpace()
    try:
        space.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise CorruptInput(f"{path}: not a readable XSpace protobuf ({err})",
                           "a truncated or foreign .pb; profile again with jax.profiler.trace") from None
    if not any(p.name.startswith(("/host:", "/device:")) for p in space.planes):
        raise NotATrace(f"{path}: a protobuf message, but no XSpace planes in it",
                        "give the <host>.xplane.pb that jax.profiler / tf.profiler wrote")
    b = _Builder(path)
    planes = [_plane(p, b) for p in space.planes]
    return Space(planes, list(space.hostnames), list(b.sid), b.events, [f"profiler error: {e}" for e in space.errors])


def _plane(p: Any, b: _Builder) -> Plane:
    stat_names = {int(k): v.name for k, v in p.stat_metadata.items()}
    kept = {k: n for k, n in stat_names.items() if n in _KEPT}
    name_ids = {int(k): b.intern(v.name) for k, v in p.event_metadata.items()}
    stats = {stat_names.get(s.metadata_id, ""): _stat_value(s, stat_names) for s in p.stats}
    lines = []
    for ln in p.lines:
        # one pass per line: every access to an event builds a Python wrapper, so each is touched once
        off: list[int] = []
        dur: list[int] = []
        names: list[int] = []
        ev_stats: dict[int, dict[str, Any]] = {}
        for e in ln.events:
            if e.num_occurrences:  # an aggregated count carries no time
                continue
            if kept and (e_stats := e.stats):
                st = {kept[s.metadata_id]: _stat_value(s, stat_names) for s in e_stats if s.metadata_id in kept}
                if st:
                    ev_stats[len(off)] = st
            off.append(e.offset_ps)
            dur.append(e.duration_ps)
            names.append(name_ids.get(e.metadata_id, -1))
        base = ln.timestamp_ns
        if off and base + (max(off) + max(dur)) // 1000 >= 1 << 63:
            raise CorruptInput(f"{b.path}: line '{ln.name}' of plane '{p.name}' has an event past 64-bit nanoseconds "
                               f"(timestamp_ns {base}, offset_ps {max(off)}, duration_ps {max(dur)})",
                               "a damaged profile; record it again")
        offs, durs = np.asarray(off, dtype=np.int64), np.maximum(np.asarray(dur, dtype=np.int64), 0)
        start = base + offs // 1000
        # in whole ns and the picoseconds' carry: offset + duration in ps may pass int64 where their ns do not
        end = start + durs // 1000 + (offs % 1000 + durs % 1000) // 1000
        if -1 in names:
            names = [n if n >= 0 else b.intern("") for n in names]
        lines.append(b.line(int(ln.id), ln.display_name or ln.name, start, end, names, ev_stats))
    return Plane(p.name, stats, lines)


# ----------------------------------------------------------------------------------
# *.trace.json.gz written from an XSpace (xprof's trace viewer JSON)
# ----------------------------------------------------------------------------------


class _JsonEvent(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int = 0
    tid: int = 0
    args: dict[str, Any] = {}


_json_events = msgspec.json.Decoder(list[_JsonEvent])
def _decode_json_chunk(text: bytes) -> list[_JsonEvent]:
    try:
        return _json_events.decode(text)
    except msgspec.ValidationError as err:
        raise msgspec.DecodeError(str(err)) from None


def _check_times(path: str, events: list[_JsonEvent], us: np.ndarray, dur: np.ndarray) -> None:
    """Raise on the first event whose ``ts`` or ``dur`` is no time: not finite, past int64 nanoseconds, or a
    duration longer than a trace may cover."""
    with np.errstate(invalid="ignore"):
        bad = ~((np.abs(us) <= MAX_TS_US) & (dur <= MAX_SPAN_US))  # NaN compares False
    if bad.any():
        e = events[int(np.flatnonzero(bad)[0])]
        raise CorruptInput(f"{path}: event '{e.name[:60]}' has ts {e.ts} µs and dur {e.dur} µs: not a time",
                           "a damaged file; export the profile again")


def read_json(path: str) -> Space:
    """Read the Chrome-trace JSON that xprof writes from an XSpace into the same planes.

    Times are µs with ns fractions; a process is a plane (``process_name``), a thread a line
    (``thread_name``); stats are the events' ``args`` (strings or numbers).
    """
    stream = TraceStream(path, _decode_json_chunk)
    process: dict[int, str] = {}
    thread: dict[tuple[int, int], str] = {}
    rows: dict[tuple[int, int], list[_JsonEvent]] = {}
    for chunk in stream:
        for e in chunk:
            if e.ph == "M":
                label = str(e.args.get("name", ""))
                if e.name == "process_name":
                    process[e.pid] = label
                elif e.name == "thread_name":
                    thread[(e.pid, e.tid)] = label
            elif e.ph == "X":
                rows.setdefault((e.pid, e.tid), []).append(e)
    if not process:
        raise NotATrace(f"{path}: a Chrome trace without XSpace planes (no process_name events)")
    b = _Builder(path)
    planes: dict[int, Plane] = {pid: Plane(name, {}, []) for pid, name in process.items()}
    for (pid, tid), events in rows.items():
        if pid not in planes:
            continue
        us = np.array([e.ts for e in events], dtype=np.float64)
        dur = np.array([e.dur for e in events], dtype=np.float64)
        _check_times(path, events, us, dur)
        whole = np.floor(us)  # µs to ns without losing the integer part of large timestamps
        start = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)
        end = start + np.rint(np.maximum(dur, 0.0) * 1000.0).astype(np.int64)
        names = [b.intern(e.name) for e in events]
        stats = {i: {k: v for k, v in e.args.items() if k in _KEPT} for i, e in enumerate(events) if e.args}
        stats = {i: st for i, st in stats.items() if st}
        planes[pid].lines.append(b.line(tid, thread.get((pid, tid), str(tid)), start, end, names, stats))
    return Space(list(planes.values()), [], list(b.sid), b.events)
