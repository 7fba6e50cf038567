"""Read PyTorch profiler (Kineto) Chrome traces into a :class:`~gpuidle.model.Timeline`.

Both schemas are read: the old categories (``Kernel``, ``Runtime``, ``Operator``,
``Memcpy``, ``Memset``, GPU ``tid`` like ``"stream 7"``) and the new ones (``kernel``,
``cuda_runtime``, ``cuda_driver``, ``cpu_op``, ``user_annotation``, ``gpu_memcpy``,
``gpu_memset``). ROCm traces use the same categories with HIP names. Unknown
categories are ignored.

Only the fields used are decoded (typed msgspec structs), chunk by chunk, straight
into numpy columns; no per-event object survives a chunk.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from gpuidle.errors import CorruptInput, NoGpuActivity, NotATrace
from gpuidle.model import (
    I64,
    CollectiveCalls,
    CopyKind,
    DeviceOpKind,
    DeviceOps,
    HostEvents,
    HostKind,
    Steps,
    Timeline,
    TraceMeta,
)
from gpuidle.sources.jsonstream import TraceStream
from gpuidle.sources.kernel_arch import kernel_arch_by_device
from gpuidle.sources.kineto_events import (
    EMPTY_ARGS,
    I32_MAX,
    I32_MIN,
    I64_MAX,
    Args,
    Event,
    fit,
    fits_int32,
    int64,
)
from gpuidle.sources.kineto_events import decode_chunk as _decode_chunk

FORMAT = "kineto"

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
_COLLECTIVE_KERNEL = re.compile(r"^(nccl|rccl)\w*kernel|^ncclDevKernel|^ncclKernel", re.IGNORECASE)
_STREAM_TID = re.compile(r"stream\s*([0-9]{1,18})(?![0-9])", re.IGNORECASE)
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "half": 2, "float16": 2, "bfloat16": 2,
    "bf16": 2, "c10::half": 2, "c10::bfloat16": 2, "double": 8, "float64": 8, "long": 8,
    "int64": 8, "long int": 8, "char": 1, "int8": 1, "byte": 1, "uint8": 1, "bool": 1,
    "short": 2, "int16": 2, "complexfloat": 8, "complexdouble": 16, "unsigned char": 1, "signed char": 1,
    "uint8_t": 1, "int8_t": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def copy_kind(name: str) -> CopyKind:
    """Classify a copy from its Kineto name, e.g. ``Memcpy HtoD (Pageable -> Device)``."""
    if "HtoD" in name:
        if "Pageable" in name:
            return CopyKind.HTOD_PAGEABLE
        return CopyKind.HTOD_PINNED if "Pinned" in name else CopyKind.HTOD
    if "DtoH" in name:
        if "Pageable" in name:
            return CopyKind.DTOH_PAGEABLE
        return CopyKind.DTOH_PINNED if "Pinned" in name else CopyKind.OTHER
    if "DtoD" in name or "PtoP" in name:
        return CopyKind.DTOD
    return CopyKind.OTHER


def dtype_bytes(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype.strip().lower(), -1)


def is_collective_kernel(name: str) -> bool:
    return bool(_COLLECTIVE_KERNEL.search(name))


def _to_ns(us: npt.NDArray[np.float64]) -> I64:
    """µs (float, possibly fractional) to int64 ns without losing large integer parts."""
    whole = np.floor(us)
    ns: I64 = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)
    return ns


_CODE = {**{c: int(k) for c, k in _DEVICE_CATS.items()}, **{c: 10 + int(k) for c, k in _HOST_CATS.items() if k >= 0}}
"""Category -> 0..3 device kind, or 10 + host kind; anything else is skipped."""


class _Columns:
    """Columns built chunk by chunk with one comprehension per field, no per-event branching.

    Names and threads are interned through dicts whose insertion order is the id order.
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
        code = np.array([_CODE.get(e.cat, -1) for e in events], dtype=np.int8)
        coded = np.flatnonzero(code >= 0)
        code[coded[np.array([events[i].ph != "X" for i in coded], dtype=bool)]] = -1  # only complete events
        if not self.dev["ts"]:  # no GPU activity yet: remember categories of other accelerators
            self.foreign.update(c for c in {e.cat for e in events} if _FOREIGN_ACCELERATOR.match(c))
        sid = self.string_ids
        known = len(sid)
        dev_rows = np.flatnonzero((code >= 0) & (code < 10))
        if dev_rows.size:
            evs = [events[i] for i in dev_rows]
            args = [e.args or EMPTY_ARGS for e in evs]
            ts, dur = self._times(evs)
            pid, bad_pid = int64([e.pid if type(e.pid) is int else 0 for e in evs])
            device, bad_device = int64([a.device for a in args])
            bad_pid &= device < 0  # the pid names the device only where args do not
            device = np.where(device >= 0, device, pid)
            stream, bad_stream = int64([a.stream if type(a.stream) is int and a.stream >= 0 else _stream_of(e)
                                         for a, e in zip(args, evs, strict=True)])
            corr, bad_corr = int64([a.correlation for a in args])
            nbytes, bad_bytes = int64([a.bytes for a in args])
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
                d["name"].append(np.array([sid.setdefault(e.name, len(sid)) for e in evs], dtype=np.int64))
                d["corr"].append(corr)
                d["bytes"].append(nbytes)
        host_rows = np.flatnonzero(code >= 10)
        if host_rows.size:
            evs = [events[i] for i in host_rows]
            ts, dur = self._times(evs)
            corr, bad_corr = int64([(e.args or EMPTY_ARGS).correlation for e in evs])
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
                names = np.array([sid.setdefault(e.name, len(sid)) for e in evs], dtype=np.int64)
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

    @staticmethod
    def _times(evs: list[Event]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        return np.array([e.ts for e in evs], dtype=np.float64), np.array([e.dur for e in evs], dtype=np.float64)

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


_STEP = re.compile(r"^ProfilerStep#([0-9]{1,18})$")
"""Step numbers past 18 digits do not fit the model's int64 and are not steps."""


def read(path: str, progress: Callable[[int, int], None] | None = None) -> Timeline:
    """Read one Kineto trace file.

    :raises CorruptInput: truncated gzip, invalid JSON.
    :raises NotATrace: JSON that is not a Chrome trace, or a trace of a non-GPU accelerator.
    :raises NoGpuActivity: a trace with no kernels, copies or sets.
    """
    cols = _Columns()
    stream = TraceStream(path, _decode_chunk, progress)
    for chunk in stream:
        cols.add(chunk)
    header = stream.header
    skipped = [f"{n} events skipped: {reason} (first: {first})" for reason, (n, first) in cols.skipped.items()]
    if not cols.dev["ts"]:
        if cols.foreign:
            raise NotATrace(
                f"{path}: a trace of a non-GPU accelerator ({', '.join(sorted(cols.foreign))} events)",
                "gpuidle analyses CUDA and ROCm GPU traces",
            )
        if skipped:
            raise CorruptInput(f"{path}: no usable GPU events; {'; '.join(skipped)}",
                               "the file is damaged or was not written by the profiler")
        if cols.events == 0 and not header:
            raise NotATrace(f"{path}: the trace holds no events", "was the profiler started?")
        raise NoGpuActivity(
            f"{path}: no GPU activity in this trace (CPU-only: {cols.hosts} host events, 0 kernels)",
            "profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] on a GPU run",
        )
    d = {k: np.concatenate(v) for k, v in cols.dev.items()}
    h = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.host.items()}
    strings = cols.strings
    t0_us = float(np.floor(min(d["ts"].min(), h["ts"].min() if h["ts"].size else np.inf)))
    end_us = max(float((d["ts"] + d["dur"]).max()), float((h["ts"] + h["dur"]).max()) if h["ts"].size else 0.0)
    if end_us - t0_us > MAX_SPAN_US:
        raise CorruptInput(f"{path}: the events span {(end_us - t0_us) / 86400e6:.0f} days "
                           f"(from ts {t0_us:.0f} to {end_us:.0f} µs)",
                           "timestamps from different clocks, or a damaged file; a profile covers seconds")
    dstart = _to_ns(d["ts"] - t0_us)
    hstart = _to_ns(h["ts"] - t0_us)
    names = d["name"].astype(np.int32)
    # per distinct name, not per event: collective kernels and copy kinds
    collective_name = np.fromiter((is_collective_kernel(n) for n in strings), dtype=bool, count=len(strings))
    copy_of_name = np.fromiter((copy_kind(n) for n in strings), dtype=np.int8, count=len(strings))
    kind = d["kind"].astype(np.int8)
    kind[(kind == DeviceOpKind.KERNEL) & collective_name[names]] = DeviceOpKind.COLLECTIVE
    device_ops = DeviceOps(
        start=dstart, end=dstart + np.maximum(_to_ns(d["dur"]), 0),
        device=d["device"].astype(np.int32),
        stream=d["stream"].astype(np.int32),
        kind=kind,
        name=names,
        correlation=d["corr"].astype(np.int64),
        copy_kind=np.where(kind == DeviceOpKind.MEMCPY, copy_of_name[names], CopyKind.NONE).astype(np.int8),
        nbytes=d["bytes"].astype(np.int64),
    )
    host = HostEvents(
        start=hstart, end=hstart + np.maximum(_to_ns(h["dur"]), 0),
        thread=h["thread"].astype(np.int32),
        kind=h["kind"].astype(np.int8),
        name=h["name"].astype(np.int32),
        correlation=h["corr"].astype(np.int64),
    )
    c = cols.coll
    collectives = CollectiveCalls(
        host_index=np.asarray(c["host"], dtype=np.int64),
        collective=c["name"], process_group=c["group"],
        in_bytes=np.asarray(c["inb"], dtype=np.int64),
        out_bytes=np.asarray(c["outb"], dtype=np.int64),
        group_size=np.asarray(c["size"], dtype=np.int32), dtype=c["dtype"],
    )
    meta = _meta(path, header, int(t0_us) * 1000)
    _match_only_device(meta, np.unique(device_ops.device))
    meta.kernel_arch = kernel_arch_by_device(strings, device_ops)
    meta.notes.extend(skipped)
    return Timeline(
        strings=strings, threads=cols.threads, device_ops=device_ops, host=host,
        collectives=collectives, steps=_profiler_steps(strings, host), meta=meta,
    )


def _profiler_steps(strings: list[str], host: HostEvents) -> Steps:
    """``ProfilerStep#N`` ranges on the host; GPU-side copies of them are not host events."""
    numbers = {i: int(m.group(1)) for i, s in enumerate(strings) if (m := _STEP.match(s))}
    empty = np.zeros(0, dtype=np.int64)
    if not numbers:
        return Steps(empty, empty, empty, "none")
    ids = np.fromiter(numbers.keys(), dtype=np.int32)
    rows = np.flatnonzero(np.isin(host.name, ids))
    rows = rows[np.argsort(host.start[rows], kind="stable")]
    number = np.array([numbers[int(n)] for n in host.name[rows]], dtype=np.int64)
    # one range per step number: a step recorded twice (two threads) keeps the first
    _, first = np.unique(number, return_index=True)
    rows, number = rows[np.sort(first)], number[np.sort(first)]
    return Steps(number, host.start[rows].copy(), host.end[rows].copy(), "profiler_step")


def _match_only_device(meta: TraceMeta, devices: npt.NDArray[np.int32]) -> None:
    """A trace of one device whose index is not among the ``deviceProperties`` ids (a process that sees one
    GPU, numbered by the host): the properties of the only device listed, or of the only name listed, are its."""
    if devices.size != 1 or int(devices[0]) in meta.device_names or not meta.device_names:
        return
    names = set(meta.device_names.values())
    caps = set(meta.device_capability.values())
    if len(names) != 1:
        return
    d, listed = int(devices[0]), len(meta.device_names)
    meta.device_names[d] = names.pop()
    if len(caps) == 1:
        meta.device_capability[d] = caps.pop()
    meta.notes.append(f"device {d} is not among the deviceProperties ids: its properties are those of the "
                      f"{'only device' if listed == 1 else f'{listed} identical devices'} listed")


def _is_int(value: Any, least: int) -> bool:
    """A rank, world size or device id: an int (not a bool) from ``least`` up to int32."""
    return type(value) is int and least <= value <= I32_MAX


def _meta(path: str, header: dict[str, Any], t0_ns: int) -> TraceMeta:
    meta = TraceMeta(path=path, format=FORMAT, t0_ns=t0_ns)
    info = header.get("distributedInfo")
    if isinstance(info, dict):
        rank, world = info.get("rank"), info.get("world_size")
        meta.rank = rank if _is_int(rank, 0) else None
        meta.world_size = world if _is_int(world, 1) else None
        for key, value, kept in (("rank", rank, meta.rank), ("world_size", world, meta.world_size)):
            if value is not None and kept is None:
                meta.notes.append(f"distributedInfo.{key} {str(value)[:40]!r} is not a count: ignored")
        backend = info.get("backend")
        meta.backend = backend if isinstance(backend, str) else None
        groups = info.get("pg_config")
        if isinstance(groups, list):
            meta.process_groups = [g for g in groups if isinstance(g, dict)]
    if meta.rank is None:
        meta.notes.append("the trace records no rank (distributedInfo.rank): taken as rank 0")
    meta.header_flags = {k: header[k] for k in ("with_stack", "record_shapes", "profile_memory", "with_flops")
                         if isinstance(header.get(k), int | bool | str)}
    props = header.get("deviceProperties")
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and _is_int(p.get("id"), 0) and isinstance(p.get("name"), str):
                meta.device_names[p["id"]] = p["name"]
                if _is_int(p.get("computeMajor"), 0) and _is_int(p.get("computeMinor"), 0):
                    meta.device_capability[p["id"]] = f"{p['computeMajor']}.{p['computeMinor']}"
    return meta
