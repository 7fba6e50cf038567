"""The one host call under most of a cause's idle in a step: what names a one-off wait in words.

A step whose ``host_sync`` is one 463 ms blocking copy of a 4.5 µs transfer is not a step that syncs: the
host waited for something the trace does not show. Saying which call, how long it took and what its own
device work took lets the reader see that at once (``StepReport.main_calls``).
"""

from __future__ import annotations

import numpy as np

from gpuidle.analysis.hostwork import innermost
from gpuidle.analysis.idle import CAUSE_INDEX, DeviceIdle, feeding_threads
from gpuidle.analysis.names import NameClasses
from gpuidle.model import I64, Cause, CopyKind, HostKind, StepCall, Timeline

CALL_CAUSES = (Cause.HOST_SYNC, Cause.MEMCPY, Cause.DATA_LOADING, Cause.CPU_COMPUTE)
"""Causes whose idle lies under host calls (launching is many small calls; the others are device-side)."""
MAIN_SHARE = 0.5
"""A call is a step's main call for a cause where it covers at least this share of the cause's idle there."""
MIN_STEP_SHARE = 0.005
"""...and at least this share of the step (below it the cause is not in the step: ``advice.rules.PRESENT``)."""


def main_calls(tl: Timeline, names: NameClasses, launchers: I64, device: DeviceIdle, bounds: I64,
               span: I64) -> list[dict[str, StepCall]]:
    """For each step (``bounds``, ``span``: its length less start-up), the call under most of each cause's idle
    where one covers at least :data:`MAIN_SHARE` of it."""
    host = tl.host
    n_steps = bounds.size - 1
    chosen: dict[tuple[int, str], tuple[int, float]] = {}
    seg_s, seg_e, label = device.segments
    feeding = np.isin(host.thread, feeding_threads(tl, launchers, device.device))
    loading = (names.data_loading | names.file_read)[host.name] & (host.kind != HostKind.RUNTIME)
    calls = feeding & ((host.kind == HostKind.OP) | (host.kind == HostKind.RUNTIME)) & ~names.region[host.name]
    caller = _callers(host.start, host.end, seg_s, label, np.flatnonzero(calls), np.flatnonzero(loading))
    for cause in CALL_CAUSES:
        on = np.flatnonzero((label == CAUSE_INDEX[cause]) & (caller >= 0))
        if on.size == 0:
            continue
        step = np.clip(np.searchsorted(bounds, seg_s[on], side="right") - 1, 0, n_steps - 1)
        for i, r, covered in _largest_per_step(step, caller[on], seg_e[on] - seg_s[on], host.start.size):
            cause_idle = int(device.step_idle[i, CAUSE_INDEX[cause]])
            if covered >= max(MAIN_SHARE * cause_idle, MIN_STEP_SHARE * span[i]):
                chosen[i, cause.value] = (r, covered)
    transfers = _transfers(tl, launchers, np.array(sorted({r for r, _ in chosen.values()}), dtype=np.int64))
    out: list[dict[str, StepCall]] = [{} for _ in range(n_steps)]
    for (i, cause_name), (r, covered_ns) in chosen.items():
        transfer = transfers.get(r)
        out[i][cause_name] = StepCall(
            name=tl.strings[int(host.name[r])], call_s=int(host.end[r] - host.start[r]) / 1e9,
            idle_s=covered_ns / 1e9, transfer_s=None if transfer is None else transfer / 1e9)
    return out


def _largest_per_step(step: I64, row: I64, length: I64, n_rows: int) -> list[tuple[int, int, float]]:
    """For each step, the row covering the most idle (``length`` summed over its pieces; of equal ones, the first
    row): (step, row, covered), in one pass over the pieces, never one per (step, row) pair."""
    pairs, where = np.unique(step * n_rows + row, return_inverse=True)
    covered = np.bincount(where, weights=length, minlength=pairs.size)
    pair_step = pairs // n_rows
    order = np.lexsort((-covered, pair_step))  # by step, the largest first; stable: the first row of a tie
    first = order[np.flatnonzero(np.diff(pair_step[order], prepend=-1) != 0)]
    return list(zip(pair_step[first].tolist(), (pairs[first] % n_rows).tolist(), covered[first].tolist(),
                    strict=True))


def _callers(start: I64, end: I64, seg_start: I64, label: I64, calls: I64, loading: I64) -> I64:
    """For each idle segment of a :data:`CALL_CAUSES` cause, the innermost host row open at its start, -1
    elsewhere: among the data-loading calls for ``data_loading``, among ``calls`` for the others (one search for
    all of them)."""
    out = np.full(seg_start.size, -1, dtype=np.int64)
    loads = label == CAUSE_INDEX[Cause.DATA_LOADING]
    others = np.isin(label, [CAUSE_INDEX[c] for c in CALL_CAUSES if c is not Cause.DATA_LOADING])
    for rows, on in ((loading, np.flatnonzero(loads)), (calls, np.flatnonzero(others))):
        if on.size:
            points = seg_start[on]
            out[on] = innermost(start, end, _covering(start, end, rows, np.sort(points)), points)
    return out


def _covering(start: I64, end: I64, rows: I64, sorted_points: I64) -> I64:
    """The ``rows`` whose range holds at least one point (the first point at or after its start comes before its
    end): the few calls worth the innermost search."""
    if sorted_points.size == 0:
        return rows[:0]
    first = np.searchsorted(sorted_points, start[rows], side="left")
    after = sorted_points[np.minimum(first, sorted_points.size - 1)]
    return rows[(first < sorted_points.size) & (after < end[rows])]


def _transfers(tl: Timeline, launchers: I64, rows: I64) -> dict[int, int]:
    """For each of ``rows`` (sorted) that launched a copy, the device time of its copies (ns)."""
    ops = tl.device_ops
    copies = np.isin(launchers, rows) & (ops.copy_kind != CopyKind.NONE)
    if not copies.any():
        return {}
    by_row, where = np.unique(launchers[copies], return_inverse=True)
    took = np.bincount(where, weights=(ops.end - ops.start)[copies])
    return {int(r): int(t) for r, t in zip(by_row.tolist(), took.tolist(), strict=True)}
