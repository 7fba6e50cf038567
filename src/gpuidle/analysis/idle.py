"""Busy time, idle time, and the cause of every idle nanosecond, per device.

*Busy* is the union of compute kernels, copies and sets on all streams of a device.
A collective (NCCL/RCCL) kernel is not compute: where one runs with no compute
beside it, the device is idle waiting on the network, and that time is charged to
``communication`` (or ``straggler_wait`` where a cross-rank analysis says the
collective was waiting for a late rank). ``active`` is the union of all device work,
collectives included, which is what nvidia-smi's utilization counts.

Each idle interval is split by what was going on at that moment, the first matching
layer winning:

1. ``straggler_wait`` then ``communication``: a collective kernel is running.
2. The launch in flight: the op that ends the gap was launched during the gap (or
   just before it, when the gap is no longer than a launch takes, 50 µs), so the rest
   of the gap is launch latency (``launch_overhead``; ``memcpy`` when the op is a
   host-to-device copy being staged).
3. ``data_loading``: a host thread is inside a DataLoader ``__next__`` (or a range named
   like data loading, or a file read traced by Nsight's OS runtime trace).
4. ``host_sync``: a feeding thread is blocked in a synchronize call, a synchronous
   copy, or ``aten::item``/``_local_scalar_dense``.
5. ``memcpy``: a feeding thread is inside a host-to-device copy call (pageable memory
   makes it a staged, blocking copy).
6. ``communication``: a feeding thread is inside a host-side collective call.
7. ``cpu_compute``: a feeding thread is inside an operator that launches nothing.
8. ``launch_overhead``: a feeding thread is inside an operator that launches device
   work, or inside any other runtime call.
9. ``unattributed``: none of these (e.g. Python between operators).

*Feeding threads* are the host threads whose runtime calls launched work on the
device, and those that hand work to them (``Timeline.handoffs``). The causes tile
the idle time exactly; :meth:`DeviceIdle.self_check` proves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import StepWindow
from gpuidle.model import CAUSES, HTOD_KINDS, I64, Cause, CopyKind, DeviceOpKind, HostKind, Timeline

CAUSE_INDEX = {c: i for i, c in enumerate(CAUSES)}
MAX_LAUNCH_LATENCY_NS = 50_000
"""Longest gap still charged to a launch issued before the gap began (launches take 5-20 µs)."""


@dataclass(frozen=True, slots=True)
class DeviceIdle:
    """Idle attribution of one device over a window. All times in ns."""

    device: int
    window: tuple[int, int]
    busy: iv.Intervals
    active: iv.Intervals
    comm: iv.Intervals
    """Union of collective kernels."""
    segments: tuple[I64, I64, np.ndarray]
    """Idle segments ``(start, end, cause index into CAUSES)``, sorted and tiling the idle time."""
    step_busy: I64
    """Busy ns per step."""
    step_idle: I64
    """Idle ns per step and cause: shape ``(steps, len(CAUSES))``."""

    @property
    def window_ns(self) -> int:
        return self.window[1] - self.window[0]

    @property
    def busy_ns(self) -> int:
        return iv.total(self.busy)

    @property
    def idle_ns(self) -> int:
        return self.window_ns - self.busy_ns

    def idle_by_cause(self) -> dict[Cause, int]:
        sums = self.step_idle.sum(axis=0)
        return {c: int(sums[i]) for i, c in enumerate(CAUSES)}

    def self_check(self) -> None:
        """Busy + every cause = window, overall and per step; causes tile idle exactly."""
        seg_total = int((self.segments[1] - self.segments[0]).sum())
        causes = int(self.step_idle.sum())
        if not (seg_total == causes == self.idle_ns and self.busy_ns + causes == self.window_ns):
            raise AssertionError(
                f"device {self.device}: busy {self.busy_ns} + causes {causes} != window {self.window_ns}"
            )
        if int(self.step_busy.sum()) != self.busy_ns:
            raise AssertionError(f"device {self.device}: per-step busy does not add up")


def attribute_idle(
    tl: Timeline,
    names: NameClasses,
    window: StepWindow,
    launchers: I64,
    straggler: dict[int, iv.Intervals] | None = None,
) -> list[DeviceIdle]:
    """Attribute the idle time of every device of ``tl`` (see the module docstring)."""
    return [
        _device_idle(tl, names, window, launchers, d, (straggler or {}).get(d, iv.EMPTY))
        for d in tl.devices
    ]


def feeding_threads(tl: Timeline, launchers: I64, device: int) -> np.ndarray:
    """Host threads that launched work on ``device``, and the threads that hand work to those
    (``tl.handoffs``: a Python thread dispatching to XLA's execute threads); all threads when
    nothing is linked."""
    rows = launchers[(tl.device_ops.device == device) & (launchers >= 0)]
    if rows.size == 0:
        return iv.sorted_unique(tl.host.thread.astype(np.int64))
    launching = {int(t) for t in np.unique(tl.host.thread[rows])}
    dispatching = {src for src, dst in tl.handoffs if dst in launching}
    return np.array(sorted(launching | dispatching), dtype=np.int64)


def _device_idle(
    tl: Timeline, names: NameClasses, window: StepWindow, launchers: I64, device: int,
    straggler: iv.Intervals,
) -> DeviceIdle:
    ops, host = tl.device_ops, tl.host
    lo, hi = window.start, window.end
    on_dev = ops.device == device
    compute = on_dev & (ops.kind != DeviceOpKind.COLLECTIVE)
    collective = on_dev & (ops.kind == DeviceOpKind.COLLECTIVE)
    busy = iv.clip(iv.union(ops.start[compute], ops.end[compute]), lo, hi)
    active = iv.clip(iv.union(ops.start[on_dev], ops.end[on_dev]), lo, hi)
    comm = iv.clip(iv.union(ops.start[collective], ops.end[collective]), lo, hi)
    idle = iv.complement(busy, lo, hi)

    threads = feeding_threads(tl, launchers, device)
    feeding = np.isin(host.thread, threads)
    is_op = host.kind == HostKind.OP
    is_rt = host.kind == HostKind.RUNTIME
    name = host.name

    copy_of_call = _copy_kind_of_calls(tl, launchers)
    htod_call = is_rt & names.memcpy_call[name] & np.isin(copy_of_call, HTOD_KINDS)
    blocking_copy = is_rt & names.memcpy_call[name] & ~htod_call & (
        names.synchronous_memcpy[name] | (copy_of_call == CopyKind.DTOH_PAGEABLE)
    )
    sync = feeding & ((is_rt & names.sync_call[name]) | (is_op & names.item_op[name]) | blocking_copy)
    loading = (names.data_loading[name] | names.file_read[name]) & ~is_rt
    coll_host = feeding & ~is_rt & names.collective_host[name]
    launching = _launching_ops(tl, launchers, is_op & feeding)
    plain_op = feeding & is_op & ~launching & ~names.item_op[name] & ~names.collective_host[name]
    other_rt = feeding & is_rt & ~sync & ~htod_call

    inflight_launch, inflight_copy = _launches_in_flight(tl, launchers, compute, idle, hi)

    def rows(mask: np.ndarray) -> iv.Intervals:
        return host.start[mask], host.end[mask]

    layers: list[tuple[Cause, iv.Intervals]] = [
        (Cause.STRAGGLER_WAIT, straggler),
        (Cause.COMMUNICATION, comm),
        (Cause.MEMCPY, inflight_copy),
        (Cause.LAUNCH_OVERHEAD, inflight_launch),
        (Cause.DATA_LOADING, rows(loading)),
        (Cause.HOST_SYNC, rows(sync)),
        (Cause.MEMCPY, rows(feeding & htod_call)),
        (Cause.COMMUNICATION, rows(coll_host)),
        (Cause.CPU_COMPUTE, rows(plain_op)),
        (Cause.LAUNCH_OVERHEAD, rows(launching | other_rt)),
    ]
    layer_cause = np.array([CAUSE_INDEX[c] for c, _ in layers] + [CAUSE_INDEX[Cause.UNATTRIBUTED]], dtype=np.int16)
    bounds = window.bounds
    seg_s, seg_e, label = iv.label_segments(idle, [layer for _, layer in layers], extra_points=bounds)
    cause = layer_cause[label]
    n_steps = bounds.size - 1
    k = len(CAUSES)
    step_of = np.clip(np.searchsorted(bounds, seg_s, side="right") - 1, 0, n_steps - 1)
    step_idle = np.bincount(step_of * k + cause, weights=(seg_e - seg_s), minlength=n_steps * k)
    b_s, b_e, _ = iv.label_segments(busy, [], extra_points=bounds)
    b_step = np.clip(np.searchsorted(bounds, b_s, side="right") - 1, 0, n_steps - 1)
    step_busy = np.bincount(b_step, weights=(b_e - b_s), minlength=n_steps)
    result = DeviceIdle(
        device=device, window=(lo, hi), busy=busy, active=active, comm=comm,
        segments=(seg_s, seg_e, cause),
        step_busy=np.rint(step_busy).astype(np.int64),
        step_idle=np.rint(step_idle).astype(np.int64).reshape(n_steps, k),
    )
    result.self_check()
    return result


def _copy_kind_of_calls(tl: Timeline, launchers: I64) -> np.ndarray:
    """For each host row, the kind of copy it launched (``CopyKind.NONE`` if none)."""
    kinds = np.zeros(len(tl.host), dtype=np.int8)
    linked = launchers >= 0
    kinds[launchers[linked]] = tl.device_ops.copy_kind[linked]
    return kinds


def _launching_ops(tl: Timeline, launchers: I64, candidates: np.ndarray) -> np.ndarray:
    """Operators (among ``candidates``) during which their own thread launched device work."""
    host = tl.host
    out = np.zeros(len(host), dtype=bool)
    launch_rows = iv.sorted_unique(launchers[launchers >= 0])
    if launch_rows.size == 0 or not candidates.any():
        return out
    span = int(max(host.end.max(), tl.device_ops.end.max())) + 1
    key = host.thread[launch_rows].astype(np.int64) * span + host.start[launch_rows]
    key.sort()
    rows = np.flatnonzero(candidates)
    base = host.thread[rows].astype(np.int64) * span
    first = np.searchsorted(key, base + host.start[rows], side="left")
    past = np.searchsorted(key, base + host.end[rows], side="left")
    out[rows] = past > first
    return out


def _launches_in_flight(
    tl: Timeline, launchers: I64, compute: np.ndarray, idle: iv.Intervals, window_end: int,
) -> tuple[iv.Intervals, iv.Intervals]:
    """``[launch call start, op start)`` for the op that ends each idle gap.

    Once the host has issued the launch, the rest of the gap is launch latency (or,
    for a host-to-device copy, the staging of the copy), whatever the host does next.
    """
    ops = tl.device_ops
    rows = np.flatnonzero(compute)
    inside = idle[1] < window_end
    gap_start, ends_at = idle[0][inside], idle[1][inside]
    if rows.size == 0 or ends_at.size == 0:
        return iv.EMPTY, iv.EMPTY
    rows = rows[np.argsort(ops.start[rows], kind="stable")]
    pos = np.minimum(np.searchsorted(ops.start[rows], ends_at, side="left"), rows.size - 1)
    op = rows[pos]
    ok = (ops.start[op] == ends_at) & (launchers[op] >= 0)
    op, gap_start, gap_end = op[ok], gap_start[ok], ends_at[ok]
    issued = tl.host.start[launchers[op]]
    # Issued during the gap, or just before it with the gap no longer than a launch takes. An op
    # queued long before waited on a dependency, not on its launch: the host layers decide.
    ok = ((issued >= gap_start) | (gap_end - issued <= MAX_LAUNCH_LATENCY_NS)) & (issued < gap_end)
    launched = np.maximum(issued, gap_start)
    op, gap_end, launched = op[ok], gap_end[ok], launched[ok]
    is_copy = np.isin(ops.copy_kind[op], HTOD_KINDS)
    return (launched[~is_copy], gap_end[~is_copy]), (launched[is_copy], gap_end[is_copy])
