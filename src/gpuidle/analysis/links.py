"""Launch linkage: which host runtime call launched each device op."""

from __future__ import annotations

import numpy as np

from gpuidle.model import I64, HostKind, Timeline


def launcher_rows(tl: Timeline) -> I64:
    """For each device op, the row in ``tl.host`` of the runtime call that launched it; -1 if unknown.

    Linked through ``args.correlation``, which Kineto writes on both sides.
    """
    ops, host = tl.device_ops, tl.host
    rows = np.full(len(ops), -1, dtype=np.int64)
    rt = np.flatnonzero((host.kind == HostKind.RUNTIME) & (host.correlation >= 0))
    if rt.size == 0 or len(ops) == 0:
        return rows
    corr = host.correlation[rt]
    order = np.argsort(corr, kind="stable")
    corr, rt = corr[order], rt[order]
    pos = np.minimum(np.searchsorted(corr, ops.correlation), corr.size - 1)
    hit = (ops.correlation >= 0) & (corr[pos] == ops.correlation)
    rows[hit] = rt[pos[hit]]
    return rows


def launch_times(tl: Timeline, rows: I64) -> I64:
    """Host time each device op was launched; its own start where the launcher is unknown."""
    if len(tl.host) == 0:  # a trace of device events alone
        return tl.device_ops.start.copy()
    return np.where(rows >= 0, tl.host.start[np.maximum(rows, 0)], tl.device_ops.start)
