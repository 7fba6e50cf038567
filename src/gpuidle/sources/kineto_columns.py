"""Kineto events to numpy columns, chunk by chunk: in this process, or on every core for a big trace.

The reader's stream (:mod:`gpuidle.sources.jsonstream`) cuts the event list into chunks of a few
MiB. A small trace's chunks are decoded and turned into columns here, one at a time. A big one's
are only inflated and cut here, then decoded and turned into columns in worker processes, a few
chunks in flight; the columns come back in the file's order and are merged: names and threads
re-interned, so the ids are those a serial read gives. No per-event object crosses a process:
only the chunk's text out and its arrays back. Those cuts are taken on trust (a ``},{`` inside a
string or a nested object is not an event's end): a chunk that does not decode starts the read
again with each cut checked here for its syntax (a scan that creates no objects, and fails
exactly where the typed decoder would), so a cut inside an event, and bad bytes, are found and
worded as a serial read finds and words them.
"""

from __future__ import annotations

import os
import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from operator import attrgetter, ne
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import numpy.typing as npt

from gpuidle.errors import CorruptInput, GpuidleError
from gpuidle.model import I64, DeviceOpKind, HostKind
from gpuidle.sources.inputs import is_url
from gpuidle.sources.jsonstream import TraceStream
from gpuidle.sources.kineto_events import (
    EMPTY_ARGS,
    I32_MAX,
    I32_MIN,
    I64_MAX,
    Args,
    Event,
    decode_chunk,
    fit,
    fits_int32,
    float_field,
    int64,
    int64_field,
)

if TYPE_CHECKING:
    from concurrent.futures import Future

MAX_TS_US = float(1 << 62) / 1000
"""The latest timestamp read, in µs (year 2116 as Unix time): nanoseconds past it overflow int64."""
MAX_SPAN_US = 7 * 86400 * 1e6
"""The longest event, and the longest stretch of time one trace may cover: a week, far past any profile."""
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
_CODE = {**{c: int(k) for c, k in _DEVICE_CATS.items()}, **{c: 10 + int(k) for c, k in _HOST_CATS.items() if k >= 0}}
"""Category -> 0..3 device kind, or 10 + host kind; anything else is skipped."""


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

    def add(self, events: list[Event]) -> None:
        self.events += len(events)
        code = np.fromiter(map(_CODE.get, map(_CAT, events), repeat(-1)), np.int8, len(events))
        coded = np.flatnonzero(code >= 0)
        phases = map(_PH, map(events.__getitem__, coded.tolist()))
        code[coded[np.fromiter(map(ne, phases, repeat("X")), bool, coded.size)]] = -1  # only complete events
        if not self.dev["ts"]:  # no GPU activity yet: remember categories of other accelerators
            self.foreign.update(c for c in set(map(_CAT, events)) if _FOREIGN_ACCELERATOR.match(c))
        sid = self.string_ids
        known = len(sid)
        dev_rows = np.flatnonzero((code >= 0) & (code < 10))
        if dev_rows.size:
            evs = [events[i] for i in dev_rows]
            args = [e.args or EMPTY_ARGS for e in evs]
            ts, dur = self._times(evs)
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
            keep = self._keep(evs, ts, dur, bad_id)
            if keep is not None:
                evs = [evs[i] for i in keep]
                ts, dur = ts[keep], dur[keep]
                device, stream, corr, nbytes = device[keep], stream[keep], corr[keep], nbytes[keep]
                dev_rows = dev_rows[keep]
            if evs:  # some may have been skipped
                d = self.dev
                d["ts"].append(ts)
                d["dur"].append(dur)
                d["device"].append(device)
                d["stream"].append(stream)
                d["kind"].append(code[dev_rows])
                d["name"].append(self._name_ids(evs))
                d["corr"].append(corr)
                d["bytes"].append(nbytes)
        host_rows = np.flatnonzero(code >= 10)
        if host_rows.size:
            evs = [events[i] for i in host_rows]
            ts, dur = self._times(evs)
            corr, bad_corr = int64_field([e.args or EMPTY_ARGS for e in evs], "correlation")
            keep = self._keep(evs, ts, dur, bad_corr)
            if keep is not None:
                evs = [evs[i] for i in keep]
                ts, dur, corr = ts[keep], dur[keep], corr[keep]
                host_rows = host_rows[keep]
            if evs:
                h = self.host
                h["ts"].append(ts)
                h["dur"].append(dur)
                h["thread"].append(self._thread_ids(evs))
                kind = code[host_rows] - 10
                h["kind"].append(kind)
                names = self._name_ids(evs)
                h["name"].append(names)
                h["corr"].append(np.where(kind == HostKind.RUNTIME, corr, -1))
                self._collective_ids.update(known + i for i, n in enumerate(list(sid)[known:])
                                            if n == "record_param_comms" or n.startswith("nccl:"))
                if self._collective_ids:
                    for i in np.flatnonzero(np.isin(names, list(self._collective_ids))):
                        e = evs[i]
                        if e.args is not None:
                            self._collective(self.hosts + int(i), e.name, e.args)
                self.hosts += len(evs)

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

    @staticmethod
    def _times(evs: list[Event]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        return float_field(evs, "ts"), float_field(evs, "dur")

    def _keep(self, evs: list[Event], ts: npt.NDArray[np.float64], dur: npt.NDArray[np.float64],
              bad_id: npt.NDArray[np.bool_]) -> I64 | None:
        """Rows to keep when some events hold values the model cannot (None: keep all); the others are counted."""
        with np.errstate(invalid="ignore"):
            bad_time = ~((ts >= 0) & (ts <= MAX_TS_US) & (dur >= 0) & (dur <= MAX_SPAN_US))  # NaN compares False
        bad = bad_time | bad_id
        if not bad.any():
            return None
        for reason, rows in ((SKIP_TIME, np.flatnonzero(bad_time)), (SKIP_ID, np.flatnonzero(bad_id & ~bad_time))):
            if rows.size:
                e = evs[int(rows[0])]
                self.skipped.setdefault(reason, [0, f"{e.name[:60]!r} ts={e.ts!r} dur={e.dur!r}"])[0] += rows.size
        return np.flatnonzero(~bad)

    def _name_ids(self, evs: list[Event]) -> I64:
        """Each event's name id; new names numbered in the order they first appear."""
        names = list(map(_NAME, evs))
        sid = self.string_ids
        for name in dict.fromkeys(names):
            if name not in sid:
                sid[name] = len(sid)
        return np.fromiter(map(sid.__getitem__, names), np.int64, len(names))

    def _thread_ids(self, evs: list[Event]) -> I64:
        """Thread index per event. Events come in runs of one thread, so with integer pid/tid the
        interning is per run, not per event."""
        tids = self.thread_ids
        pid = np.array([e.pid for e in evs])
        tid = np.array([e.tid for e in evs])
        if pid.dtype.kind != "i" or tid.dtype.kind != "i":
            return np.array([tids.setdefault((e.pid, e.tid), len(tids)) for e in evs], dtype=np.int64)
        key = pid.astype(np.int64) * (1 << 32) + (tid.astype(np.int64) & 0xFFFFFFFF)
        starts = np.concatenate(([0], np.flatnonzero(key[1:] != key[:-1]) + 1))
        ids = np.array([tids.setdefault((evs[i].pid, evs[i].tid), len(tids)) for i in starts], dtype=np.int64)
        return np.repeat(ids, np.diff(np.append(starts, key.size)))

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
    m = _STREAM_TID.search(str(e.tid))
    return int(m.group(1)) if m else (e.tid if type(e.tid) is int else 0)


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


def columns_of(text: bytes) -> Columns:
    """One chunk's columns (a worker's task): the chunk's own ids, merged in order by :meth:`Columns.merge`."""
    cols = Columns()
    cols.add(decode_chunk(text))
    cols._collective_ids.clear()  # only needed while adding
    return cols


PARALLEL_FROM = 32 << 20
"""File bytes from which a trace is read on every core (a gzip trace of that size holds some 200 to 400 MiB
of JSON): below, starting the workers costs about what they save."""
WORKERS_ENV = "GPUIDLE_READ_WORKERS"
"""Processes to decode one trace with, whatever its size (1: in this process); worker processes never fan out."""
_SYNTAX = msgspec.json.Decoder(list[msgspec.Raw])


def read_workers(path: str) -> int:
    """Processes to decode ``path`` with: every core for a big local trace on Linux; 1 (this process) for a
    small one, a remote one (its size would cost a request of its own), elsewhere than Linux, or when this is
    itself a worker (a rank of a job, a Dask task). The process pool's modules load only when a pool is used."""
    if sys.platform != "linux":  # workers are forked: safe on Linux only
        return 1
    given = os.environ.get(WORKERS_ENV, "").strip()
    if given:
        try:
            workers = max(1, int(given))
        except ValueError:
            raise GpuidleError(f"{WORKERS_ENV}={given!r} is not a number of processes",
                               "unset it, or give a whole number (1: read in this process)") from None
    else:
        try:
            if is_url(path) or os.path.getsize(path) < PARALLEL_FROM:
                return 1
        except OSError:  # missing or unreadable: the stream says so in its own words
            return 1
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers > 1:
        import multiprocessing

        if multiprocessing.parent_process() is not None:  # a worker forking workers of its own could deadlock
            return 1
    return workers


def _checked(text: bytes) -> bytes:
    """The chunk itself once its syntax holds; else the typed decoder's own error, as a serial read gives it."""
    try:
        _SYNTAX.decode(text)
    except msgspec.DecodeError:
        decode_chunk(text)  # raises the same error, worded as the typed decoder words it
        raise
    return text


def _unchecked(text: bytes) -> bytes:
    return text


class _Recheck(Exception):
    """A worker could not decode its chunk: a cut inside an event, or bad bytes. Read again, checking each cut."""


def read_columns(path: str, progress: Callable[[int, int], None] | None = None) -> tuple[Columns, dict[str, Any]]:
    """Every chunk's columns, merged in the file's order, and the file's header.

    On every core the cuts are first taken on trust: this process only inflates and cuts, and the workers decode.
    A chunk a worker cannot decode (its cut fell inside an event, or the file is damaged) sends the read back to
    the start with every cut checked here before it is sent: the reading, cuts and errors of a serial read.
    """
    workers = read_workers(path)
    if workers == 1:
        stream: TraceStream[Any] = TraceStream(path, decode_chunk, progress)
        cols = Columns()
        for events in stream:
            cols.add(events)
        return cols, stream.header
    try:
        return _read_on(workers, TraceStream(path, _unchecked, progress), path, trusted=True)
    except _Recheck:
        return _read_on(workers, TraceStream(path, _checked, progress), path, trusted=False)


def _read_on(workers: int, stream: TraceStream[bytes], path: str, trusted: bool) -> tuple[Columns, dict[str, Any]]:
    cols = Columns()
    for part in _in_order(stream, workers, path, trusted):
        cols.merge(part)
    return cols, stream.header


def _in_order(texts: Iterable[bytes], workers: int, path: str, trusted: bool) -> Iterator[Columns]:
    """The chunks' columns from a pool of ``workers`` processes, two chunks in flight per worker.

    ``trusted``: the chunks' cuts were not checked; a chunk that does not decode raises :class:`_Recheck`, and so
    does an error of the stream itself while a chunk before it does not decode (the serial read meets that first).
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # fork: the workers start at once with this module loaded, and need no ``if __name__ == "__main__"``
    # guard in the caller's script (spawn and forkserver import the caller's main module again)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    pending: deque[Future[Columns]] = deque()
    try:
        try:
            for text in texts:
                pending.append(pool.submit(columns_of, text))
                if len(pending) >= 2 * workers:
                    yield _result(pending.popleft(), path, trusted)
        except GpuidleError:
            for future in pending:  # an earlier chunk's own error comes first in the file
                _result(future, path, trusted)
            raise
        while pending:
            yield _result(pending.popleft(), path, trusted)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _result(future: Future[Columns], path: str, trusted: bool) -> Columns:
    try:
        return future.result()
    except (msgspec.DecodeError, RecursionError) as err:
        if trusted:
            raise _Recheck from None
        raise CorruptInput(f"{path}: invalid JSON in the event list ({err})",
                           "the file is damaged or truncated") from None
