"""Collectives of one rank: what ran, how big, how fast, and how much was exposed.

Each collective kernel is matched to the host call that issued it (the
``record_param_comms``/``nccl:*`` range on the launching thread that contains the
launch), which gives its type, process group and message size. Kernels without such
a record are named from the kernel name (``ncclKernel_AllReduce_...``).

Bandwidth follows nccl-tests: ``algbw = bytes / time`` and ``busbw = algbw * factor``
with factor ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter
and all_to_all, and 1 for broadcast and reduce.
"""

from __future__ import annotations

import functools
import re

import msgspec
import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.hostwork import thread_axis
from gpuidle.analysis.idle import DeviceIdle
from gpuidle.analysis.steps import StepWindow
from gpuidle.model import I64, CollectiveStat, CommReport, DeviceOpKind, Timeline
from gpuidle.model.arrays import median_of, runs
from gpuidle.model.comm_kernels import canonical_op, kernel_collective

_DTYPES = [
    (re.compile(r"^(b?float16|bf16|c10::bfloat16)$|bfloat|_bf16", re.I), "bfloat16"),
    (re.compile(r"^(half|float16|f16|c10::half)$|_f16\b|_half\b|_fp16", re.I), "float16"),
    (re.compile(r"^(float|float32|f32)$|_f32\b|_float\b", re.I), "float32"),
    (re.compile(r"^(double|float64|f64)$|_f64\b|_double\b", re.I), "float64"),
    (re.compile(r"^(char|signed char|int8|int8_t)$|_i8\b|_int8_t\b", re.I), "int8"),
    (re.compile(r"^(byte|unsigned char|uint8|uint8_t|bool)$|_u8\b|_uint8_t\b", re.I), "uint8"),
    (re.compile(r"^(int|int32|int32_t)$|_i32\b|_int32_t\b", re.I), "int32"),
    (re.compile(r"^(long|long int|int64|int64_t)$|_i64\b|_int64_t\b", re.I), "int64"),
    (re.compile(r"float8|fp8|e4m3|e5m2", re.I), "float8"),
]
"""Element types as traces spell them (``record_param_comms``' ``Float``/``BFloat16``/``Byte``, ``Input type``,
the ``_bf16``/``_f32``/``_int8_t`` of NCCL kernel names), one spelling each."""
SIZE_BUCKETS = [(1 << 10, "<1KiB"), (64 << 10, "1KiB-64KiB"), (1 << 20, "64KiB-1MiB"),
                (16 << 20, "1MiB-16MiB"), (256 << 20, "16MiB-256MiB"), (1 << 62, ">=256MiB")]


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor for ``n`` ranks."""
    if n <= 1:
        return 0.0 if collective != "broadcast" and collective != "reduce" else 1.0
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@functools.lru_cache(maxsize=4096)
def canonical_dtype(name: str) -> str:
    """``float32``, ``bfloat16``, ``int8``...; ``unknown`` where the name says none."""
    for pattern, canon in _DTYPES:
        if pattern.search(name.strip()):
            return canon
    return "unknown"


def size_bucket(nbytes: int) -> str:
    for limit, label in SIZE_BUCKETS:
        if nbytes < limit:
            return label
    return SIZE_BUCKETS[-1][1]


class Collectives(msgspec.Struct, frozen=True):
    """One row per collective kernel in the window."""

    op: I64
    """Row in ``tl.device_ops``."""
    device: np.ndarray
    start: I64
    end: I64
    collective: list[str]
    process_group: list[str]
    nbytes: I64
    """Message size (-1 unknown): the larger of input and output, as nccl-tests counts it."""
    group_size: np.ndarray
    step: np.ndarray
    """Step index of the launch (or start) inside the window."""
    dtype: list[str]
    """Element type on the wire (:func:`canonical_dtype`): the call's, else the kernel name's."""


def find_collectives(tl: Timeline, window: StepWindow, launchers: I64) -> Collectives:
    ops, host, calls = tl.device_ops, tl.host, tl.collectives
    rows = np.flatnonzero((ops.kind == DeviceOpKind.COLLECTIVE) & (ops.start < window.end) & (ops.end > window.start))
    rows = rows[np.argsort(ops.start[rows], kind="stable")]
    kinds = [kernel_collective(tl.strings[int(n)]) for n in ops.name[rows]]
    dtypes = [canonical_dtype(tl.strings[int(n)]) for n in ops.name[rows]]
    groups = [""] * rows.size
    nbytes = np.full(rows.size, -1, dtype=np.int64)
    gsize = np.full(rows.size, -1, dtype=np.int32)
    call = _issuing_call(tl, launchers, rows)
    for i, c in enumerate(call):
        if c < 0:
            continue
        if calls.collective[c]:
            kinds[i] = canonical_op(calls.collective[c])
        groups[i] = calls.process_group[c]
        if c < len(calls.dtype) and canonical_dtype(calls.dtype[c]) != "unknown":
            dtypes[i] = canonical_dtype(calls.dtype[c])
        nbytes[i] = max(calls.in_bytes[c], calls.out_bytes[c])
        gsize[i] = calls.group_size[c]
    default_n = tl.meta.world_size or -1
    gsize = np.where(gsize > 0, gsize, default_n).astype(np.int32)
    when = np.where(launchers[rows] >= 0, host.start[np.maximum(launchers[rows], 0)], ops.start[rows])
    step = np.clip(np.searchsorted(window.bounds, when, side="right") - 1, 0, window.bounds.size - 2)
    return Collectives(rows, ops.device[rows], ops.start[rows], ops.end[rows], kinds, groups, nbytes, gsize, step,
                       dtypes)


def _issuing_call(tl: Timeline, launchers: I64, rows: I64) -> I64:
    """For each collective kernel, the collective call whose host range contains its launch (same thread, ends
    included); of several, the first that names its collective, then the first that knows its size:
    ``record_param_comms`` and the ``nccl:*`` range nested in it both contain the launch, and only one of them may
    carry the sizes or the name (an older ``record_param_comms`` names none: its ``nccl:all_to_all`` tells that
    NCCL's ``SendRecv`` kernel under it is an all-to-all).

    All at once: the launches sorted by (thread, time), each call covers a run of them (two binary searches), and
    each launch keeps the call of least rank in that order among those covering it."""
    calls, host = tl.collectives, tl.host
    out = np.full(rows.size, -1, dtype=np.int64)
    launch = launchers[rows]
    linked = np.flatnonzero(launch >= 0)
    if len(calls) == 0 or linked.size == 0:
        return out
    unnamed = np.fromiter((not c for c in calls.collective), dtype=bool, count=len(calls))
    order = np.argsort(2 * unnamed + ~((calls.in_bytes >= 0) | (calls.out_bytes >= 0)), kind="stable")
    h = calls.host_index[order]
    on_axis = thread_axis(host)
    point = on_axis(launch[linked], host.start[launch[linked]])
    by_time = np.argsort(point, kind="stable")
    point = point[by_time]
    first = np.searchsorted(point, on_axis(h, host.start[h]), side="left")
    rank, covered = runs(first, np.searchsorted(point, on_axis(h, host.end[h]), side="right") - first)
    best = np.full(point.size, h.size, dtype=np.int64)
    np.minimum.at(best, covered, rank)
    found = best < h.size
    out[linked[by_time[found]]] = order[best[found]]
    return out


def comm_report(tl: Timeline, window: StepWindow, devices: list[DeviceIdle], coll: Collectives) -> CommReport:
    """``exposed``: collective time with no compute kernel, copy or set beside it (the idle charged to
    communication); ``overlap_ratio``: HTA's, compute kernels only (copies and sets do not count)."""
    ops = tl.device_ops
    comm_ns = sum(iv.total(d.comm) for d in devices)
    overlap_ns = sum(iv.total(iv.intersect(d.comm, d.busy)) for d in devices)
    kernel_overlap_ns = 0
    for d in devices:
        k = (ops.device == d.device) & (ops.kind == DeviceOpKind.KERNEL)
        kernels = iv.clip(iv.union(ops.start[k], ops.end[k]), d.window[0], d.window[1])
        kernel_overlap_ns += iv.total(iv.intersect(d.comm, kernels))
    exposed_ns = comm_ns - overlap_ns
    dur = coll.end - coll.start
    buckets = [size_bucket(int(b)) if b > 0 else "unknown" for b in coll.nbytes]
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for i, key in enumerate(zip(coll.collective, coll.process_group, buckets, coll.dtype, strict=True)):
        groups.setdefault(key, []).append(i)
    out: list[CollectiveStat] = []
    for (k, g, bucket, dtype), rows in groups.items():
        idx = np.array(rows)
        sized = idx[coll.nbytes[idx] > 0]
        nbytes, timed = int(coll.nbytes[sized].sum()), int(dur[sized].sum())
        algbw = nbytes / timed if timed else None  # bytes per ns is GB/s
        n = int(median_of(coll.group_size[sized])) if sized.size else -1
        out.append(CollectiveStat(
            collective=k, process_group=g, size_bucket=bucket, count=idx.size, total_s=int(dur[idx].sum()) / 1e9,
            bytes=nbytes, algbw_gbps=algbw,
            busbw_gbps=algbw * bus_factor(k, n) if (algbw is not None and n > 0) else None, dtype=dtype,
        ))
    out.sort(key=lambda c: -c.total_s)
    hist: dict[str, int] = {}
    for b in buckets:
        if b != "unknown":
            hist[b] = hist.get(b, 0) + 1
    return CommReport(
        comm_s=comm_ns / 1e9,
        exposed_s=exposed_ns / 1e9,
        overlap_ratio=(kernel_overlap_ns / comm_ns) if comm_ns else None,
        overlap_ratio_with_copies=(overlap_ns / comm_ns) if comm_ns else None,
        collectives=out,
        per_step_count=len(coll.op) / max(len(window.steps), 1),
        size_histogram=hist,
    )


def exposed_by_collective(coll: Collectives, under: tuple[I64, I64, I64], bounds: I64) -> list[dict[str, float]]:
    """Per step, the exposed-communication segments split by the collective running (``kind:dtype``); ``under``:
    the segments with their collective (:func:`collective_under`)."""
    s, e, row = under
    return split_by_key(s, e, row, [f"{c}:{d}" for c, d in zip(coll.collective, coll.dtype, strict=True)], bounds)


def split_by_key(s: I64, e: I64, row: I64, keys: list[str], bounds: I64) -> list[dict[str, float]]:
    """Per step, the segments' time (s) by ``keys[row]``; segments with row -1 are left out."""
    n_steps = bounds.size - 1
    out: list[dict[str, float]] = [{} for _ in range(n_steps)]
    hit = row >= 0
    if not hit.any():
        return out
    names = sorted(set(keys))
    index = {k: i for i, k in enumerate(names)}
    key_of = np.array([index[k] for k in keys], dtype=np.int64)[row[hit]]
    step = np.clip(np.searchsorted(bounds, s[hit], side="right") - 1, 0, n_steps - 1)
    sums = np.bincount(step * len(names) + key_of, weights=(e - s)[hit], minlength=n_steps * len(names))
    for flat in np.flatnonzero(sums).tolist():
        out[flat // len(names)][names[flat % len(names)]] = float(sums[flat]) / 1e9
    return out


def collective_under(coll: Collectives, device: int, seg: tuple[I64, I64], bounds: I64) -> tuple[I64, I64, I64]:
    """The segments ``seg`` cut at every collective's ends and at ``bounds``, each with the row (into ``coll``) of
    the collective running on ``device`` then, -1 where none runs; where several run at once, the one that
    started first (the later ones queued behind it: collectives of one process group run one at a time)."""
    on = np.flatnonzero(coll.device == device)
    on = on[np.argsort(coll.start[on], kind="stable")]
    s, e, _ = iv.label_segments(iv.union(*seg), [(coll.start[on], coll.end[on])], extra_points=bounds)
    # segments are cut at every call's ends, so call j covers the segments [first[j], last[j]); in start order,
    # the earliest call covering segment i is the first j whose running maximum of ``last`` passes i, if it
    # started by then (first[j] <= i)
    if on.size == 0 or s.size == 0:
        return s, e, np.full(s.size, -1, dtype=np.int64)
    first = np.searchsorted(s, coll.start[on], side="left")
    last = np.searchsorted(s, coll.end[on], side="left")
    i = np.arange(s.size)
    started = np.searchsorted(first, i, side="right")
    earliest = np.searchsorted(np.maximum.accumulate(last), i, side="right")
    row = np.where(earliest < started, on[np.minimum(earliest, on.size - 1)], -1)
    return s, e, row.astype(np.int64)
