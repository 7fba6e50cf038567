"""What one rank's trace can and cannot tell, said as statements above the fixes, never as fixes.

Each statement names what the evidence lacks, in numbers, and the one change to the recording that would show
it: a single step (per-step gains of idle causes cannot show their recurrence), a fragment of the work (no GEMM
and no collective on several GPUs), GPUs without kernels, a window that is all graph capture, launches whose
kernels were never recorded, a host that runs ahead of the device, a profile's tail, idle with no host event
under it. A recording change saves no time; the fixes hold changes to the program only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import StepWindow, counted
from gpuidle.model import QUALITY_KINDS, Cause, DeviceOpKind, HostKind, HostSide, RankReport, Timeline, TraceQuality
from gpuidle.model.arrays import distinct

SEVERAL_STEPS = {
    "kineto": "profile several steps: torch.profiler.schedule(wait=1, warmup=2, active=5), prof.step() after each",
    "xspace": "profile several steps: start the profiler before a run of five steps and stop it after them",
    "nsys": "profile several steps: nsys profile --capture-range=cudaProfilerApi around five steps",
}
ENGINE_STEPS = ("profile several of the engine's iterations: its own profiler (vLLM: VLLM_TORCH_PROFILER_DIR, then "
                "llm.start_profile() and llm.stop_profile() around several requests)")
"""A serving engine owns its loop: no training-loop snippet."""
WHOLE_STEPS = "profile whole steps: start the profiler before a step begins and stop it after the step ends"
HOST_ACTIVITY = {
    "kineto": "record the host: activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]",
    "xspace": "record the host: ProfileOptions(host_tracer_level=2)",
    "nsys": "mark the program's phases with NVTX ranges (nvtxRangePushA/nvtxRangePop, #include <nvtx3/nvToolsExt.h>) "
            "and trace them: nsys profile --trace=cuda,nvtx,osrt",
}
DEVICE_RECORDS = {
    "kineto": "keep the device records: a larger CUPTI buffer, or a shorter profiled window",
    "nsys": "keep the device records: a shorter capture range (nsys drops activity when its buffers fill)",
}
LOST_SHARE = 0.05
"""Launch calls linked to no device record, past this share of the launches, mean the device's records were lost
(a full buffer, a dropped activity kind); a few are launches still queued when the profile stopped."""
LOST_MIN = 10
CAPTURE_SHARE = 0.5
"""A window whose graph capture holds more than this share of it shows how the program is prepared, not how it
runs."""


def rank_quality(tl: Timeline, names: NameClasses, window: StepWindow, report: RankReport,
                 unattributed: iv.Intervals = iv.EMPTY) -> list[TraceQuality]:
    """The statements that hold for this rank's trace, in :data:`~gpuidle.model.QUALITY_KINDS` order;
    ``unattributed``: the primary device's idle no cause explains, to name the host range it falls under."""
    fmt = tl.meta.format
    out: list[TraceQuality] = []
    steps = counted(report.steps)
    device = report.primary()
    if len(steps) < 2 and device.idle_s > 0:
        out.append(TraceQuality(
            kind="one_step",
            says=(f"one step ({_source(report)}): a gain from idle is given only where its cause recurs within the "
                  "step (no one call holds half of it); gains from kernel time hold from one step"),
            recording=ENGINE_STEPS if report.workload is not None and report.workload.engine
            else SEVERAL_STEPS.get(fmt, SEVERAL_STEPS["kineto"])))
    gpus = sorted(set(tl.meta.device_names) | set(tl.devices))
    several = len(tl.devices) > 1 or (report.world_size or 1) > 1  # a process lists every GPU it sees, drives one
    gemm = bool((names.gemm | names.conv)[tl.device_ops.name].any()) if len(tl.device_ops) else False
    if several and not gemm and report.communication.comm_s == 0 and report.kernels.count:
        job = max(len(gpus) if len(tl.devices) > 1 else 1, report.world_size or 1)
        out.append(TraceQuality(
            kind="fragment",
            says=(f"a fragment of a step: {report.kernels.count} kernels, none a GEMM or convolution, and no "
                  f"collective in a job of {job} GPUs"),
            recording=WHOLE_STEPS))
    with_kernels = {int(d) for d in distinct(tl.device_ops.device[tl.device_ops.kind == DeviceOpKind.KERNEL])}
    empty = [g for g in gpus if g not in with_kernels]
    if len(tl.devices) > 1 and empty:  # a process driving several GPUs (one that lists every GPU it sees drives one)
        out.append(TraceQuality(
            kind="gpus_without_kernels",
            says=f"{len(empty)} of {len(gpus)} GPUs in the trace ran no kernel (GPU {_list(empty)})",
            recording="profile every GPU of the step: each device's activity in the same window"))
    capture = sum(c.dur_s for c in report.startup if c.kind == "graph_capture")
    if report.window.dur_s > 0 and capture > CAPTURE_SHARE * report.window.dur_s:
        out.append(TraceQuality(
            kind="capture_only",
            says=(f"CUDA-graph capture is {capture * 1e3:.1f} ms of the {report.window.dur_s * 1e3:.1f} ms window: "
                  "the trace shows the graphs being prepared, not their replay"),
            recording="profile after warm-up: steps that replay the captured graphs"))
    captures = [(round(c.start_s * 1e9), round((c.start_s + c.dur_s) * 1e9)) for c in report.startup
                if c.kind == "graph_capture"]
    lost = _launches_without_kernel(tl, names, captures)
    if lost is not None:
        n, total = lost
        out.append(TraceQuality(
            kind="device_records_lost",
            says=f"{n} of {total} kernel launches have no device record: the device's records were lost or dropped",
            recording=DEVICE_RECORDS.get(fmt, DEVICE_RECORDS["kineto"])))
    if window.note and "run ahead" in window.note:
        out.append(TraceQuality(kind="host_ahead", says=window.note.split("; the last step")[0]))
    if window.note and "profile stopping" in window.note:
        out.append(TraceQuality(kind="profile_tail", says=window.note.split("; ")[-1]))
    unrecorded = _host_unrecorded(report, fmt, _range_under(tl, names, unattributed))
    if unrecorded is not None:
        out.append(unrecorded)
    return out


def records_lost(tl: Timeline) -> TraceQuality:
    """The statement of a trace that lost every device record (``tl.meta.device_records_lost`` launches): what is
    missing, and that no device figure can be given, only the host's side."""
    return TraceQuality(
        kind="device_records_lost",
        says=(f"device records lost: {tl.meta.device_records_lost} kernel launches with no kernel record, and no "
              "device activity in the trace: no utilization, no idle by cause and no fix that needs the device's "
              "timing can be given; what the host did is reported instead"),
        recording=DEVICE_RECORDS.get(tl.meta.format, DEVICE_RECORDS["kineto"]))


def _source(report: RankReport) -> str:
    if report.step_source == "none":
        return "no step markers and nothing that repeats: the window is first to last GPU activity"
    return f"from {report.step_source.replace('_', ' ')}"


def _list(xs: list[int]) -> str:
    return ", ".join(str(x) for x in xs)


def _launches_without_kernel(tl: Timeline, names: NameClasses,
                             captures: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Launch calls whose correlation id no device record carries, and all launch calls with one, where the first
    are past :data:`LOST_SHARE` of the second and :data:`LOST_MIN`; launches inside a graph capture (``captures``)
    are recorded, not run, and count in neither."""
    host = tl.host
    if not len(host) or not tl.strings:
        return None
    launching = (host.kind == HostKind.RUNTIME) & names.launch_call[host.name] & (host.correlation >= 0)
    for begin, end in captures:
        launching &= ~((host.start >= begin) & (host.start < end))
    launch = np.flatnonzero(launching)
    if launch.size == 0:
        return None
    known = np.sort(tl.device_ops.correlation[tl.device_ops.correlation >= 0])  # np.isin loads numpy.ma: 8 ms
    if known.size == 0:
        found = np.zeros(launch.size, dtype=bool)
    else:
        wanted = host.correlation[launch]
        found = known[np.minimum(np.searchsorted(known, wanted), known.size - 1)] == wanted
    n = int((~found).sum())
    if n < max(LOST_MIN, LOST_SHARE * launch.size):
        return None
    return n, int(launch.size)


UNRECORDED_SHARE = 0.5
"""Idle with no host event under it, past half the idle (or the largest cause), is what the trace cannot explain."""


def _host_unrecorded(report: RankReport, fmt: str, under: str | None) -> TraceQuality | None:
    """Idle the trace has no host event for, where it is most of the idle or its largest cause: what the host did
    then is not in the trace. A recording change only where something the attribution reads was not recorded."""
    steps = counted(report.steps)
    idle = {c: sum(s.idle_by_cause_s.get(c, 0.0) for s in steps) for c in report.primary().idle_by_cause_s}
    total = sum(v for c, v in idle.items() if c != Cause.STRAGGLER_WAIT.value)
    un = idle.get(Cause.UNATTRIBUTED.value, 0.0)
    largest = max(idle, key=lambda c: idle[c]) if idle else None
    if total <= 0 or un <= 0 or (un <= UNRECORDED_SHARE * total and largest != Cause.UNATTRIBUTED.value):
        return None
    ev = report.host_events or {}
    head = f"{un / max(len(steps), 1) * 1e3:.2f} ms a step of idle ({un / total:.0%} of it) has no host event under it"
    missing = []
    if ev.get("cpu_ops", 0) == 0 and ev.get("annotations", 0) == 0:
        missing.append("no host operators or ranges recorded")
    if ev.get("runtime_calls", 0) == 0:
        missing.append("no CUDA/HIP runtime calls")
    elif ev.get("linked_launches", 0) == 0:
        missing.append("no runtime call linked to a kernel (no correlation ids)")
    if missing:
        return TraceQuality(kind="host_unrecorded", says=f"{head}: {'; '.join(missing)}",
                            recording=HOST_ACTIVITY.get(fmt, HOST_ACTIVITY["kineto"]))
    if under is not None:
        return TraceQuality(kind="host_unrecorded", says=f"{head} but {under}: what runs there launches nothing and "
                                                         "calls nothing the trace records")
    recorded = f"{ev.get('cpu_ops', 0)} host operators and {ev.get('annotations', 0)} host ranges are recorded"
    return TraceQuality(kind="host_unrecorded",
                        says=f"{head}: {recorded}, and the idle falls outside them (another thread or process, or "
                             "code outside them)")


def job_quality(reports: Sequence[RankReport | HostSide]) -> list[TraceQuality]:
    """The ranks' statements (those analysed, and those reported from their host side), one per kind: the lowest
    rank's words, with every rank it holds for."""
    out: dict[str, TraceQuality] = {}
    for r in sorted(reports, key=lambda r: r.rank):
        for q in r.quality:
            if q.kind in out:
                out[q.kind].ranks.append(r.rank)
            else:
                out[q.kind] = TraceQuality(kind=q.kind, says=q.says, recording=q.recording, ranks=[r.rank])
    return [out[k] for k in QUALITY_KINDS if k in out]


RANGE_SHARE = 0.5
"""A host range (an NVTX range, a ``record_function``) under which at least this share of the unexplained idle
falls names the phase the host was in: the compile, exchange or user region the device waited on."""


def _range_under(tl: Timeline, names: NameClasses, unattributed: iv.Intervals) -> str | None:
    """``the range 'halo exchange' (1.20 ms, 80 % of it)`` where one host range's name holds :data:`RANGE_SHARE` of
    the unexplained idle, the outermost of the names that do; None otherwise."""
    total = iv.total(unattributed)
    host = tl.host
    if total <= 0 or not len(host) or not tl.strings:
        return None
    ranges = (host.kind == HostKind.ANNOTATION) & ~names.region[host.name] & ~names.profiler_step[host.name]
    rows = np.flatnonzero(ranges)
    best: tuple[int, int, int] | None = None
    for name in distinct(host.name[rows]).tolist():
        mine = rows[host.name[rows] == name]
        if int((host.end[mine] - host.start[mine]).sum()) < RANGE_SHARE * total:
            continue
        covered = iv.total(iv.intersect(iv.union(host.start[mine], host.end[mine]), unattributed))
        span = int((host.end[mine] - host.start[mine]).max())
        if covered >= RANGE_SHARE * total and (best is None or span > best[2]):
            best = (int(name), covered, span)
    if best is None:
        return None
    return f"the range {tl.strings[best[0]]!r} ({best[1] / 1e6:.2f} ms, {best[1] / total:.0%} of it)"
