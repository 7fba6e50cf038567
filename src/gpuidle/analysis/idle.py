"""Busy time, idle time, and the cause of every idle nanosecond, per device.

*Busy* is the union of compute kernels, copies and sets on all streams of a device.
A collective (NCCL/RCCL) kernel is not compute: where one runs with no compute
beside it, the device is idle waiting on the network, and that time is charged to
``communication`` (or ``straggler_wait`` where a cross-rank analysis says the
collective was waiting for a late rank). ``active`` is the union of all device work,
collectives included, which is what nvidia-smi counts.

Idle under a one-time start-up cost (``analysis.startup``: context creation, module
loading, first allocations, stream creation, compilation) is set apart first: it is in
no cause and no step. Each other idle interval is split by what was going on at that
moment, the first matching layer winning:

1. ``straggler_wait`` then ``communication``: a collective kernel is running.
2. The launch in flight: the op that ends the gap was launched during the gap (or just
   before it, when the gap is no longer than a launch takes), and launching costs the
   launch call itself plus the queue to the device, at most :data:`MAX_LAUNCH_LATENCY_NS`
   after the call returns (``launch_overhead``; ``memcpy`` for a host-to-device copy being
   staged). Whatever the op waits longer for (an event, a blocking copy, another stream)
   is not its launch: the host layers below decide.
3. ``data_loading``: a host thread is inside a DataLoader ``__next__`` (or a range named
   like data loading, or a file read traced by Nsight's OS runtime trace).
4. ``host_sync``: a feeding thread is blocked in a synchronize call, a blocking copy (a
   synchronous copy call, a copy to pageable memory, or any copy call that lasts longer
   than enqueuing one can; a host-to-device one when it lasts longer than its transfer,
   its bytes staged at :data:`MIN_STAGING_BYTES_PER_NS` and the queue), or
   ``aten::item``/``_local_scalar_dense``.
5. ``memcpy``: a feeding thread is inside a host-to-device copy call (pageable memory
   makes it a staged, blocking copy).
6. ``communication``: a feeding thread is inside a host-side collective call.
7. ``cpu_compute``: a feeding thread is inside an operator that launches nothing, a
   runtime call that launches nothing, or the self time of an operator that spends far
   more host time than its launches cost (``analysis.hostwork``).
8. ``launch_overhead``: a feeding thread is inside a launch call or an operator that
   issues launches and costs no more than dispatching them. Phase annotations
   (``ProfilerStep#N``, ``Optimizer.zero_grad#…``, a ``Torch-Compiled Region``, ``## … ##``
   ranges) never count as operators, even where an old trace files them as ``Operator``.
9. ``cpu_compute``: a feeding thread is inside a Python function (``with_stack=True``
   traces) with no operator running.
10. ``unattributed``: none of these.

*Feeding threads* are the host threads whose runtime calls launched work on the
device, and those that hand work to them (``Timeline.handoffs``). The causes and the
start-up idle tile the idle time exactly; :meth:`DeviceIdle.self_check` proves it.
"""

from __future__ import annotations

import msgspec
import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.hostwork import DISPATCH_BUDGET_NS, calls_inside, innermost, self_time
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import StepWindow
from gpuidle.model import CAUSES, HTOD_KINDS, I64, Cause, CopyKind, DeviceOpKind, HostKind, Timeline
from gpuidle.model.arrays import distinct, gathered

CAUSE_INDEX = {c: i for i, c in enumerate(CAUSES)}
MAX_LAUNCH_LATENCY_NS = 50_000
"""The queue: longest a launched op may take to start once its launch call has returned, and the longest gap
still charged to a launch issued before the gap began (launches take 5-20 µs)."""
MIN_STAGING_BYTES_PER_NS = 1
"""1 GB/s: the slowest a host stages pageable memory into pinned buffers (memcpy runs at several GB/s). A
host-to-device copy call longer than its transfer, its bytes at this rate and the queue waited for something
else (the stream's earlier work, an event) and is a wait, not copying."""
STARTUP_LABEL = len(CAUSES)
ZERO_GRAD_CAUSES = (Cause.LAUNCH_OVERHEAD, Cause.CPU_COMPUTE, Cause.UNATTRIBUTED)
"""The idle under ``Optimizer.zero_grad`` that ``set_to_none`` removes: the fills' launches, the host's loop over the
parameters between them (operators' own time, and the Python between them, unattributed without stacks)."""
"""The label of idle segments under start-up costs: past the causes, counted apart."""


class DeviceIdle(msgspec.Struct, frozen=True):
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
    step_startup: I64
    """Idle ns per step under start-up costs (in no cause)."""
    step_zero_grad: I64
    """Idle ns per step and cause (:data:`ZERO_GRAD_CAUSES`) under ``Optimizer.zero_grad`` ranges: shape
    ``(steps, len(CAUSES))``."""
    python: tuple[I64, I64, I64]
    """Idle segments charged to Python functions: ``(start, end, host row of the innermost function)``."""
    sync_sources: tuple[I64, I64, I64]
    """``host_sync`` idle segments: ``(start, end, host row of the innermost frame of the user's program around
    the waiting call)``, the row -1 where the trace holds no such frame (recorded without ``with_stack``)."""

    @property
    def window_ns(self) -> int:
        return self.window[1] - self.window[0]

    @property
    def busy_ns(self) -> int:
        return iv.total(self.busy)

    @property
    def idle_ns(self) -> int:
        """Idle in some cause: the window less busy time and start-up idle."""
        return self.window_ns - self.busy_ns - self.startup_ns

    @property
    def startup_ns(self) -> int:
        return int(self.step_startup.sum())

    def idle_by_cause(self) -> dict[Cause, int]:
        sums = self.step_idle.sum(axis=0)
        return {c: int(sums[i]) for i, c in enumerate(CAUSES)}

    def self_check(self) -> None:
        """Busy + every cause = window, overall and per step; causes tile idle exactly."""
        seg_total = int((self.segments[1] - self.segments[0]).sum())
        causes = int(self.step_idle.sum())
        if not (seg_total == causes + self.startup_ns and causes == self.idle_ns
                and self.busy_ns + causes + self.startup_ns == self.window_ns):
            raise AssertionError(
                f"device {self.device}: busy {self.busy_ns} + causes {causes} + start-up {self.startup_ns}"
                f" != window {self.window_ns}"
            )
        if int(self.step_busy.sum()) != self.busy_ns:
            raise AssertionError(f"device {self.device}: per-step busy does not add up")


def attribute_idle(
    tl: Timeline,
    names: NameClasses,
    window: StepWindow,
    launchers: I64,
    straggler: dict[int, iv.Intervals] | None = None,
    startup: iv.Intervals = iv.EMPTY,
    windows: dict[int, StepWindow] | None = None,
) -> list[DeviceIdle]:
    """Attribute the idle time of every device of ``tl`` (see the module docstring); ``startup``: host ranges
    of one-time costs; ``windows``: a device's own steps where the devices run theirs apart."""
    return [
        _device_idle(tl, names, (windows or {}).get(d, window), launchers, d, (straggler or {}).get(d, iv.EMPTY),
                     startup)
        for d in tl.devices
    ]


def feeding_threads(tl: Timeline, launchers: I64, device: int) -> np.ndarray:
    """Host threads that launched work on ``device``, and the threads that hand work to those
    (``tl.handoffs``: a Python thread dispatching to XLA's execute threads); all threads when
    nothing is linked."""
    rows = launchers[(tl.device_ops.device == device) & (launchers >= 0)]
    if rows.size == 0:
        return iv.sorted_unique(tl.host.thread.astype(np.int64))
    launching = {int(t) for t in distinct(tl.host.thread[rows])}
    dispatching = {src for src, dst in tl.handoffs if dst in launching}
    return np.array(sorted(launching | dispatching), dtype=np.int64)


def _device_idle(
    tl: Timeline, names: NameClasses, window: StepWindow, launchers: I64, device: int,
    straggler: iv.Intervals, startup: iv.Intervals,
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
    (region, memcpy, synchronous_memcpy, sync_name, item, loading_name, collective_name, launch_name,
     zero_grad_name) = gathered(host.name, names.region, names.memcpy_call, names.synchronous_memcpy, names.sync_call,
                                names.item_op, names.data_loading | names.file_read, names.collective_host,
                                names.launch_call | names.memcpy_call, names.zero_grad)
    is_op = (host.kind == HostKind.OP) & ~region
    is_rt = host.kind == HostKind.RUNTIME
    is_py = host.kind == HostKind.PYTHON

    copy_of_call = _copy_kind_of_calls(tl, launchers)
    htod_call = is_rt & memcpy & np.isin(copy_of_call, HTOD_KINDS)
    # a host-to-device call far longer than its transfer and staging waited for something else (the stream's
    # earlier work, an event): a wait like any blocking copy, not copying
    htod_wait = htod_call & (host.end - host.start > MAX_LAUNCH_LATENCY_NS + _copy_bound_of_calls(tl, launchers))
    htod_call &= ~htod_wait
    blocking_copy = is_rt & memcpy & ~htod_call & (
        synchronous_memcpy | (copy_of_call == CopyKind.DTOH_PAGEABLE)
        | (host.end - host.start > MAX_LAUNCH_LATENCY_NS)
    )
    sync = feeding & ((is_rt & sync_name) | (is_op & item) | blocking_copy)
    loading = loading_name & ~is_rt
    coll_host = feeding & ~is_rt & ~is_py & collective_name
    launch_call = feeding & is_rt & ~sync & ~htod_call & launch_name
    issued, runtime = calls_inside(tl, launchers, is_op & feeding)
    own_work = host.end - host.start - runtime
    launching = (issued > 0) & (own_work <= issued * DISPATCH_BUDGET_NS)
    heavy = (issued > 0) & ~launching
    plain_op = feeding & is_op & (issued == 0) & ~item & ~collective_name
    other_rt = feeding & is_rt & ~sync & ~htod_call & ~launch_call

    inflight_launch, inflight_copy = _launches_in_flight(tl, launchers, compute, idle, hi, sync)

    def rows(mask: np.ndarray) -> iv.Intervals:
        return host.start[mask], host.end[mask]

    layers: list[tuple[Cause | None, iv.Intervals]] = [
        (Cause.STRAGGLER_WAIT, straggler),
        (Cause.COMMUNICATION, comm),
        (None, startup),
        (Cause.MEMCPY, inflight_copy),
        (Cause.LAUNCH_OVERHEAD, inflight_launch),
        (Cause.DATA_LOADING, rows(loading)),
        (Cause.HOST_SYNC, rows(sync)),
        (Cause.MEMCPY, rows(feeding & htod_call)),
        (Cause.COMMUNICATION, rows(coll_host)),
        (Cause.CPU_COMPUTE, iv.union(*_cat(rows(plain_op | other_rt),
                                           self_time(host.start, host.end, host.thread, np.flatnonzero(heavy),
                                                     np.flatnonzero(feeding & (is_op | is_rt)))))),
        (Cause.LAUNCH_OVERHEAD, rows(launching | launch_call)),
        (Cause.CPU_COMPUTE, rows(feeding & is_py)),
    ]
    python_layer = len(layers) - 1
    layer_cause = np.array([STARTUP_LABEL if c is None else CAUSE_INDEX[c] for c, _ in layers]
                           + [CAUSE_INDEX[Cause.UNATTRIBUTED]], dtype=np.int16)
    bounds = window.bounds
    seg_s, seg_e, label = iv.label_segments(idle, [layer for _, layer in layers], extra_points=bounds)
    cause = layer_cause[label]
    n_steps = bounds.size - 1
    k = len(CAUSES) + 1
    step_of = np.clip(np.searchsorted(bounds, seg_s, side="right") - 1, 0, n_steps - 1)
    step_all = np.bincount(step_of * k + cause, weights=(seg_e - seg_s), minlength=n_steps * k).reshape(n_steps, k)
    step_idle, step_startup = step_all[:, :STARTUP_LABEL], step_all[:, STARTUP_LABEL]
    zero_grad = iv.union(*rows(feeding & zero_grad_name))
    host_work = np.isin(cause, [CAUSE_INDEX[c] for c in ZERO_GRAD_CAUSES])
    under_zero_grad = host_work & iv.covered(zero_grad, seg_s)
    step_zero_grad = np.bincount(step_of[under_zero_grad] * k + cause[under_zero_grad],
                                 weights=(seg_e - seg_s)[under_zero_grad], minlength=n_steps * k).reshape(n_steps, k)
    step_zero_grad = step_zero_grad[:, :STARTUP_LABEL]
    py_seg = label == python_layer
    python = (seg_s[py_seg], seg_e[py_seg], innermost(host.start, host.end, np.flatnonzero(feeding & is_py),
                                                        seg_s[py_seg]))
    sync_seg = cause == CAUSE_INDEX[Cause.HOST_SYNC]
    user_frames = np.flatnonzero(feeding & is_py & ~names.library_python[host.name])
    sync_sources = (seg_s[sync_seg], seg_e[sync_seg], innermost(host.start, host.end, user_frames, seg_s[sync_seg]))
    b_s, b_e, _ = iv.label_segments(busy, [], extra_points=bounds)
    b_step = np.clip(np.searchsorted(bounds, b_s, side="right") - 1, 0, n_steps - 1)
    step_busy = np.bincount(b_step, weights=(b_e - b_s), minlength=n_steps)
    result = DeviceIdle(
        device=device, window=(lo, hi), busy=busy, active=active, comm=comm,
        segments=(seg_s, seg_e, cause),
        step_busy=np.rint(step_busy).astype(np.int64),
        step_idle=np.rint(step_idle).astype(np.int64),
        step_startup=np.rint(step_startup).astype(np.int64),
        step_zero_grad=np.rint(step_zero_grad).astype(np.int64),
        python=python,
        sync_sources=sync_sources,
    )
    result.self_check()
    return result


def _copy_bound_of_calls(tl: Timeline, launchers: I64) -> I64:
    """For each host row, the longest its copy can take to stage and transfer: the device transfer plus its bytes
    at :data:`MIN_STAGING_BYTES_PER_NS` (0 if it launched none)."""
    out = np.zeros(len(tl.host), dtype=np.int64)
    linked = launchers >= 0
    ops = tl.device_ops
    out[launchers[linked]] = ((ops.end - ops.start) + np.maximum(ops.nbytes, 0) // MIN_STAGING_BYTES_PER_NS)[linked]
    return out


def _copy_kind_of_calls(tl: Timeline, launchers: I64) -> np.ndarray:
    """For each host row, the kind of copy it launched (``CopyKind.NONE`` if none)."""
    kinds = np.zeros(len(tl.host), dtype=np.int8)
    linked = launchers >= 0
    kinds[launchers[linked]] = tl.device_ops.copy_kind[linked]
    return kinds


def _launches_in_flight(
    tl: Timeline, launchers: I64, compute: np.ndarray, idle: iv.Intervals, window_end: int, blocking: np.ndarray,
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
    # a blocking call (a synchronous copy) enqueues its work at once and then waits: only its start launches
    returned = np.where(blocking[launchers[op]], issued, tl.host.end[launchers[op]])
    # Issued during the gap, or just before it with the gap no longer than a launch takes. An op
    # queued long before waited on a dependency, not on its launch: the host layers decide.
    ok = ((issued >= gap_start) | (gap_end - issued <= MAX_LAUNCH_LATENCY_NS)) & (issued < gap_end)
    launched = np.maximum(issued, gap_start)
    # Launching costs the call and the queue behind it; an op that starts later waited on something else.
    reached = np.minimum(gap_end, returned + MAX_LAUNCH_LATENCY_NS)
    op, launched, reached = op[ok], launched[ok], reached[ok]
    keep = reached > launched
    op, launched, reached = op[keep], launched[keep], reached[keep]
    is_copy = np.isin(ops.copy_kind[op], HTOD_KINDS)
    return (launched[~is_copy], reached[~is_copy]), (launched[is_copy], reached[is_copy])


def _cat(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
    return np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1]))
