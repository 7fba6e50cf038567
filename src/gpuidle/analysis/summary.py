"""One rank, all analyses: a Timeline in, a :class:`RankAnalysis` out.

The analysis keeps, beside the serialisable :class:`RankReport`, the small arrays a
job-level analysis needs from each rank (its collectives and its exposed
communication segments), so ranks can be analysed in separate processes and merged.
"""

from __future__ import annotations

import msgspec
import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.attribution import attributed
from gpuidle.analysis.comm import Collectives, collective_under, comm_report, exposed_by_collective, find_collectives
from gpuidle.analysis.idle import CAUSE_INDEX, STARTUP_LABEL, DeviceIdle
from gpuidle.analysis.kernels import kernel_facts
from gpuidle.analysis.mesh import DimSegments, mesh_dims
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.quality import quality_notes
from gpuidle.analysis.sharded import classify, role_split
from gpuidle.analysis.startup import Startup
from gpuidle.analysis.step_calls import main_calls
from gpuidle.analysis.steps import NO_GPU_WORK, steady_state, truncated_edges
from gpuidle.analysis.trace_quality import rank_quality
from gpuidle.analysis.workload import workload
from gpuidle.model import (
    CAUSES,
    I64,
    Cause,
    DeviceReport,
    HostKind,
    PythonHotspot,
    RankReport,
    StartupCost,
    StepCall,
    StepReport,
    SyncSource,
    Timeline,
    Window,
)
from gpuidle.model.arrays import distinct
from gpuidle.model.mesh import MeshDim

TOP_PYTHON = 5


class RankAnalysis(msgspec.Struct, frozen=True):
    report: RankReport
    primary_device: int
    step_numbers: I64
    collectives: Collectives
    exposed_comm: tuple[I64, I64, np.ndarray]
    """Idle segments of the primary device charged to communication: ``(start, end, step index)``."""
    comm_dims: DimSegments
    """The same idle cut at every collective's ends, with each piece's parallel dimension."""
    accumulation_repeats: int
    started_ns: int = 0
    """The trace's earliest timestamp, as the profiler wrote it: which of two runs of one rank is the newer."""


def _s(ns: float) -> float:
    return float(ns) / 1e9


LISTED_RANKS = 4096
"""The most ranks a dimension's group lists in a rank's report: one list per rank, each as long as its group, grows
with the square of the job (200,000 ranks of dp 100,000: 100,000 numbers in every rank's report); past it the
job counts its missing ranks instead of placing them."""


def _bound_listed(mesh: list[MeshDim]) -> None:
    for m in mesh:
        if len(m.ranks) > LISTED_RANKS:
            m.ranks = []


def _seconds(ns: np.ndarray) -> list[float]:
    """Nanoseconds as seconds, each as :func:`_s` gives it, converted at once."""
    out: list[float] = (np.asarray(ns, dtype=np.float64) / 1e9).tolist()
    return out


def _step_reports(number: I64, bounds: I64, span: I64, primary: DeviceIdle,
                  excluded: list[str | None], by_collective: list[dict[str, float]], calls: list[dict[str, StepCall]],
                  by_dim: list[dict[str, float]]) -> list[StepReport]:
    """One report per step of the primary device, its figures converted per column rather than per step (100,000
    steps in a profile are 100,000 rows)."""
    causes = [c.value for c in CAUSES]
    start, dur, busy = _seconds(bounds[:-1]), _seconds(span), _seconds(primary.step_busy)
    idle = _seconds(primary.step_idle.sum(axis=1))
    by_cause: list[list[float]] = (primary.step_idle.astype(np.float64) / 1e9).tolist()
    startup = _seconds(primary.step_startup)
    zero_grad = _seconds(primary.step_zero_grad[:, CAUSE_INDEX[Cause.LAUNCH_OVERHEAD]])
    zero_grad_by_cause: list[list[float]] = (primary.step_zero_grad.astype(np.float64) / 1e9).tolist()
    return [
        StepReport(
            step=n, start_s=start[i], dur_s=dur[i], busy_s=busy[i], idle_s=idle[i],
            idle_by_cause_s=dict(zip(causes, by_cause[i], strict=True)), excluded=excluded[i],
            startup_s=startup[i], exposed_comm_s=by_collective[i], zero_grad_launch_s=zero_grad[i],
            zero_grad_s={c: v for c, v in zip(causes, zero_grad_by_cause[i], strict=True) if v},
            main_calls=calls[i], comm_by_dim_s=by_dim[i],
        )
        for i, n in enumerate(number.tolist())
    ]


def summarize_rank(tl: Timeline) -> RankAnalysis:
    names, launchers, window, _, startup, idle = attributed(tl)
    kernels = kernel_facts(tl, names, window, launchers)
    coll = find_collectives(tl, window, launchers)
    primary = max(idle, key=lambda d: (d.busy_ns, -d.device))
    communication = comm_report(tl, window, idle, coll)
    kind = workload(tl, names, launchers)
    training = kind is None or kind.mode == "training"  # without host operators to tell by, as the advice reads it
    communication.parallelism, roles = classify(tl, names, coll, launchers, training)
    communication.roles = role_split(coll, roles, idle) if roles else []
    devices = [
        DeviceReport(
            device=d.device, name=tl.meta.device_names.get(d.device),
            window_s=_s(d.window_ns - d.startup_ns), busy_s=_s(d.busy_ns), idle_s=_s(d.idle_ns),
            utilization=d.busy_ns / (d.window_ns - d.startup_ns) if d.window_ns > d.startup_ns else 0.0,
            idle_by_cause_s={c.value: _s(v) for c, v in d.idle_by_cause().items()},
            active_s=_s(iv.total(d.active)),
            compute_capability=tl.meta.device_capability.get(d.device),
            startup_s=_s(d.startup_ns), kernel_arch=tl.meta.kernel_arch.get(d.device),
        )
        for d in idle
    ]
    bounds = window.bounds
    seg_s, seg_e, cause = primary.segments
    exposed = cause == CAUSE_INDEX[Cause.COMMUNICATION]
    under = collective_under(coll, primary.device, (seg_s[exposed], seg_e[exposed]), bounds)
    by_collective = exposed_by_collective(coll, under, bounds)
    with_work = _steps_with_gpu_work(tl, bounds)
    span = np.diff(bounds) - primary.step_startup
    excluded = steady_state(span) if window.kind != "gpu_activity" else [None]
    excluded = truncated_edges(span, [NO_GPU_WORK if not with_work[i] else e for i, e in enumerate(excluded)])
    calls = main_calls(tl, names, launchers, primary, bounds, span)
    communication.mesh, by_dim, comm_dims = mesh_dims(tl, coll, primary, bounds, under)
    _bound_listed(communication.mesh)
    steps = _step_reports(window.steps.number, bounds, span, primary, excluded, by_collective, calls, by_dim)
    notes = list(tl.meta.notes) + quality_notes(tl, names, window, kernels)
    if len(idle) > 1:
        notes.append(f"{len(idle)} devices in this trace; per-step figures are for device {primary.device}")
    events = host_events(tl, names, launchers)
    report = RankReport(
        rank=tl.meta.rank if tl.meta.rank is not None else 0,
        path=tl.meta.path, notes=notes, step_source=window.steps.source,
        window=Window(kind=window.kind, start_s=_s(window.start), dur_s=_s(window.end - window.start)),
        devices=devices, steps=steps, kernels=kernels,
        communication=communication,
        world_size=tl.meta.world_size, backend=tl.meta.backend, host_events=events,
        startup=startup_costs(startup, primary), workload=kind,
        python_hotspots=python_hotspots(tl, primary), sync_sources=sync_sources(tl, primary),
        unmeasured=[HOST_ACTIVITY] if not (events["cpu_ops"] or events["runtime_calls"]) and primary.idle_ns else [],
    )
    unexplained = cause == CAUSE_INDEX[Cause.UNATTRIBUTED]
    report.quality = rank_quality(tl, names, window, report, (seg_s[unexplained], seg_e[unexplained]))
    step_of = np.clip(np.searchsorted(bounds, seg_s[exposed], side="right") - 1, 0, bounds.size - 2)
    on_primary = coll.device == primary.device
    return RankAnalysis(
        report=report, primary_device=primary.device, step_numbers=window.steps.number,
        collectives=coll, exposed_comm=(seg_s[exposed], seg_e[exposed], step_of), comm_dims=comm_dims,
        accumulation_repeats=_accumulation_repeats(coll, on_primary), started_ns=tl.meta.t0_ns,
    )


GRAPH_OR_DRIVER_LAUNCH = ("cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "hipGraphLaunch",
                          "hipModuleLaunchKernel", "cuLaunchCooperativeKernel")


HOST_ACTIVITY = "host_activity"
"""What a trace of device events alone did not record (:attr:`RankReport.unmeasured`): its idle has no cause."""


def host_events(tl: Timeline, classes: NameClasses, launchers: I64) -> dict[str, int]:
    """What the trace recorded on the host, so a report can say what attribution lacked (``annotations``: ranges
    such as ``record_function`` or NVTX ones); ``launch_calls`` and
    ``launch_call_us`` (their summed duration) bound what launching can cost; ``data_loader_calls``: whether the
    program loads its data through a data loader the fixes may name."""
    host = tl.host
    names = np.array([tl.strings[i] in GRAPH_OR_DRIVER_LAUNCH for i in range(len(tl.strings))], dtype=bool)
    runtime = host.kind == HostKind.RUNTIME
    launch = runtime & classes.launch_call[host.name] if len(tl.strings) else runtime
    return {"cpu_ops": int((host.kind == HostKind.OP).sum()), "runtime_calls": int(runtime.sum()),
            "linked_launches": int((launchers >= 0).sum()),
            "graph_or_driver_launches": int((runtime & names[host.name]).sum()) if names.size else 0,
            "python_functions": int((host.kind == HostKind.PYTHON).sum()),
            "annotations": int((host.kind == HostKind.ANNOTATION).sum()),
            "launch_calls": int(launch.sum()),
            "launch_call_us": int((host.end - host.start)[launch].sum() // 1000),
            "data_loader_calls": int(classes.data_loading[host.name].sum()) if len(tl.strings) else 0}


def _steps_with_gpu_work(tl: Timeline, bounds: I64) -> np.ndarray:
    """Whether any device op starts in each step."""
    starts = tl.device_ops.start
    inside = (starts >= bounds[0]) & (starts < bounds[-1])
    counts = np.bincount(np.searchsorted(bounds, starts[inside], side="right") - 1, minlength=bounds.size - 1)
    return counts[: bounds.size - 1] > 0


def startup_costs(startup: Startup, device: DeviceIdle) -> list[StartupCost]:
    """Each start-up cost once (a call, or a graph capture's span), with the device idle under it (one nested in an
    earlier one adds none), the costliest first."""
    seg_s, seg_e, cause = device.segments
    apart = (seg_s[cause == STARTUP_LABEL], seg_e[cause == STARTUP_LABEL])
    out = []
    claimed = 0
    for begin, end, kind, label in zip(startup.start.tolist(), startup.end.tolist(), startup.kind, startup.label,
                                       strict=True):
        s = max(begin, claimed)
        under = iv.total(iv.clip(apart, s, end)) if end > s else 0
        claimed = max(claimed, end)
        out.append(StartupCost(kind=kind, name=label, start_s=_s(begin), dur_s=_s(end - begin), idle_s=_s(under)))
    return sorted(out, key=lambda c: (-c.idle_s, c.start_s))  # what it cost the device first, as reports list it


def python_hotspots(tl: Timeline, device: DeviceIdle) -> list[PythonHotspot]:
    """The innermost Python functions under the idle charged to Python, largest first."""
    s, e, row = device.python
    known = row >= 0
    if not known.any():
        return []
    names = tl.host.name[row[known]]
    sums = np.bincount(names, weights=(e - s)[known])
    top = np.argsort(-sums)[:TOP_PYTHON]
    return [PythonHotspot(function=tl.strings[int(i)], idle_s=_s(sums[i])) for i in top if sums[i] > 0]


def sync_sources(tl: Timeline, device: DeviceIdle) -> list[SyncSource]:
    """The user's functions the host waited on the GPU from, by the ``host_sync`` idle under them, largest first;
    none where the trace has no Python stacks around its waits."""
    s, e, row = device.sync_sources
    total = int((e - s).sum())
    known = row >= 0
    if not known.any() or total <= 0:
        return []
    names = tl.host.name[row[known]]
    sums = np.bincount(names, weights=(e - s)[known])
    top = np.argsort(-sums)[:TOP_PYTHON]
    return [SyncSource(function=tl.strings[int(i)], idle_s=_s(sums[i]), share=round(float(sums[i]) / total, 4))
            for i in top if sums[i] > 0]


def _accumulation_repeats(coll: Collectives, on_device: np.ndarray) -> int:
    """How often the all-reduce size sequence of a step repeats inside it (gradient accumulation
    without ``no_sync`` all-reduces the same buckets once per micro-batch). The smallest repeat
    count over the steps, so one irregular step cannot claim a repeat that is not there."""
    sel = np.flatnonzero(on_device & (np.array(coll.collective) == "all_reduce") & (coll.nbytes > 0)) \
        if coll.nbytes.size else np.zeros(0, dtype=np.int64)
    if sel.size == 0:
        return 1
    repeats = []
    for step in distinct(coll.step[sel]):
        sizes = coll.nbytes[sel[coll.step[sel] == step]]
        n = sizes.size
        best = 1
        for period in range(1, n // 2 + 1):
            if n % period == 0 and np.array_equal(sizes, np.tile(sizes[:period], n // period)):
                best = n // period
                break
        repeats.append(best)
    return int(min(repeats))
