"""What the host did, where the trace lost every device record: the report of a rank without device figures.

A trace whose launches carry their correlation ids and whose kernels, copies and sets are all missing recorded
CUDA and lost its device activity (a full CUPTI buffer, a dropped activity kind). No device figure can be given:
no busy time, so no utilization, no idle to split into causes, and no fix that rests on them. What the trace does
show is the host's side: its steps (the profiler's markers, else the data loader's or optimizer's calls), the
launches it issued in each, the time its launching threads spent inside operators, launch calls, waits on the
device, copies, data loading and collectives, and the operators that took that time.
"""

from __future__ import annotations

import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.binning import covered_before
from gpuidle.analysis.links import launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import find_steps
from gpuidle.analysis.summary import host_events
from gpuidle.analysis.trace_quality import records_lost
from gpuidle.model import HOST_ACTIVITIES, I64, HostCall, HostKind, HostSide, HostStep, Timeline
from gpuidle.model.arrays import distinct

TOP_CALLS = 8


def host_side(tl: Timeline) -> HostSide:
    """The host side of a rank whose trace holds no device record (``tl.meta.device_records_lost`` launches)."""
    names = NameClasses.of(tl.strings)
    host = tl.host
    runtime = host.kind == HostKind.RUNTIME
    launch = runtime & names.launch_call[host.name]
    threads = distinct(host.thread[launch]) if launch.any() else distinct(host.thread)
    mine = np.isin(host.thread, threads)
    steps = find_steps(tl, names)
    if len(steps):
        lo, hi = int(steps.start[0]), int(steps.end[-1])
    else:
        lo, hi = int(host.start[mine].min()), int(host.end[mine].max())
    edges = np.column_stack((steps.start, steps.end)).ravel().astype(np.int64)  # each step's own [start, end)
    operator = (host.kind == HostKind.OP) & ~names.region[host.name]
    classes = {
        "operators": operator,
        "launch": launch,
        "sync": (runtime & names.sync_call[host.name]) | (operator & names.item_op[host.name]),
        "copy": runtime & names.memcpy_call[host.name],
        "data_loading": names.data_loading[host.name] & ~runtime,
        "collective": names.collective_host[host.name] & ~runtime & (host.kind != HostKind.PYTHON),
    }
    window: dict[str, int] = {}
    per_step: dict[str, I64] = {}
    for k, m in classes.items():
        union = iv.union(host.start[mine & m], host.end[mine & m])
        window[k] = iv.total(iv.clip(union, lo, hi))
        per_step[k] = _between(covered_before(union[0], union[1], edges))
    launches = _between(np.searchsorted(np.sort(host.start[launch]), edges, side="left"))
    rows = [HostStep(step=n, start_s=_s(steps.start[i]), dur_s=_s(steps.end[i] - steps.start[i]),
                     launches=int(launches[i]), activity_s={k: _s(per_step[k][i]) for k in HOST_ACTIVITIES})
            for i, n in enumerate(steps.number.tolist())]
    meta = tl.meta
    return HostSide(
        rank=meta.rank if meta.rank is not None else 0, path=meta.path, lost_launches=meta.device_records_lost,
        step_source=steps.source if len(steps) else "none", start_s=_s(lo), dur_s=_s(hi - lo),
        threads=int(threads.size), steps=rows, activity_s={k: _s(window[k]) for k in HOST_ACTIVITIES},
        top_calls=_top_calls(tl, np.flatnonzero(mine & operator), lo, hi),
        host_events=host_events(tl, names, launcher_rows(tl)), notes=list(meta.notes),
        quality=[records_lost(tl)], world_size=meta.world_size, backend=meta.backend,
    )


def _s(ns: float) -> float:
    return float(ns) / 1e9


def _between(before: I64) -> I64:
    """From a count or a time before each of ``start_0, end_0, start_1, end_1, ...``: each step's own."""
    out: I64 = before[1::2] - before[0::2]
    return out


def _top_calls(tl: Timeline, rows: I64, lo: int, hi: int) -> list[HostCall]:
    """The operators (rows of ``tl.host``) begun in ``[lo, hi)`` with the most time, each name's calls nested in
    another of its own counted once."""
    host = tl.host
    rows = rows[(host.start[rows] >= lo) & (host.start[rows] < hi)]
    if rows.size == 0 or hi <= lo:
        return []
    rows = rows[np.lexsort((-host.end[rows], host.start[rows], host.name[rows]))]
    name, start, end = host.name[rows], host.start[rows], host.end[rows]
    first = np.r_[True, name[1:] != name[:-1]]
    group = np.cumsum(first) - 1
    reach = _reach_in_group(end, group)
    top = first | np.r_[True, start[1:] >= reach[:-1]]
    count = np.bincount(group[top])
    total = np.bincount(group[top], weights=(end - start)[top])
    order = np.argsort(-total, kind="stable")[:TOP_CALLS]
    names = name[first]
    return [HostCall(name=tl.strings[int(names[g])], count=int(count[g]), total_s=_s(total[g]),
                     share=float(total[g]) / (hi - lo)) for g in order.tolist() if total[g] > 0]


def _reach_in_group(end: I64, group: I64) -> I64:
    """The latest end so far within each row's group (rows ordered by group): a running maximum over the ends'
    ranks, each group's lifted above the ones before it, so no group's ends reach into the next one's."""
    ordered = np.sort(end)
    rank = np.searchsorted(ordered, end)
    lift = group * end.size
    out: I64 = ordered[np.maximum.accumulate(rank + lift) - lift]
    return out
