"""One rank, all analyses: a Timeline in, a :class:`RankAnalysis` out.

The analysis keeps, beside the serialisable :class:`RankReport`, the small arrays a
job-level analysis needs from each rank (its collectives and its exposed
communication segments), so ranks can be analysed in separate processes and merged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuidle.analysis.comm import Collectives, comm_report, find_collectives
from gpuidle.analysis.idle import CAUSE_INDEX, attribute_idle
from gpuidle.analysis.kernels import kernel_facts
from gpuidle.analysis.links import launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.quality import quality_notes
from gpuidle.analysis.sharded import classify, role_split
from gpuidle.analysis.steps import steady_state, step_window
from gpuidle.model import CAUSES, I64, Cause, DeviceReport, HostKind, RankReport, StepReport, Timeline, Window


@dataclass(frozen=True, slots=True)
class RankAnalysis:
    report: RankReport
    primary_device: int
    step_numbers: I64
    collectives: Collectives
    exposed_comm: tuple[I64, I64, np.ndarray]
    """Idle segments of the primary device charged to communication: ``(start, end, step index)``."""
    accumulation_repeats: int


def _s(ns: float) -> float:
    return float(ns) / 1e9


def summarize_rank(tl: Timeline) -> RankAnalysis:
    names = NameClasses.of(tl.strings)
    window = step_window(tl, names)
    launchers = launcher_rows(tl)
    idle = attribute_idle(tl, names, window, launchers)
    kernels = kernel_facts(tl, names, window)
    coll = find_collectives(tl, window, launchers)
    primary = max(idle, key=lambda d: (d.busy_ns, -d.device))
    communication = comm_report(tl, window, idle, coll)
    communication.parallelism, roles = classify(tl, coll, launchers)
    communication.roles = role_split(coll, roles, idle) if roles else []
    devices = [
        DeviceReport(
            device=d.device, name=tl.meta.device_names.get(d.device),
            window_s=_s(d.window_ns), busy_s=_s(d.busy_ns), idle_s=_s(d.idle_ns),
            utilization=d.busy_ns / d.window_ns if d.window_ns else 0.0,
            idle_by_cause_s={c.value: _s(v) for c, v in d.idle_by_cause().items()},
            active_s=_s(sum(int(e - s) for s, e in zip(*d.active, strict=True))),
            compute_capability=tl.meta.device_capability.get(d.device),
        )
        for d in idle
    ]
    bounds = window.bounds
    excluded = steady_state(np.diff(bounds)) if window.kind != "gpu_activity" else [None]
    steps = [
        StepReport(
            step=int(window.steps.number[i]), start_s=_s(bounds[i]), dur_s=_s(bounds[i + 1] - bounds[i]),
            busy_s=_s(primary.step_busy[i]), idle_s=_s(primary.step_idle[i].sum()),
            idle_by_cause_s={c.value: _s(primary.step_idle[i, j]) for j, c in enumerate(CAUSES)},
            excluded=excluded[i],
        )
        for i in range(bounds.size - 1)
    ]
    notes = list(tl.meta.notes) + quality_notes(tl, names, window, kernels)
    if len(idle) > 1:
        notes.append(f"{len(idle)} devices in this trace; per-step figures are for device {primary.device}")
    report = RankReport(
        rank=tl.meta.rank if tl.meta.rank is not None else 0,
        path=tl.meta.path, notes=notes, step_source=window.steps.source,
        window=Window(kind=window.kind, start_s=_s(window.start), dur_s=_s(window.end - window.start)),
        devices=devices, steps=steps, kernels=kernels,
        communication=communication,
        world_size=tl.meta.world_size, backend=tl.meta.backend, host_events=host_events(tl, launchers),
    )
    seg_s, seg_e, cause = primary.segments
    exposed = cause == CAUSE_INDEX[Cause.COMMUNICATION]
    step_of = np.clip(np.searchsorted(bounds, seg_s[exposed], side="right") - 1, 0, bounds.size - 2)
    on_primary = coll.device == primary.device
    return RankAnalysis(
        report=report, primary_device=primary.device, step_numbers=window.steps.number,
        collectives=coll, exposed_comm=(seg_s[exposed], seg_e[exposed], step_of),
        accumulation_repeats=_accumulation_repeats(coll, on_primary),
    )


GRAPH_OR_DRIVER_LAUNCH = ("cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "hipGraphLaunch",
                          "hipModuleLaunchKernel", "cuLaunchCooperativeKernel")


def host_events(tl: Timeline, launchers: I64) -> dict[str, int]:
    """What the trace recorded on the host, so a report can say what attribution lacked."""
    host = tl.host
    names = np.array([tl.strings[i] in GRAPH_OR_DRIVER_LAUNCH for i in range(len(tl.strings))], dtype=bool)
    runtime = host.kind == HostKind.RUNTIME
    return {"cpu_ops": int((host.kind == HostKind.OP).sum()), "runtime_calls": int(runtime.sum()),
            "linked_launches": int((launchers >= 0).sum()),
            "graph_or_driver_launches": int((runtime & names[host.name]).sum()) if names.size else 0}


def _accumulation_repeats(coll: Collectives, on_device: np.ndarray) -> int:
    """How often the all-reduce size sequence of a step repeats inside it (gradient accumulation
    without ``no_sync`` all-reduces the same buckets once per micro-batch). The smallest repeat
    count over the steps, so one irregular step cannot claim a repeat that is not there."""
    sel = np.flatnonzero(on_device & (np.array(coll.collective) == "all_reduce") & (coll.nbytes > 0)) \
        if coll.nbytes.size else np.zeros(0, dtype=np.int64)
    if sel.size == 0:
        return 1
    repeats = []
    for step in np.unique(coll.step[sel]):
        sizes = coll.nbytes[sel[coll.step[sel] == step]]
        n = sizes.size
        best = 1
        for period in range(1, n // 2 + 1):
            if n % period == 0 and np.array_equal(sizes, np.tile(sizes[:period], n // period)):
                best = n // period
                break
        repeats.append(best)
    return int(min(repeats))
