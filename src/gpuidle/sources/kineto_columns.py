"""A chunk's Kineto events as numpy columns: the model's device ops, host events and collectives.

A chunk arrives either as columns read by the compiled scanner (:class:`~gpuidle.sources.kineto_scan.Scanned`)
or as decoded events; both give the same columns, ids and skipped counts. Names and threads get ids in the order
they first appear, device events before host events within a chunk; chunks built elsewhere (another process) are
merged in the file's order and re-interned, so the ids are those one serial read gives.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import filterfalse, islice, repeat
from operator import attrgetter, ne
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from gpuidle.errors import CorruptInput
from gpuidle.model import I64, DeviceOpKind, HostKind
from gpuidle.model.arrays import distinct
from gpuidle.model.name_search import found_in
from gpuidle.sources.kineto_events import (
    EMPTY_ARGS,
    I32_MAX,
    I32_MIN,
    I64_MAX,
    Args,
    Event,
    decode_args,
    fit,
    fits_int32,
    float_field,
    int64,
    int64_field,
)
from gpuidle.sources.kineto_scan import Scanned

MAX_TS_US = float(1 << 62) / 1000
"""The latest timestamp read, in µs (year 2116 as Unix time): nanoseconds past it overflow int64."""
MAX_SPAN_US = 7 * 86400 * 1e6
"""The longest event, and the longest stretch of time one trace may cover: a week, far past any profile."""


def check_span(path: str, first_ns: int, last_ns: int) -> None:
    """Raise where a trace's events run from ``first_ns`` to ``last_ns`` over more than :data:`MAX_SPAN_US`: a
    damaged timestamp (every reader refuses it alike).

    :raises CorruptInput: the span, in days.
    """
    if last_ns - first_ns > MAX_SPAN_US * 1000:
        raise CorruptInput(f"{path}: the events span {(last_ns - first_ns) / 86400e9:.0f} days (from {first_ns} to "
                           f"{last_ns} ns)", "timestamps from different clocks, or a damaged file; a profile covers "
                           "seconds")


SKIP_TIME = "ts or dur missing, not a finite number, negative or out of range"
SKIP_ID = "an id or size (pid, device, stream, correlation, bytes) past its integer range"


_DEVICE_CATS = {
    "kernel": DeviceOpKind.KERNEL,
    "Kernel": DeviceOpKind.KERNEL,
    "gpu_memcpy": DeviceOpKind.MEMCPY,
    "Memcpy": DeviceOpKind.MEMCPY,
    "gpu_memset": DeviceOpKind.MEMSET,
    "Memset": DeviceOpKind.MEMSET,
}
DEVICE_RANGE = 9
"""The code of a range on a device's own timeline (``gpu_user_annotation``: a ``record_function`` range as the
device ran it): read as a device row (its device and stream where a kernel's are), kept apart from the work."""
_DEVICE_RANGE_CATS = {"gpu_user_annotation": DEVICE_RANGE}
_HOST_CATS = {
    "cpu_op": HostKind.OP,
    "Operator": HostKind.OP,
    "cuda_runtime": HostKind.RUNTIME,
    "Runtime": HostKind.RUNTIME,
    "cuda_driver": HostKind.RUNTIME,
    "user_annotation": HostKind.ANNOTATION,
    "python_function": HostKind.PYTHON,
}
_FOREIGN_ACCELERATOR = re.compile(r"^(mtia|xpu|hpu|tpu|npu|mps)_", re.IGNORECASE)
_STREAM_TID = re.compile(r"stream\s*([0-9]{1,18})(?![0-9])", re.IGNORECASE)
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "half": 2, "float16": 2, "bfloat16": 2,
    "bf16": 2, "c10::half": 2, "c10::bfloat16": 2, "double": 8, "float64": 8, "long": 8,
    "int64": 8, "long int": 8, "char": 1, "int8": 1, "byte": 1, "uint8": 1, "bool": 1,
    "short": 2, "int16": 2, "complexfloat": 8, "complexdouble": 16, "unsigned char": 1, "signed char": 1,
    "uint8_t": 1, "int8_t": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}



def dtype_bytes(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype.strip().lower(), -1)



_CAT, _PH, _NAME = attrgetter("cat"), attrgetter("ph"), attrgetter("name")

COLLECTIVE_CALL = re.compile(r"^record_param_comms\Z|^nccl:")
"""Host ranges of collectives whose args carry the call's sizes and group (read as the events are)."""
_CODE = {**{c: int(k) for c, k in _DEVICE_CATS.items()}, **_DEVICE_RANGE_CATS,
         **{c: 10 + int(k) for c, k in _HOST_CATS.items() if k >= 0}}
"""Category -> 0..3 device kind, :data:`DEVICE_RANGE`, or 10 + host kind; anything else is skipped."""


def _by_string(strings: list[str], used: npt.NDArray[np.int32], value: Callable[[str], Any],
               dtype: type) -> np.ndarray:
    """``value`` of each string a column uses, by string id (the others zero): a chunk's strings are mostly names,
    of which a category or phase column uses none."""
    out: npt.NDArray[Any] = np.zeros(len(strings), dtype)
    ids = np.flatnonzero(np.bincount(used, minlength=len(strings)))
    out[ids] = [value(strings[i]) for i in ids.tolist()]
    return out


class Columns:
    """Columns built chunk by chunk with one comprehension per field, no per-event branching.

    Names and threads are interned through dicts whose insertion order is the id order: the order
    of first appearance, device events before host events within a chunk.
    """

    def __init__(self) -> None:
        self.string_ids: dict[str, int] = {}
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        self.dev: dict[str, list[np.ndarray]] = {k: [] for k in
                                                 ("ts", "dur", "device", "stream", "kind", "name", "corr", "bytes")}
        self.host: dict[str, list[np.ndarray]] = {k: [] for k in ("ts", "dur", "thread", "kind", "name", "corr")}
        self.coll: dict[str, list[Any]] = {k: [] for k in ("host", "name", "group", "inb", "outb", "size", "dtype")}
        self.foreign: set[str] = set()
        self._collective_ids: set[int] = set()
        self.events = 0
        self.hosts = 0
        self.skipped: dict[str, list[Any]] = {}
        """Reason -> [events skipped, the first one]."""

    @property
    def strings(self) -> list[str]:
        return list(self.string_ids)

    @property
    def threads(self) -> list[tuple[str, str]]:
        return [(str(p), str(t)) for p, t in self.thread_ids]

    def add(self, chunk: Scanned | list[Event]) -> None:
        """Append one chunk's events, scanned or decoded."""
        if isinstance(chunk, Scanned):
            self._add_scanned(chunk)
        else:
            self._add_events(chunk)

    def done_adding(self) -> None:
        """Drop what only adding needs, before the columns travel to another process."""
        self._collective_ids.clear()

    def _add_events(self, events: list[Event]) -> None:
        self.events += len(events)
        code = np.fromiter(map(_CODE.get, map(_CAT, events), repeat(-1)), np.int8, len(events))
        coded = np.flatnonzero(code >= 0)
        phases = map(_PH, map(events.__getitem__, coded.tolist()))
        code[coded[np.fromiter(map(ne, phases, repeat("X")), bool, coded.size)]] = -1  # only complete events
        if not self.dev["ts"]:  # no GPU activity yet: remember categories of other accelerators
            self.foreign.update(c for c in set(map(_CAT, events)) if _FOREIGN_ACCELERATOR.match(c))
        known = len(self.string_ids)
        dev_rows = np.flatnonzero((code >= 0) & (code < 10))
        if dev_rows.size:
            evs = [events[i] for i in dev_rows]
            args = [e.args or EMPTY_ARGS for e in evs]
            ts, dur = float_field(evs, "ts"), float_field(evs, "dur")
            pid, bad_pid = int64([e.pid if type(e.pid) is int else 0 for e in evs])
            device, bad_device = int64_field(args, "device")
            bad_pid &= device < 0  # the pid names the device only where args do not
            device = np.where(device >= 0, device, pid)
            stream, bad_stream = int64([a.stream if type(a.stream) is int and a.stream >= 0 else _stream_of(e)
                                         for a, e in zip(args, evs, strict=True)])
            corr, bad_corr = int64_field(args, "correlation")
            nbytes, bad_bytes = int64_field(args, "bytes")
            bad_id = bad_pid | bad_device | bad_stream | bad_corr | bad_bytes | ~fits_int32(device) \
                | ~fits_int32(stream)
            keep = self._keep(lambda i: _described(evs[i].name, evs[i].ts, evs[i].dur), ts, dur, bad_id)
            if keep is not None:
                evs = [evs[i] for i in keep]
                ts, dur = ts[keep], dur[keep]
                device, stream, corr, nbytes = device[keep], stream[keep], corr[keep], nbytes[keep]
                dev_rows = dev_rows[keep]
            if evs:  # some may have been skipped
                self._append(self.dev, ts=ts, dur=dur, device=device, stream=stream, kind=code[dev_rows],
                             name=self._name_ids(list(map(_NAME, evs))), corr=corr, bytes=nbytes)
        host_rows = np.flatnonzero(code >= 10)
        if host_rows.size:
            evs = [events[i] for i in host_rows]
            ts, dur = float_field(evs, "ts"), float_field(evs, "dur")
            corr, bad_corr = int64_field([e.args or EMPTY_ARGS for e in evs], "correlation")
            keep = self._keep(lambda i: _described(evs[i].name, evs[i].ts, evs[i].dur), ts, dur, bad_corr)
            if keep is not None:
                evs = [evs[i] for i in keep]
                ts, dur, corr = ts[keep], dur[keep], corr[keep]
                host_rows = host_rows[keep]
            if evs:
                kind = code[host_rows] - 10
                names = self._name_ids(list(map(_NAME, evs)))
                threads = self._thread_ids([e.pid for e in evs], [e.tid for e in evs])
                self._append(self.host, ts=ts, dur=dur, thread=threads, kind=kind, name=names,
                             corr=np.where(kind == HostKind.RUNTIME, corr, -1))
                for i in self._collective_rows(known, names):
                    e = evs[i]
                    if e.args is not None:
                        self._collective(self.hosts + i, e.name, e.args)
                self.hosts += len(evs)

    def _add_scanned(self, s: Scanned) -> None:
        """As :meth:`_add_events`, from the scanner's columns. The scanner reads only integers within int64, so
        the only ids out of the model's range here are devices and streams past int32."""
        self.events += len(s)
        strings = s.strings
        code = _by_string(strings, s.cat, lambda x: _CODE.get(x, -1), np.int8)[s.cat]
        code[_by_string(strings, s.ph, lambda x: x != "X", bool)[s.ph]] = -1  # only complete events
        if not self.dev["ts"]:  # no GPU activity yet: remember categories of other accelerators
            self.foreign.update(c for c in map(strings.__getitem__, distinct(s.cat).tolist())
                                if _FOREIGN_ACCELERATOR.match(c))
        known = len(self.string_ids)

        def described(rows: I64) -> Callable[[int], str]:
            return lambda i: _described(strings[s.name[rows[i]]], float(s.ts[rows[i]]), float(s.dur[rows[i]]))

        dev_rows = np.flatnonzero((code >= 0) & (code < 10))
        if dev_rows.size:
            ts, dur = s.ts[dev_rows], s.dur[dev_rows]
            device = s.device[dev_rows]
            device = np.where(device >= 0, device, np.where(s.pid_s[dev_rows] < 0, s.pid[dev_rows], 0))
            stream = s.stream[dev_rows].copy()
            unnamed = np.flatnonzero(stream < 0)
            if unnamed.size:  # old traces name the stream in the tid
                stream[unnamed] = _streams_of_tids(strings, s.tid_s[dev_rows[unnamed]], s.tid[dev_rows[unnamed]])
            keep = self._keep(described(dev_rows), ts, dur, ~fits_int32(device) | ~fits_int32(stream))
            if keep is not None:
                ts, dur, device, stream, dev_rows = ts[keep], dur[keep], device[keep], stream[keep], dev_rows[keep]
            if dev_rows.size:
                self._append(self.dev, ts=ts, dur=dur, device=device, stream=stream, kind=code[dev_rows],
                             name=self._scanned_name_ids(strings, s.name[dev_rows]), corr=s.corr[dev_rows],
                             bytes=s.nbytes[dev_rows])
        host_rows = np.flatnonzero(code >= 10)
        if host_rows.size:
            ts, dur = s.ts[host_rows], s.dur[host_rows]
            keep = self._keep(described(host_rows), ts, dur, np.zeros(host_rows.size, bool))
            if keep is not None:
                ts, dur, host_rows = ts[keep], dur[keep], host_rows[keep]
            if host_rows.size:
                kind = code[host_rows] - 10
                names = self._scanned_name_ids(strings, s.name[host_rows])
                threads = self._scanned_thread_ids(s, host_rows)
                self._append(self.host, ts=ts, dur=dur, thread=threads, kind=kind, name=names,
                             corr=np.where(kind == HostKind.RUNTIME, s.corr[host_rows], -1))
                for i in self._collective_rows(known, names):
                    row = int(host_rows[i])
                    if s.args_lo[row] >= 0:
                        args = decode_args(s.text[s.args_lo[row]:s.args_hi[row]])
                        self._collective(self.hosts + i, strings[s.name[row]], args)
                self.hosts += int(host_rows.size)

    @staticmethod
    def _append(table: dict[str, list[np.ndarray]], **columns: np.ndarray) -> None:
        for key, values in columns.items():
            table[key].append(values)

    def _collective_rows(self, known: int, names: I64) -> list[int]:
        """Rows (of ``names``) that are collectives; ``known``: the names known before this chunk."""
        sid = self.string_ids
        last = len(sid) - 1  # the names new in this chunk are the dict's last, read from its end
        new = list(islice(reversed(sid), len(sid) - known))
        self._collective_ids.update((last - np.flatnonzero(found_in(new, COLLECTIVE_CALL))).tolist())
        if not self._collective_ids:
            return []
        return np.flatnonzero(np.isin(names, list(self._collective_ids))).tolist()

    def merge(self, part: Columns) -> None:
        """Append the columns of the next chunk, built elsewhere: its names and threads re-interned here."""
        if not self.dev["ts"]:
            self.foreign |= part.foreign
        sid, tids = self.string_ids, self.thread_ids
        names = np.array([sid.setdefault(n, len(sid)) for n in part.string_ids], dtype=np.int64)
        threads = np.array([tids.setdefault(t, len(tids)) for t in part.thread_ids], dtype=np.int64)
        for key, arrays in part.dev.items():
            self.dev[key].extend(names[a] if key == "name" else a for a in arrays)
        for key, arrays in part.host.items():
            self.host[key].extend(names[a] if key == "name" else threads[a] if key == "thread" else a for a in arrays)
        for key, values in part.coll.items():
            self.coll[key].extend([self.hosts + i for i in values] if key == "host" else values)
        for reason, (n, first) in part.skipped.items():
            self.skipped.setdefault(reason, [0, first])[0] += n
        self.events += part.events
        self.hosts += part.hosts

    def _keep(self, describe: Callable[[int], str], ts: npt.NDArray[np.float64], dur: npt.NDArray[np.float64],
              bad_id: npt.NDArray[np.bool_]) -> I64 | None:
        """Rows to keep when some events hold values the model cannot (None: keep all); the others are counted,
        the first of each reason described by ``describe(row)``."""
        with np.errstate(invalid="ignore"):
            bad_time = ~((ts >= 0) & (ts <= MAX_TS_US) & (dur >= 0) & (dur <= MAX_SPAN_US))  # NaN compares False
        bad = bad_time | bad_id
        if not bad.any():
            return None
        for reason, rows in ((SKIP_TIME, np.flatnonzero(bad_time)), (SKIP_ID, np.flatnonzero(bad_id & ~bad_time))):
            if rows.size:
                self.skipped.setdefault(reason, [0, describe(int(rows[0]))])[0] += rows.size
        return np.flatnonzero(~bad)

    def _name_ids(self, names: list[str]) -> I64:
        """Each event's name id; new names numbered in the order they first appear."""
        sid = self.string_ids
        for name in dict.fromkeys(names):
            if name not in sid:
                sid[name] = len(sid)
        return np.fromiter(map(sid.__getitem__, names), np.int64, len(names))

    def _scanned_name_ids(self, strings: list[str], local: npt.NDArray[np.int32]) -> I64:
        """As :meth:`_name_ids`, from ids into the chunk's own ``strings``: each distinct name looked up once."""
        distinct, first = np.unique(local, return_index=True)
        order = distinct[np.argsort(first)]
        names = list(map(strings.__getitem__, order.tolist()))
        sid = self.string_ids
        fresh = list(filterfalse(sid.__contains__, names))  # distinct, in the order they first appear
        sid.update(zip(fresh, range(len(sid), len(sid) + len(fresh)), strict=True))
        ids = np.zeros(len(strings), np.int64)
        ids[order] = np.fromiter(map(sid.__getitem__, names), np.int64, len(names))
        return ids[local]

    def _thread_ids(self, pid: list[int | str], tid: list[int | str]) -> I64:
        """Thread index per event. Events come in runs of one thread, so the interning is per run, not per event
        (integer pids and tids compared as arrays; any string, as the values themselves)."""
        p, t = np.array(pid), np.array(tid)
        if p.dtype.kind == "i" and t.dtype.kind == "i":
            starts = _run_starts(_changes(p, t))
        else:
            pairs = list(zip(pid, tid, strict=True))
            starts = _run_starts(np.fromiter(map(ne, pairs[1:], pairs), bool, len(pid) - 1))
        return self._runs(starts, [(pid[i], tid[i]) for i in starts.tolist()], len(pid))

    def _scanned_thread_ids(self, s: Scanned, rows: I64) -> I64:
        """As :meth:`_thread_ids`, from the scanner's columns: a string pid or tid (``pid_s``, ``tid_s``) is its
        string, an integer one its value."""
        cols = s.pid[rows], s.pid_s[rows], s.tid[rows], s.tid_s[rows]
        strings = s.strings
        starts = _run_starts(_changes(*cols))
        keys = [(strings[ps] if ps >= 0 else p, strings[ts] if ts >= 0 else t)
                for p, ps, t, ts in zip(*(c[starts].tolist() for c in cols), strict=True)]
        return self._runs(starts, keys, rows.size)

    def _runs(self, starts: I64, keys: list[tuple[int | str, int | str]], n: int) -> I64:
        """Each row's thread id, from the first row and thread of each run."""
        tids = self.thread_ids
        ids = np.array([tids.setdefault(k, len(tids)) for k in keys], dtype=np.int64)
        return np.repeat(ids, np.diff(np.append(starts, n)))

    def _collective(self, index: int, name: str, a: Args) -> None:
        size = dtype_bytes(a.dtype) if a.dtype else -1
        inb = a.in_nelems * size if (a.in_nelems >= 0 and size > 0) else -1
        outb = a.out_nelems * size if (a.out_nelems >= 0 and size > 0) else -1
        coll = a.collective or (name[5:] if name.startswith("nccl:") else "")
        dtype = a.dtype
        if inb < 0 and bytes(a.input_dims):  # older traces: nccl:<op> with Input Dims/type
            inb = _bytes_from_dims(bytes(a.input_dims), bytes(a.input_type))
            dtype = dtype or _first_type(bytes(a.input_type))
        c = self.coll
        c["host"].append(index)
        c["name"].append(coll)
        c["group"].append(a.group)
        c["inb"].append(fit(inb))
        c["outb"].append(fit(outb))
        c["size"].append(a.group_size if I32_MIN <= a.group_size <= I32_MAX else -1)
        c["dtype"].append(dtype[:40])


def _first_type(types_raw: bytes) -> str:
    """The first element type of an ``Input type`` list (a collective moves one type)."""
    try:
        types = msgspec.json.decode(types_raw) if types_raw else []
    except (msgspec.DecodeError, RecursionError):
        return ""
    if not isinstance(types, list):
        return ""
    return next((t for t in types if isinstance(t, str) and dtype_bytes(t) > 0), "")


def _stream_of(e: Event) -> int:
    """Old traces name the stream in the tid (``"stream 7"``) rather than in args."""
    return _stream_in(e.tid) if isinstance(e.tid, str) else e.tid


def _stream_in(tid: str) -> int:
    m = _STREAM_TID.search(tid)
    return int(m.group(1)) if m else 0


def _streams_of_tids(strings: list[str], tid_s: npt.NDArray[np.int32], tid: I64) -> I64:
    """:func:`_stream_of` for scanned events: a string tid's stream (each distinct tid read once), else the tid."""
    named = tid_s >= 0
    if not named.any():
        return tid
    streams = {i: _stream_in(strings[i]) for i in distinct(tid_s[named]).tolist()}
    return np.where(named, [streams.get(i, 0) for i in tid_s.tolist()], tid)


def _changes(*columns: np.ndarray) -> npt.NDArray[np.bool_]:
    """Where a row differs from the one before it in any column (one entry fewer than rows)."""
    change = np.zeros(max(columns[0].size - 1, 0), bool)
    for c in columns:
        change |= c[1:] != c[:-1]
    return change


def _run_starts(change: npt.NDArray[np.bool_]) -> I64:
    """The first row of each run of equal rows, given where rows change."""
    return np.concatenate(([0], np.flatnonzero(change) + 1)).astype(np.int64)


def _described(name: str, ts: float, dur: float) -> str:
    """A skipped event, as the count of skipped events names its first one."""
    return f"{name[:60]!r} ts={ts!r} dur={dur!r}"


def _bytes_from_dims(dims_raw: bytes, types_raw: bytes) -> int:
    try:
        dims = msgspec.json.decode(dims_raw)
        types = msgspec.json.decode(types_raw) if types_raw else []
    except (msgspec.DecodeError, RecursionError):
        return -1
    if not isinstance(dims, list) or not isinstance(types, list):
        return -1
    total = 0
    for shape, dtype in zip(dims, types, strict=False):
        if not isinstance(shape, list) or not shape or not isinstance(dtype, str):
            continue
        size = dtype_bytes(dtype)
        if size < 0 or not all(isinstance(d, int) and 0 <= d <= I64_MAX for d in shape):
            continue
        n = 1
        for d in shape:
            n *= d
        total += n * size
    return fit(total) if total > 0 else -1
