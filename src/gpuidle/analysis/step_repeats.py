"""Steps from what repeats: a host range that recurs with the device's work under it, whatever its name.

A profile without the profiler's step markers often marks its loop all the same: an engine annotates each of its
iterations (``execute_context_0(0)_generation_4(4)``), a program wraps its step in an NVTX range or a
``record_function``. Such an annotation is the step when, on one thread,

- it recurs at least :data:`MIN_REPEATS` times, its outermost instances alike in length (their scaled MAD at most
  :data:`ALIKE` of their median), and
- the device work launched inside its instances is most of the device's work (:data:`COVERS` of the busy time).

Of several such ranges the one that covers the most work is the step; within :data:`COVERS_TIE` of it, the longest
(an iteration over the forward it holds). A step runs from one instance's start to the next one's, the last to its
own end: an engine that schedules ahead launches the next iteration before the device has run the last one, and the
window's device side (:func:`~gpuidle.analysis.steps.device_side`) moves each step to where its work begins.

A range on a device's own timeline (Kineto's GPU annotation track: a ``record_function`` range as the device ran
it) is looked at first, by the same tests against that device's work: its instances start where the device begins
each iteration's work and end with it, on the device's clock, so they are the device's steps as they are
(:data:`REPEATING_DEVICE_RANGES`); the host's ranges, whose work runs later where the host schedules ahead, are the
fallback.

Python functions are not looked at: a model's layers are calls of one function, alike and covering the forward's
work, and one forward of twelve layers is one step, not twelve.

Without such a range, the device's own work may repeat: where the busiest device's sequence of operations (by name,
in order of start) is ``k`` ≥ :data:`MIN_REPEATS` copies of one block, every name in every copy (every name's count
a multiple of ``k``), each copy is a step (:data:`DEVICE_PERIOD`). A forward's layers repeat too, but its embedding
and head run once: the whole sequence is no repetition of the layers.
"""

from __future__ import annotations

import numpy as np

from gpuidle.analysis.links import launch_times, launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.model import I64, HostKind, Steps, Timeline
from gpuidle.model.arrays import distinct, median_of

REPEATING_RANGES = "repeating_ranges"
REPEATING_DEVICE_RANGES = "repeating_device_ranges"
DEVICE_PERIOD = "device_period"
MIN_REPEATS = 3
ALIKE = 0.25
COVERS = 0.5
COVERS_TIE = 0.05
MIN_TIME_SHARE = 0.05
"""A range whose instances hold less than this share of the device's span in all is not looked at further (a
short helper called in every step): the step's range holds the launches of most of the step's work."""


def repeating_ranges(tl: Timeline, names: NameClasses, launchers: I64 | None = None) -> tuple[Steps, str | None]:
    """The steps a recurring host range marks (see the module) and the range's name; or no steps and None."""
    empty = np.zeros(0, dtype=np.int64)
    none = Steps(empty, empty.copy(), empty.copy(), REPEATING_RANGES), None
    host, ops = tl.host, tl.device_ops
    if len(host) == 0 or len(ops) == 0 or not tl.strings:
        return none
    kinds = (host.kind == HostKind.ANNOTATION) & ~names.data_loading[host.name] & ~names.profiler_step[host.name]
    rows = np.flatnonzero(kinds)
    if rows.size == 0:
        return none
    span = int(ops.end.max()) - int(ops.start.min())
    key = host.name[rows].astype(np.int64) * (int(host.thread.max()) + 1) + host.thread[rows]
    order = np.argsort(key, kind="stable")
    rows, key = rows[order], key[order]
    cuts = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    total = np.add.reduceat(host.end[rows] - host.start[rows], cuts[:-1])
    worth = np.flatnonzero((np.diff(cuts) >= MIN_REPEATS) & (total >= MIN_TIME_SHARE * span))
    if worth.size == 0:
        return none
    launched = launch_times(tl, launcher_rows(tl) if launchers is None else launchers)
    order = np.argsort(launched, kind="stable")
    launched, work = launched[order], (ops.end - ops.start)[order]
    busy = float(work.sum())
    if busy <= 0:
        return none
    best: tuple[float, float, I64] | None = None
    for g in worth.tolist():
        group = rows[cuts[g]:cuts[g + 1]]
        top = _outermost(host.start[group], host.end[group], group)
        if top.size < MIN_REPEATS or not _alike(host.end[top] - host.start[top]):
            continue
        covered = _covered(host.start[top], host.end[top], launched, work) / busy
        if covered < COVERS:
            continue
        length = float(median_of(host.end[top] - host.start[top]))
        if best is None or covered > best[0] + COVERS_TIE or (covered >= best[0] - COVERS_TIE and length > best[1]):
            best = (covered, length, top)
    if best is None:
        return none
    top = best[2]
    starts = host.start[top].copy()
    ends = np.append(starts[1:], host.end[top][-1])
    name = tl.strings[int(host.name[top[0]])]
    return Steps(np.arange(top.size, dtype=np.int64), starts, ends, REPEATING_RANGES), name


def repeating_device_ranges(tl: Timeline, names: NameClasses) -> tuple[Steps, str | None]:
    """The steps a recurring range on a device's own timeline marks (see the module) and the range's name; or no
    steps and None. Its instances cover the work that starts inside them on their device."""
    empty = np.zeros(0, dtype=np.int64)
    none = Steps(empty, empty.copy(), empty.copy(), REPEATING_DEVICE_RANGES), None
    marks, ops = tl.device_ranges, tl.device_ops
    if len(marks) == 0 or len(ops) == 0 or not tl.strings:
        return none
    rows = np.flatnonzero(~names.data_loading[marks.name] & ~names.profiler_step[marks.name])
    if rows.size == 0:
        return none
    device = marks.device[rows].astype(np.int64) - int(marks.device[rows].min())
    key = marks.name[rows].astype(np.int64) * (int(device.max()) + 1) + device
    order = np.argsort(key, kind="stable")
    rows, key = rows[order], key[order]
    cuts = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    best: tuple[float, float, I64] | None = None
    for g in np.flatnonzero(np.diff(cuts) >= MIN_REPEATS).tolist():
        group = rows[cuts[g]:cuts[g + 1]]
        mine = np.flatnonzero(ops.device == marks.device[group[0]])
        if mine.size == 0:
            continue
        span = int(ops.end[mine].max()) - int(ops.start[mine].min())
        if int((marks.end[group] - marks.start[group]).sum()) < MIN_TIME_SHARE * span:
            continue
        top = _outermost(marks.start[group], marks.end[group], group)
        if top.size < MIN_REPEATS or not _alike(marks.end[top] - marks.start[top]):
            continue
        mine = mine[np.argsort(ops.start[mine], kind="stable")]
        work = ops.end[mine] - ops.start[mine]
        busy = float(work.sum())
        covered = _covered(marks.start[top], marks.end[top], ops.start[mine], work) / busy if busy > 0 else 0.0
        if covered < COVERS:
            continue
        length = float(np.median(marks.end[top] - marks.start[top]))
        if best is None or covered > best[0] + COVERS_TIE or (covered >= best[0] - COVERS_TIE and length > best[1]):
            best = (covered, length, top)
    if best is None:
        return none
    top = best[2]
    starts = marks.start[top].copy()
    ends = np.append(starts[1:], marks.end[top][-1])
    name = tl.strings[int(marks.name[top[0]])]
    return Steps(np.arange(top.size, dtype=np.int64), starts, ends, REPEATING_DEVICE_RANGES), name


def _outermost(starts: I64, ends: I64, rows: I64) -> I64:
    """Rows whose range is not inside an earlier-starting one of the same group, in order of start."""
    order = np.lexsort((-ends, starts))
    s, e, r = starts[order], ends[order], rows[order]
    reach = np.maximum.accumulate(e)
    top = np.ones(s.size, dtype=bool)
    top[1:] = s[1:] >= reach[:-1]
    out: I64 = r[top]
    return out


def _alike(dur: I64) -> bool:
    d = dur.astype(np.float64)
    median = float(median_of(d))
    return median > 0 and 1.4826 * float(median_of(np.abs(d - median))) <= ALIKE * median


def _covered(starts: I64, ends: I64, launched: I64, work: I64) -> float:
    """Device time of the work launched inside the ranges (sorted, disjoint); ``launched`` sorted."""
    lo = np.searchsorted(launched, starts, side="left")
    hi = np.searchsorted(launched, ends, side="right")
    cum = np.r_[0, np.cumsum(work, dtype=np.float64)]
    return float((cum[hi] - cum[lo]).sum())


def device_period(tl: Timeline) -> Steps:
    """Steps as the copies of one block that the busiest device's operations repeat whole (see the module); no
    steps where they do not."""
    ops = tl.device_ops
    empty = np.zeros(0, dtype=np.int64)
    none = Steps(empty, empty.copy(), empty.copy(), DEVICE_PERIOD)
    if len(ops) < MIN_REPEATS:
        return none
    ordered = np.sort(ops.device)
    devices = distinct(ordered)
    counts_of = np.searchsorted(ordered, devices, side="right") - np.searchsorted(ordered, devices, side="left")
    device = int(devices[np.argmax(counts_of)])
    rows = np.flatnonzero(ops.device == device)
    rows = rows[np.argsort(ops.start[rows], kind="stable")]
    names = ops.name[rows].astype(np.int64)
    counts = np.bincount(names)
    k = int(np.gcd.reduce(counts[counts > 0]))
    if k < MIN_REPEATS:
        return none
    period = rows.size // k
    blocks = names.reshape(k, period)
    if not (blocks == blocks[0]).all():
        return none
    starts = ops.start[rows[::period]].astype(np.int64)
    ends = np.append(starts[1:], int(ops.end[rows].max()))
    return Steps(np.arange(k, dtype=np.int64), starts, ends, DEVICE_PERIOD)
