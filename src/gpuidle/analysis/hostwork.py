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
    for t in distinct(thread[rows]).tolist():
        inner = nested[(thread[nested] == t) & (end[nested] > start[nested])]
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
    it, -1 where none does. One sweep with a stack of open ranges: nested ranges close innermost first."""
    out = np.full(points.size, -1, dtype=np.int64)
    if rows.size == 0 or points.size == 0:
        return out
    order = rows[np.lexsort((-end[rows], start[rows]))]
    s, e = start[order].tolist(), end[order].tolist()
    stack: list[int] = []
    k = 0
    for j in np.argsort(points, kind="stable").tolist():
        p = int(points[j])
        while k < len(s) and s[k] <= p:
            while stack and e[stack[-1]] <= s[k]:
                stack.pop()
            stack.append(k)
            k += 1
        while stack and e[stack[-1]] <= p:
            stack.pop()
        if stack:
            out[j] = order[stack[-1]]
    return out
