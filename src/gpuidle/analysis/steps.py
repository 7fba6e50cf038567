"""Training steps and the analysis window.

The window runs from the start of the first step to the end of the last one, the
last step included, extended to the end of the device work launched inside the
steps (a step's kernels finish after its host range closes). Without steps it runs
from the first to the last device activity.
"""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import numpy.typing as npt

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.links import launch_times, launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.step_repeats import (
    DEVICE_PERIOD,
    REPEATING_DEVICE_RANGES,
    device_period,
    repeating_device_ranges,
    repeating_ranges,
)
from gpuidle.model import I64, HostKind, StepReport, Steps, Timeline, ranges
from gpuidle.model.arrays import median_of


class StepWindow(msgspec.Struct, frozen=True):
    """The steps analysed and the window they span; ``bounds[i]`` .. ``bounds[i+1]`` is step i."""

    steps: Steps
    start: int
    end: int
    kind: str
    """``profiler_steps`` (steps the profile marks itself), ``inferred_steps`` or ``gpu_activity``."""
    note: str | None = None
    """Where the steps were moved to the device's side: the host's markers ran ahead of it."""
    repeating: str | None = None
    """The name of the range the steps repeat, where they were found so (:mod:`gpuidle.analysis.step_repeats`)."""
    set_aside: str | None = None
    """The trace's own steps not believed: those apart from the device's work, or beginning after the window's end."""

    @property
    def bounds(self) -> I64:
        """Step start times, then the window end: every step is ``[b[i], b[i+1])``."""
        return np.append(self.steps.start, self.end).astype(np.int64)


def find_steps(tl: Timeline, names: NameClasses) -> Steps:
    """The steps the profile marks (its reader chose them, :mod:`gpuidle.sources.step_markers`), else steps
    inferred from repeating host ranges."""
    if len(tl.steps) > 0:
        return tl.steps
    host = tl.host
    loads = np.flatnonzero(names.data_loading[host.name] & (host.kind != HostKind.RUNTIME)
                           & (host.kind != HostKind.PYTHON))
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


def step_window(tl: Timeline, names: NameClasses, launchers: I64 | None = None) -> StepWindow:
    """The steps and the window they span, to the end of the last device work launched inside them (begun inside
    them, for steps on the device's own timeline);
    ``launchers``: :func:`~gpuidle.analysis.links.launcher_rows` of ``tl``, where the caller has them."""
    ops = tl.device_ops
    launched = launch_times(tl, launcher_rows(tl) if launchers is None else launchers)
    runtime = tl.host.kind == HostKind.RUNTIME
    calls = (np.append(launched, tl.host.start[runtime]), np.append(ops.end, tl.host.end[runtime]))
    steps, aside = on_device_work(find_steps(tl, names), ops.start, ops.end, calls)
    repeating = None
    if len(steps) == 0:
        steps, repeating = repeating_device_ranges(tl, names)
    if len(steps) == 0:
        steps, repeating = repeating_ranges(tl, names, launchers)
    if len(steps) == 0:
        steps = device_period(tl)
    if len(steps) == 0:
        start, end = int(ops.start.min()), int(ops.end.max())
        source = SET_ASIDE if aside else "none"
        one = Steps(np.zeros(1, dtype=np.int64), np.array([start]), np.array([end]), source)
        return StepWindow(one, start, end, "gpu_activity", set_aside=aside)
    start, host_end = int(steps.start[0]), int(steps.end[-1])
    on_device = steps.source == REPEATING_DEVICE_RANGES  # on the device's clock: its work starts inside them
    entered = ops.start if on_device else launched
    inside = (entered >= start) & (entered < host_end)
    gpu_end = int(ops.end[inside].max()) if inside.any() else host_end
    kind = ("inferred_steps" if steps.source.startswith("inferred:") or repeating or steps.source == DEVICE_PERIOD
            else "profiler_steps")
    moved, note = (steps, None) if on_device else device_side(steps, ops.start, launched)
    end, tail = _without_tail(tl, int(steps.start[-1]), moved, host_end, gpu_end if inside.any() else start)
    moved, cut = clipped(moved, end)
    return StepWindow(moved, int(moved.start[0]), end, kind, "; ".join(n for n in (note, tail) if n) or None,
                      repeating, "; ".join(n for n in (aside, cut) if n) or None)


def device_windows(tl: Timeline, names: NameClasses, launchers: I64) -> dict[int, StepWindow]:
    """Each device's own window, where the devices run their steps apart (:attr:`Timeline.device_steps`)."""
    return {d: step_window(dataclasses.replace(tl, steps=steps), names, launchers)
            for d, steps in tl.device_steps.items()}


I64_MAX = (1 << 63) - 1
SET_ASIDE = "set_aside"
"""The step source of a window whose trace's steps all lie outside the device's work."""


def on_device_work(steps: Steps, op_start: I64, op_end: I64, calls: tuple[I64, I64]) -> tuple[Steps, str | None]:
    """The steps that cover the device's work: none where no step overlaps a device op or holds a call to the
    device (steps from a clock or a process apart from the kernels'); else those within a typical step of the
    span of the device's work and the host's calls to it (``calls``: their starts, launches included, and ends),
    each ending by then (a step event written days late is a damaged one), with a note naming the steps set
    aside."""
    if len(steps) == 0:
        return steps, None
    lo, hi = int(min(op_start.min(), calls[0].min())), int(max(op_end.max(), calls[1].max()))
    touches = _overlaps_work(steps, op_start, op_end, calls[0])
    if not touches.any():
        return _take(steps, touches), (f"the {len(steps)} step(s) of the trace ({steps.source}) lie outside the "
                                       "device's work: set aside, the window is the device's activity")
    margin = int(median_of((steps.end - steps.start)[touches]))
    keep = (steps.end > lo - margin) & (steps.start < hi + margin)
    near = _take(steps, keep)
    near = Steps(near.number, near.start, np.minimum(near.end, min(hi + margin, I64_MAX)), near.source)
    if keep.all():
        return near, None
    return near, (f"step(s) {ranges(steps.number[~keep].tolist())} lie more than a step away from the device's "
                  "work: set aside")


def _overlaps_work(steps: Steps, op_start: I64, op_end: I64, calls: I64) -> npt.NDArray[np.bool_]:
    """Which steps overlap a device op or hold a call to the device (a host running ahead launches work that runs
    after its step)."""
    us, ue = iv.union(op_start, op_end)
    before = np.searchsorted(us, steps.end, side="left") - 1
    on_device = (before >= 0) & (ue[np.maximum(before, 0)] > steps.start) if us.size else before >= 0
    ordered = np.sort(calls)
    held = np.searchsorted(ordered, steps.end, side="left") > np.searchsorted(ordered, steps.start, side="left")
    out: npt.NDArray[np.bool_] = on_device | held
    return out


def clipped(steps: Steps, end: int) -> tuple[Steps, str | None]:
    """``steps`` within a window ending at ``end``: a step that would begin at or after it (a trailing step that
    launched nothing, moved to the device's side) is left out with a note, the last one ends by ``end``; the
    first step is kept whatever, begun no later than ``end``."""
    keep = steps.start < end
    keep[0] = True
    out = _take(steps, keep)
    out = Steps(out.number, np.minimum(out.start, end), np.minimum(out.end, end), out.source)
    if keep.all():
        return out, None
    return out, f"step(s) {ranges(steps.number[~keep].tolist())} begin after the window's end: left out"


def _take(steps: Steps, keep: npt.NDArray[np.bool_]) -> Steps:
    return Steps(steps.number[keep], steps.start[keep], steps.end[keep], steps.source)


TAIL_SHARE = 0.1
"""A last step that runs this share of a step longer than the others, all of it after everything recorded in it,
ends at its last activity: the rest is the profile stopping, not idle any cause can explain. A lone step does so
where more than half of it comes after everything recorded."""


def _without_tail(tl: Timeline, marked: int, steps: Steps, host_end: int, gpu_end: int) -> tuple[int, str | None]:
    """The window's end: the last step's marker or the device work launched in the steps, whichever is later; where
    the last step (its marker from ``marked`` to ``host_end``) outlasts the others by :data:`TAIL_SHARE` of a step
    or more after the last device work and every host event begun inside it, the last of those instead, with a
    note."""
    host = tl.host
    after = (host.start > marked) & (host.start < host_end)
    last = max(gpu_end, int(np.minimum(host.end[after], host_end).max()) if after.any() else gpu_end)
    end = max(host_end, gpu_end)
    begin = int(steps.start[-1])
    tail = end - last
    if last <= begin or tail <= 0:
        return end, None
    if len(steps) > 1:
        typical = float(median_of(np.diff(steps.start)))
        cut = tail >= TAIL_SHARE * typical and end - begin >= (1 + TAIL_SHARE) * typical
    else:
        cut = tail > 0.5 * (end - begin)
    if not cut:
        return end, None
    return last, (f"the last step's marker runs {tail / 1e6:.2f} ms past everything recorded in it (the profile "
                  "stopping): that tail is left out of the window")


AHEAD_SHARE = 0.1
"""The host's step markers run ahead of the device when the first work launched in a step waits, in the median
step, this share of a step or more in the queue before it starts..."""
AHEAD_MIN_NS = 1_000_000
"""...and at least 1 ms: a shorter lag is the launch queue's own latency and moves no step enough to matter."""


def device_side(steps: Steps, op_start: I64, launched: I64) -> tuple[Steps, str | None]:
    """``steps`` as the device runs them where the host runs ahead: each step from the start of the first work
    launched inside its host range (a queue the device works through later), with a note of the lag; else as
    they are. A step that launched nothing keeps its host start moved by the median lag."""
    n = len(steps)
    if n < 2 or op_start.size == 0:
        return steps, None
    step_of = np.searchsorted(steps.start, launched, side="right") - 1
    ok = (step_of >= 0) & (launched < steps.end[np.clip(step_of, 0, n - 1)])
    rows = np.flatnonzero(ok)
    rows = rows[np.lexsort((launched[rows], step_of[rows]))]
    first_rows = rows[np.r_[True, step_of[rows][1:] != step_of[rows][:-1]]] if rows.size else rows
    if first_rows.size < 2:
        return steps, None
    which = step_of[first_rows]
    queued = op_start[first_rows] - launched[first_rows]
    lag = float(median_of(queued))
    if lag < max(AHEAD_MIN_NS, AHEAD_SHARE * float(median_of(np.diff(steps.start)))):
        return steps, None
    shift = int(median_of(op_start[first_rows] - steps.start[which]))
    starts = steps.start + shift
    starts[which] = op_start[first_rows]
    starts = np.maximum.accumulate(starts)
    ends = np.append(starts[1:], max(int(steps.end[-1]), int(starts[-1]) + 1))
    note = (f"the host's step markers run ahead of the device: a step's first work waits {lag / 1e6:.2f} ms in the "
            f"median step (up to {float(queued.max()) / 1e6:.2f} ms) before it starts; steps are taken where the "
            "device begins each one's work")
    return Steps(steps.number, starts.astype(np.int64), ends.astype(np.int64), steps.source), note


WARMUP = "warmup"
PROFILER = "profiler"
OUTLIER = "outlier"
TRUNCATED = "truncated"
"""The profile's first or last step, cut short where the recording started or stopped."""
TRUNCATED_SHARE = 0.5
"""A first or last step under half the median of the others is cut, not fast: steps of one loop differ by far
less..."""
TRUNCATED_SPREAD = 0.25
"""...where the others are alike (their scaled MAD at most a quarter of their median); steps that differ by more
among themselves (steps inferred from calls of uneven work) tell nothing of a cut."""
NO_GPU_WORK = "no_gpu_work"
"""A step in which no device work starts: nothing steady to measure (a trailing profiler step, a stall)."""
MAD_K = 5.0
"""A step beyond median + 5 scaled MADs is not steady state (a normal step is within ~3)."""
MIN_EXCESS = 0.25
"""...and at least 25 % above the median, so identical steps with a tiny MAD keep their jitter."""
MIN_STEPS_TO_JUDGE = 3


def steady_state(dur: npt.ArrayLike, disturbed: npt.ArrayLike | None = None,
                 busy: npt.ArrayLike | None = None) -> list[str | None]:
    """Why each step is not steady state, or None.

    ``profiler`` for steps a profiler started, ran or stopped in (``disturbed``); then,
    with at least three steps, a step beyond ``median + max(5 · 1.4826 · MAD, 25 % of
    the median)`` of the other steps is ``warmup`` when no steady step came before it
    (cudnn autotuning, lazy init, allocator growth), else ``outlier``; a long step that recurs (two others within
    15 % of it) is the loop's rhythm and stays steady. The median and MAD are robust: up to half the steps can be
    slow without moving them. With ``busy``
    the same bound applies to each step's busy time too: a step of ordinary length whose
    compute phases held a one-time wait (DDP rebuilding its buckets in the second step's
    forward waits there for every rank) is not a steady step either; that excess must also
    reach 25 % of the median step, so that a device busy for a sliver of a data-bound step
    (a few µs in one step, a few hundred in the next) does not make half its steps outliers.
    """
    d = np.asarray(dur, dtype=np.float64)
    out: list[str | None] = [None] * d.size
    prof = np.zeros(d.size, dtype=bool) if disturbed is None else np.asarray(disturbed, dtype=bool)
    for i in np.flatnonzero(prof):
        out[i] = PROFILER
    rest = np.flatnonzero(~prof)
    if rest.size < MIN_STEPS_TO_JUDGE:
        return out
    long = _beyond(d, rest)
    beyond = long.copy()
    if busy is not None:
        beyond |= _beyond(np.asarray(busy, dtype=np.float64), rest, MIN_EXCESS * float(median_of(d[rest])))
    settled = rest[np.flatnonzero(~beyond[rest])]
    # after the first steady step, a long step that recurs is the loop's rhythm (warm-up steps never count)
    rhythm = _recurs(d, rest[rest >= settled[0]]) & long if settled.size else np.zeros_like(long)
    steady_seen = False
    for i in rest:
        if beyond[i] and not (steady_seen and rhythm[i]):
            out[i] = OUTLIER if steady_seen else WARMUP
        else:
            steady_seen = True
    return out


RECUR_ALIKE = 0.15
RECUR_OTHERS = 2
"""A long step with at least two others within 15 % of its length is the loop's rhythm (a DataLoader's worker pool
refilling every few steps), not an outlier: its time is paid again and again, and belongs in the per-step mean."""


def _recurs(values: npt.NDArray[np.float64], rest: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    """Which steps have at least :data:`RECUR_OTHERS` other steps of ``rest`` within :data:`RECUR_ALIKE` of their
    value."""
    v = np.sort(values[rest])
    low = np.searchsorted(v, values * (1 - RECUR_ALIKE), side="left")
    high = np.searchsorted(v, values * (1 + RECUR_ALIKE), side="right")
    out: npt.NDArray[np.bool_] = high - low - 1 >= RECUR_OTHERS  # less the step itself
    return out


def _beyond(values: npt.NDArray[np.float64], rest: npt.NDArray[np.intp], least: float = 0.0) -> npt.NDArray[np.bool_]:
    """Which steps lie beyond ``median + max(MAD_K · MAD, MIN_EXCESS · median, least)`` of the steps in ``rest``."""
    median = float(median_of(values[rest]))
    mad = 1.4826 * float(median_of(np.abs(values[rest] - median)))
    out: npt.NDArray[np.bool_] = values > median + max(MAD_K * mad, MIN_EXCESS * median, least)
    return out


def truncated_edges(dur: npt.ArrayLike, excluded: list[str | None]) -> list[str | None]:
    """``excluded`` with the first and the last step marked :data:`TRUNCATED` where it lasted under
    :data:`TRUNCATED_SHARE` of the median of the other steady steps (at least two of them, alike): a profile starts
    and stops where it does, mid-step as often as not, and a cut step in the mean would shorten every per-step
    figure."""
    d = np.asarray(dur, dtype=np.float64)
    out = list(excluded)
    if d.size < MIN_STEPS_TO_JUDGE:
        return out
    for edge in (d.size - 1, 0):
        others = d[[i for i in range(d.size) if i != edge and out[i] is None]]
        if others.size < 2 or out[edge] is not None:
            continue
        median = float(median_of(others))
        alike = 1.4826 * float(median_of(np.abs(others - median))) <= TRUNCATED_SPREAD * median
        if alike and d[edge] < TRUNCATED_SHARE * median:
            out[edge] = TRUNCATED
    return out


def after_profiling(profiled: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Steps a profiler ran in, and the first step after each profiled run (its shutdown lands there)."""
    p = np.asarray(profiled, dtype=bool)
    out = p.copy()
    out[1:] |= p[:-1] & ~p[1:]
    return out


def counted(steps: list[StepReport], include_all: bool = False) -> list[StepReport]:
    """The steps per-step figures and gains are computed on: the steady ones (all, if none is steady)."""
    steady = [s for s in steps if s.excluded is None]
    return steps if include_all or not steady else steady
