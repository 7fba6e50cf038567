"""Training steps and the analysis window.

The window runs from the start of the first step to the end of the last one, the
last step included, extended to the end of the device work launched inside the
steps (a step's kernels finish after its host range closes). Without steps it runs
from the first to the last device activity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuidle.analysis.links import launch_times, launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.model import I64, HostKind, Steps, Timeline


@dataclass(frozen=True, slots=True)
class StepWindow:
    """The steps analysed and the window they span; ``bounds[i]`` .. ``bounds[i+1]`` is step i."""

    steps: Steps
    start: int
    end: int
    kind: str
    """``profiler_steps``, ``inferred_steps`` or ``gpu_activity``."""

    @property
    def bounds(self) -> I64:
        """Step start times, then the window end: every step is ``[b[i], b[i+1])``."""
        return np.append(self.steps.start, self.end).astype(np.int64)


def find_steps(tl: Timeline, names: NameClasses) -> Steps:
    """Profiler steps if recorded, else steps inferred from repeating host ranges."""
    if len(tl.steps) > 0:
        return tl.steps
    host = tl.host
    loads = np.flatnonzero(names.data_loading[host.name] & (host.kind != HostKind.RUNTIME))
    loads = _outermost(host.start[loads], host.end[loads], loads)
    if loads.size >= 2:
        starts = np.sort(host.start[loads])
        ends = np.append(starts[1:], host.end[loads].max())
        return Steps(np.arange(starts.size, dtype=np.int64), starts, ends, "inferred:dataloader_next")
    opt = np.flatnonzero(names.optimizer_step[host.name])
    opt = _outermost(host.start[opt], host.end[opt], opt)
    if opt.size >= 2:
        ends = np.sort(host.end[opt])
        return Steps(np.arange(ends.size - 1, dtype=np.int64), ends[:-1], ends[1:], "inferred:optimizer_step")
    empty = np.zeros(0, dtype=np.int64)
    return Steps(empty, empty, empty, "none")


def _outermost(starts: I64, ends: I64, rows: I64) -> I64:
    """Rows whose range is not inside an earlier-starting one (nested wrappers count once)."""
    if rows.size == 0:
        return rows
    order = np.lexsort((-ends, starts))
    s, e, r = starts[order], ends[order], rows[order]
    reach = np.maximum.accumulate(e)
    top = np.ones(s.size, dtype=bool)
    top[1:] = s[1:] >= reach[:-1]
    return r[top]


def step_window(tl: Timeline, names: NameClasses) -> StepWindow:
    steps = find_steps(tl, names)
    ops = tl.device_ops
    if len(steps) == 0:
        start, end = int(ops.start.min()), int(ops.end.max())
        one = Steps(np.zeros(1, dtype=np.int64), np.array([start]), np.array([end]), "none")
        return StepWindow(one, start, end, "gpu_activity")
    start, host_end = int(steps.start[0]), int(steps.end[-1])
    launched = launch_times(tl, launcher_rows(tl))
    inside = (launched >= start) & (launched < host_end)
    gpu_end = int(ops.end[inside].max()) if inside.any() else host_end
    kind = "profiler_steps" if steps.source == "profiler_step" else "inferred_steps"
    return StepWindow(steps, start, max(host_end, gpu_end), kind)
