"""What a host operator spends its time on: launching device work, or its own CPU work.

An operator that issues launches is *launching* while the host time it takes outside its
runtime calls stays within what dispatching that many launches costs
(:data:`DISPATCH_BUDGET_NS` each: the dispatcher, Python, the allocator). One that takes far longer per launch (a
``_foreach_*`` over thousands of tensors, a scripted ``forward`` doing host work, cuDNN
heuristics) is doing CPU work: its *self time*, outside the operators and runtime calls
nested in it, is ``cpu_compute``, and only its children can be launching.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.model import I32, I64, HostEvents, HostKind, Timeline
from gpuidle.model.arrays import distinct, runs

DISPATCH_BUDGET_NS = 100_000
"""Host time an eager operator may take per launch it issues (PyTorch eager: 10-100 µs)."""


def thread_axis(host: HostEvents) -> Callable[[I64, I64], I64]:
    """Host times on one axis, thread after thread: ``(rows, times)`` -> ``thread * span + (time - low)``, so that
    one sort orders rows by thread, then time, and one binary search finds a time among one thread's rows."""
    low = int(min(host.start.min(), host.end.min(), 0))
    span = int(max(host.start.max(), host.end.max())) - low + 1

    def on_axis(rows: I64, times: I64) -> I64:
        key: I64 = host.thread[rows].astype(np.int64) * span + (times - low)
        return key

    return on_axis


def calls_inside(tl: Timeline, launchers: I64, candidates: np.ndarray) -> tuple[I64, I64]:
    """For each host row among ``candidates``: how many launches its own thread issued inside its range, and the
    summed duration of the runtime calls its thread made inside it (the launch and copy calls themselves, measured
    apart from the operator's own work); zeros elsewhere. One sort of the runtime calls by (thread, start) serves
    both: a row's calls are a run of them, found by two binary searches, and counted by running sums."""
    host = tl.host
    launches = np.zeros(len(host), dtype=np.int64)
    runtime = np.zeros(len(host), dtype=np.int64)
    calls = np.flatnonzero(host.kind == HostKind.RUNTIME)
    rows = np.flatnonzero(candidates)
    if calls.size == 0 or rows.size == 0:
        return launches, runtime
    on_axis = thread_axis(host)
    key = on_axis(calls, host.start[calls])
    order = np.argsort(key, kind="stable")
    calls, key = calls[order], key[order]
    is_launch = np.zeros(len(host), dtype=bool)
    is_launch[launchers[launchers >= 0]] = True
    launched = np.concatenate(([0], np.cumsum(is_launch[calls])))
    spent = np.concatenate(([0], np.cumsum(host.end[calls] - host.start[calls])))
    first = np.searchsorted(key, on_axis(rows, host.start[rows]), side="left")
    past = np.searchsorted(key, on_axis(rows, host.end[rows]), side="left")
    launches[rows] = launched[past] - launched[first]
    runtime[rows] = spent[past] - spent[first]
    return launches, runtime


def self_time(start: I64, end: I64, thread: I32, rows: I64, nested: I64) -> iv.Intervals:
    """The parts of each range in ``rows`` that no other range of ``nested`` inside it (same thread) covers, as
    possibly overlapping intervals (their union is what counts).

    Per thread, all rows at once: each row's nested ranges are found by two binary searches among the thread's
    ranges sorted by start, then every row is moved onto a lane of its own (its start at the lane's, the lanes
    a row's length apart and one more), so that one union and one labelling give every row's gaps at once.
    """
    out_s: list[I64] = [iv.EMPTY[0]]
    out_e: list[I64] = [iv.EMPTY[1]]
    rows = rows[end[rows] > start[rows]]
    nested = nested[end[nested] > start[nested]]
    nested_thread = thread[nested]
    for t in distinct(thread[rows]).tolist():
        inner = nested[nested_thread == t]
        inner = inner[np.argsort(start[inner], kind="stable")]
        mine = rows[thread[rows] == t]
        width = int((end[mine] - start[mine]).max()) + 1
        batch = max(1, LANE_LIMIT // width)
        for at in range(0, mine.size, batch):
            gaps = _gaps(start, end, inner, mine[at: at + batch], width)
            out_s.append(gaps[0])
            out_e.append(gaps[1])
    return np.concatenate(out_s), np.concatenate(out_e)


LANE_LIMIT = 1 << 62
"""The lanes of :func:`self_time` stay below this many nanoseconds (int64), a batch of rows at a time."""


def _gaps(start: I64, end: I64, inner: I64, rows: I64, width: int) -> iv.Intervals:
    """Each of ``rows`` less the ranges of ``inner`` (sorted by start) that lie inside it, ``rows`` on lanes."""
    lo, hi = start[rows], end[rows]
    i_start = start[inner]
    first = np.searchsorted(i_start, lo, side="left")
    count = np.searchsorted(i_start, hi, side="left") - first
    lane, at = runs(first, count)
    child = inner[at]
    inside = (end[child] <= hi[lane]) & (child != rows[lane])
    lane, child = lane[inside], child[inside]
    shift = np.arange(rows.size, dtype=np.int64) * width - lo
    children = iv.union(start[child] + shift[lane], end[child] + shift[lane])
    seg_s, seg_e, label = iv.label_segments((lo + shift, hi + shift), [children], extra_points=None)
    free = label == 1
    seg_s, seg_e = seg_s[free], seg_e[free]
    back = shift[seg_s // width]
    return seg_s - back, seg_e - back


def innermost(start: I64, end: I64, rows: I64, points: I64) -> I64:
    """For each point, the row (among ``rows``: nested ranges, Python frames) of the innermost range covering
    it, -1 where none does: of the ranges that hold the point, the one that starts last (of equal starts, the
    shortest). Nested ranges close innermost first, so this is the frame open at the point; ranges of several
    threads that overlap without nesting get the latest-started one."""
    out = np.full(points.size, -1, dtype=np.int64)
    if rows.size == 0 or points.size == 0:
        return out
    order = rows[np.lexsort((-end[rows], start[rows]))]
    # the ranges started by each point are order[:stop]: the last of them still open holds it
    stop = np.searchsorted(start[order], points, side="right")
    at = _last_above(end[order], stop, points)
    found = at >= 0
    out[found] = order[at[found]]
    return out


BLOCK = 32
"""Width of the blocks :func:`_last_above` scans at once, and of the groups each level above takes maxima of."""
QUERY_BATCH = 1 << 15
"""Queries scanned together: a batch's gather is this many by :data:`BLOCK` values."""


def _last_above(values: I64, stop: I64, limit: I64) -> I64:
    """For each query, the largest index ``i < stop`` with ``values[i] > limit``, -1 where none.

    The query's own block first; where nothing in it is above, the same search among the blocks' maxima one level
    up finds the last earlier block that holds such a value, and a scan of that block the index in it. Each query
    costs a few blocks' scan per level (log base :data:`BLOCK` of the size), whatever the ranges' nesting: a
    stack of a million nested ranges costs what a flat list does."""
    levels = [values]
    while levels[-1].size > BLOCK:
        top = levels[-1]
        padded = np.concatenate((top, np.full((-top.size) % BLOCK, np.iinfo(np.int64).min, dtype=np.int64)))
        levels.append(padded.reshape(-1, BLOCK).max(axis=1))
    out = np.full(stop.size, -1, dtype=np.int64)
    last = stop - 1
    near = last >= 0
    near[near] = values[last[near]] > limit[near]  # most points: the range started last still holds them
    out[near] = last[near]
    rest = np.flatnonzero(~near & (stop > 0))
    for at in range(0, rest.size, QUERY_BATCH):
        batch = rest[at: at + QUERY_BATCH]
        out[batch] = _search(levels, 0, stop[batch], limit[batch])
    return out


def _search(levels: list[I64], level: int, stop: I64, limit: I64) -> I64:
    """:func:`_last_above` over ``levels[level]`` (each level the blocks' maxima of the one below), ``stop > 0``."""
    values = levels[level]
    block = np.maximum(stop - 1, 0) // BLOCK
    found = _last_in_block(values, block, limit, stop)
    missed = np.flatnonzero((found < 0) & (block > 0))
    if missed.size and level + 1 < len(levels):
        upper = _search(levels, level + 1, block[missed], limit[missed])
        hit = upper >= 0
        found[missed[hit]] = _last_in_block(values, upper[hit], limit[missed[hit]], None)
    return found


def _last_in_block(values: I64, block: I64, limit: I64, stop: I64 | None) -> I64:
    """The last index of each ``block`` (below ``stop`` where given) whose value is above ``limit``, -1 if none."""
    cols = block[:, None] * BLOCK + np.arange(BLOCK, dtype=np.int64)
    valid = cols < (values.size if stop is None else np.minimum(stop, values.size)[:, None])
    above = valid & (values[np.minimum(cols, values.size - 1)] > limit[:, None])
    last = BLOCK - 1 - np.argmax(above[:, ::-1], axis=1)
    return np.where(above.any(axis=1), block * BLOCK + last, -1)
