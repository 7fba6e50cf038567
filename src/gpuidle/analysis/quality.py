"""Is the trace itself trustworthy? Notes on distortions a reader should know about."""

from __future__ import annotations

import numpy as np

from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.step_repeats import REPEATING_DEVICE_RANGES
from gpuidle.analysis.steps import StepWindow
from gpuidle.model import DeviceOpKind, HostKind, KernelFacts, Timeline

SLOW_LAUNCH_US = 20.0
"""A healthy cudaLaunchKernel takes 2-10 µs on the host; far above means overhead or contention."""
OVERLAP_TOLERANCE_NS = 1_000
STEP_MARKERS = {"kineto": "ProfilerStep ranges, engine iterations or step-named annotations",
                "nsys": "ProfilerStep, step-named NVTX ranges or engine iterations"}
"""What marks steps in each format; a reader whose format is not here writes its own note (XSpace names
the framework's step annotation)."""


def quality_notes(tl: Timeline, names: NameClasses, window: StepWindow, kernels: KernelFacts) -> list[str]:
    notes: list[str] = []
    if window.set_aside:
        notes.append(window.set_aside)
    if window.kind == "gpu_activity" and not window.note and not window.set_aside:
        notes.append("no profiler steps and none could be inferred: the window is first to last GPU activity")
    elif window.repeating is not None and window.steps.source == REPEATING_DEVICE_RANGES:
        notes.append(f"no step markers: {len(window.steps)} steps from the range {window.repeating!r} on the GPU's "
                     "own timeline, which repeats over the device's work")
    elif window.repeating is not None:
        notes.append(f"no step markers: {len(window.steps)} steps from the range {window.repeating!r}, which repeats "
                     "with the device's work launched under it")
    elif window.kind == "inferred_steps" and tl.meta.format in STEP_MARKERS:
        notes.append(f"no {STEP_MARKERS[tl.meta.format]}: steps inferred ({window.steps.source})")
    if kernels.median_launch_us is not None and kernels.median_launch_us > SLOW_LAUNCH_US:
        overhead = "profiler overhead (record_shapes/with_stack)" if tl.meta.format == "kineto" else "profiler overhead"
        notes.append(
            f"median kernel launch call takes {kernels.median_launch_us:.1f} µs on the host (normal: 2-10 µs): "
            f"{overhead}, CPU contention or a throttled CPU inflates host time (gpuidle run -- CMD reports the "
            "cgroup's CPU quota and throttling, the cores' clocks and steal time)"
        )
    host = tl.host
    if not (host.kind == HostKind.RUNTIME).any():
        notes.append("no CUDA runtime events: launches cannot be linked to kernels, so host causes are approximate")
    elif not (tl.device_ops.correlation >= 0).any():
        notes.append("device events carry no correlation ids: launches cannot be linked to kernels")
    overlapping = _overlapping_on_stream(tl)
    if overlapping:
        notes.append(f"{overlapping} device ops overlap an earlier op on the same stream: clock skew or a broken trace")
    bounds = window.bounds
    starts = tl.device_ops.start
    starts = starts[(starts >= window.start) & (starts < window.end)]
    counts = np.bincount(np.searchsorted(bounds, starts, side="right") - 1, minlength=bounds.size - 1)
    empty = [int(n) for n, c in zip(window.steps.number, counts, strict=False) if c == 0]
    if empty:
        notes.append(f"steps with no GPU activity at all: {empty[:10]}")
    cut = _device_trace_cut(tl, names)
    if cut:
        notes.append(cut)
    return notes


LAUNCHES_PAST_THE_END = 10
"""Launch calls after the last device activity ends: a few are the launches still queued when the profile stopped;
more mean the device's events stop while the host goes on launching."""


def _device_trace_cut(tl: Timeline, names: NameClasses) -> str | None:
    """The device's events stop while the host keeps launching work (a full CUPTI buffer, a device profiler stopped
    early): said, since the steps past that point have no device work to measure and are left out."""
    host, ops = tl.host, tl.device_ops
    if len(ops.start) == 0 or len(host) == 0:
        return None
    last = int(ops.end.max())
    launches = (host.kind == HostKind.RUNTIME) & names.launch_call[host.name] & (host.start > last)
    n = int(launches.sum())
    if n < LAUNCHES_PAST_THE_END:
        return None
    past = (int(host.end[launches].max()) - last) / 1e6
    return (f"the device's events stop {past:.1f} ms before the host's last launch ({n} launches after them): the "
            "device trace is incomplete (a full profiler buffer?); steps past it have no device work and are left "
            "out")


def _overlapping_on_stream(tl: Timeline) -> int:
    ops = tl.device_ops
    sel = ops.kind != DeviceOpKind.COLLECTIVE
    if sel.sum() < 2:
        return 0
    dev, stream, start, end = ops.device[sel], ops.stream[sel], ops.start[sel], ops.end[sel]
    order = np.lexsort((start, stream, dev))
    dev, stream, start, end = dev[order], stream[order], start[order], end[order]
    same = (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])
    return int((same & (start[1:] < end[:-1] - OVERLAP_TOLERANCE_NS)).sum())
