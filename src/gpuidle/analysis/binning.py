"""A device's idle segments in equal slices of its window: what a utilization-over-time plot draws."""

from __future__ import annotations

import numpy as np

from gpuidle.model import CAUSES, I64


def slice_shares(window: tuple[int, int], segments: tuple[I64, I64, I64], n: int) -> tuple[I64, np.ndarray, np.ndarray]:
    """Busy and per-cause idle share of ``n`` equal slices of the window, exactly (no sampling)."""
    lo, hi = window
    n = max(1, min(n, hi - lo))
    edges = np.rint(np.linspace(lo, hi, n + 1)).astype(np.int64)
    width = np.diff(edges).astype(np.float64)
    seg_s, seg_e, cause = segments
    idle = np.zeros((n, len(CAUSES)), dtype=np.float64)
    for c in range(len(CAUSES)):
        mine = cause == c
        if mine.any():
            idle[:, c] = np.diff(covered_before(seg_s[mine], seg_e[mine], edges)) / width
    return edges, np.clip(1.0 - idle.sum(axis=1), 0.0, 1.0), idle


def covered_before(starts: I64, ends: I64, t: I64) -> I64:
    """Length of the sorted, disjoint intervals before each time in ``t``."""
    before = np.concatenate([[0], np.cumsum(ends - starts)])
    k = np.searchsorted(ends, t, side="right")  # intervals over by then
    partial = np.zeros(t.size, dtype=np.int64)
    open_ = k < starts.size
    partial[open_] = np.clip(t[open_] - starts[k[open_]], 0, None)
    return before[k] + partial
