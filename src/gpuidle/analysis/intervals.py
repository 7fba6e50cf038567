"""Vectorised interval algebra on int64 nanoseconds.

A *set* is a pair ``(starts, ends)`` of sorted, disjoint, non-empty half-open
intervals. Everything is sort + sweep in numpy; nothing loops in Python per interval.
"""

from __future__ import annotations

import numpy as np

from gpuidle.model import I64

Intervals = tuple[I64, I64]

EMPTY: Intervals = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def union(starts: I64, ends: I64) -> Intervals:
    """Merge possibly overlapping intervals into a set.

    Sort by start; an interval opens a new run when it starts after the running
    maximum of all earlier ends (``np.maximum.accumulate``).
    """
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new_run = np.empty(s.size, dtype=bool)
    new_run[0] = True
    new_run[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_run)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def sorted_unique(values: I64) -> I64:
    """``np.unique`` for int64, by sort and neighbour mask: numpy 2's hash-based unique costs
    ~100x more per element, and it made the analysis superlinear on large traces."""
    v = np.sort(values, kind="stable")  # timsort: a trace's times come in sorted runs (13x faster on 2.6 M)
    if v.size == 0:
        return v
    keep = np.empty(v.size, dtype=bool)
    keep[0] = True
    np.not_equal(v[1:], v[:-1], out=keep[1:])
    return v[keep]


def member(sorted_values: I64, points: I64) -> np.ndarray:
    """For each point, whether it is one of ``sorted_values``: a binary search, where ``np.isin`` on two large
    int64 arrays hashes both (numpy 2) at ~3x the cost."""
    if sorted_values.size == 0:
        return np.zeros(points.shape, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_values, points), sorted_values.size - 1)
    found: np.ndarray = sorted_values[at] == points
    return found


def total(iv: Intervals) -> int:
    return int((iv[1] - iv[0]).sum())


def clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    """The part of a set inside ``[lo, hi)``."""
    s, e = np.maximum(iv[0], lo), np.minimum(iv[1], hi)
    keep = e > s
    return s[keep], e[keep]


def complement(iv: Intervals, lo: int, hi: int) -> Intervals:
    """``[lo, hi)`` minus a set: the gaps."""
    s, e = clip(iv, lo, hi)
    gap_s = np.concatenate(([lo], e))
    gap_e = np.concatenate((s, [hi]))
    keep = gap_e > gap_s
    return gap_s[keep].astype(np.int64), gap_e[keep].astype(np.int64)


def covered(iv: Intervals, points: I64) -> np.ndarray:
    """For each point, whether it lies inside the set (half-open)."""
    idx = np.searchsorted(iv[0], points, side="right") - 1
    ok = idx >= 0
    inside = np.zeros(points.shape, dtype=bool)
    inside[ok] = points[ok] < iv[1][idx[ok]]
    return inside


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two sets (as elementary segments: disjoint and sorted)."""
    s, e, label = label_segments(a, [b], extra_points=None)
    keep = label == 0
    return s[keep], e[keep]


def label_segments(
    base: Intervals,
    layers: list[Intervals],
    extra_points: I64 | None,
) -> tuple[I64, I64, np.ndarray]:
    """Cut ``base`` into elementary segments and give each the first layer covering it.

    :param layers: in priority order; overlapping intervals inside a layer are fine.
    :param extra_points: more cut points (e.g. step boundaries) so no segment crosses them.
    :return: ``(start, end, label)``; ``label`` is the index of the first covering layer,
        or ``len(layers)`` where none covers. Segments tile ``base`` exactly.
    """
    bs, be = base
    if bs.size == 0:
        return bs, be, np.zeros(0, dtype=np.int16)
    pts = [bs, be]
    for s, e in layers:
        pts.append(s)
        pts.append(e)
    if extra_points is not None:
        pts.append(extra_points)
    p = sorted_unique(np.concatenate(pts))
    p = p[covering(bs, be, p) | _among(be, p)]
    seg_s, seg_e = p[:-1], p[1:]
    inside = covering(bs, be, seg_s)
    seg_s, seg_e = seg_s[inside], seg_e[inside]
    label = np.full(seg_s.size, len(layers), dtype=np.int16)
    todo = np.ones(seg_s.size, dtype=bool)
    for k, (s, e) in enumerate(layers):
        if s.size == 0 or not todo.any():
            continue
        hit = np.flatnonzero(todo)[covering(s, e, seg_s[todo])]
        label[hit] = k
        todo[hit] = False
    return seg_s, seg_e, label


def _among(values: I64, sorted_points: I64) -> np.ndarray:
    """For each point (sorted, unique), whether it is one of ``values``: a binary search per value, for few values
    among many points."""
    found = np.zeros(sorted_points.size, dtype=bool)
    at = np.searchsorted(sorted_points, values)
    inside = at < sorted_points.size
    at, values = at[inside], values[inside]
    found[at[sorted_points[at] == values]] = True
    return found


def covering(starts: I64, ends: I64, sorted_points: I64) -> np.ndarray:
    """For each point (sorted), whether any of the intervals (in any order, overlapping or not) contains it.

    Each interval covers the run of points ``[first >= start, first >= end)``: found by two binary searches of
    the interval's ends among the points, and summed over all intervals as +1/-1 steps. The cost is
    O(intervals log points + points), with no sort of the intervals.
    """
    keep = ends > starts
    n = sorted_points.size
    first = np.searchsorted(sorted_points, starts[keep])
    past = np.searchsorted(sorted_points, ends[keep])
    steps = np.bincount(first, minlength=n + 1) - np.bincount(past, minlength=n + 1)
    return np.cumsum(steps[:n]) > 0
