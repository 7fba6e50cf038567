"""The in-process step tracker: where every step of every rank spends its time.

>>> from gpuidle.torch import StepTracker
>>> tracker = StepTracker(out_dir="gpuidle-run", model=ddp_model)   # doctest: +SKIP
>>> for batch in tracker.loader(train_loader):                     # doctest: +SKIP
...     with tracker.phase("h2d"):
...         batch = batch.to(device, non_blocking=True)
...     with tracker.phase("forward"):
...         loss = model(batch)
...     with tracker.phase("backward"):
...         loss.backward()
...     with tracker.phase("optimizer"):
...         opt.step(); opt.zero_grad()
...     tracker.step()
>>> tracker.close()                                                # doctest: +SKIP

Timing never stalls the loop. With CUDA, each phase is bracketed by two events recorded on
the current stream. A step's events are read once they have completed, checked with
``query()`` at later steps; only a step more than ``resolve_lag`` steps old is waited for,
and by then the device has that many steps of work queued, so the wait costs nothing.
Without CUDA the host clock times the phases, and the report says so. The wait for data
is timed on the host around ``next()``; DDP communication by a wrapper around the comm
hook that marks each bucket ready and its future done (:meth:`StepTracker.watch_ddp`).

Every ``every`` steps the ranks exchange their finished steps with one small
``all_gather`` (on a gloo group of its own, so NCCL streams are untouched). Each rank then knows how
long it waited for the slowest one and appends its steps to ``rank-<r>.jsonl``; rank 0
keeps the job view, logs a line every ``log_every`` steps and, at :meth:`StepTracker.close`,
writes the job summary (the analysis report, ``source.format = "tracker"``) that
``gpuidle analyze <out_dir>`` reads, like the logs themselves.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from gpuidle.analysis.ranks import PERSISTENT_SCORE
from gpuidle.analysis.series import HOST_TIMED_NOTE, rank_stats, straggler_split
from gpuidle.errors import GpuidleError
from gpuidle.model import (
    TRACKER_FORMAT,
    TRACKER_LOG,
    TRACKER_OTHER,
    TRACKER_SUMMARY,
    StepSeries,
    TrackerEnd,
    TrackerHeader,
    TrackerStep,
)

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport

T = TypeVar("T")

DEFAULT_PHASES = ("h2d", "forward", "backward", "optimizer")
COMPUTE_PHASES = ("forward", "backward", "optimizer")
COPY_PHASE = "h2d"
Gather = Callable[[np.ndarray], np.ndarray]
"""``rows [n, F]`` of this rank in, ``[world, n, F]`` of every rank out; called by all ranks together."""


# ----------------------------------------------------------------------------------
# Clocks: the host's, and markers in the device's work queue
# ----------------------------------------------------------------------------------


class Marker(Protocol):
    """A point in the device's work queue; complete once the device has reached it."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class DeviceClock(Protocol):
    """Places markers on the current stream and measures between them once both completed.

    CUDA events in production (:class:`CudaClock`); tests pass a fake whose markers complete later.
    """

    def mark(self) -> Marker: ...

    def elapsed_ns(self, start: Marker, end: Marker) -> int: ...

    def release(self, markers: Iterable[Marker]) -> None: ...


class _Instant:
    """A host timestamp dressed as a marker: complete from the start."""

    __slots__ = ("ns",)

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class HostClock:
    """Markers that are host timestamps. Times DDP buckets when there is no device clock."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock

    def mark(self) -> _Instant:
        return _Instant(self._clock())

    def elapsed_ns(self, start: Marker, end: Marker) -> int:
        return cast(_Instant, end).ns - cast(_Instant, start).ns

    def release(self, markers: Iterable[Marker]) -> None:
        return None


class CudaClock:
    """CUDA events with timing, recorded on the current stream; reused from a pool once read."""

    def __init__(self) -> None:
        self._pool: list[torch.cuda.Event] = []

    def mark(self) -> torch.cuda.Event:
        ev = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ev.record()
        return ev

    def elapsed_ns(self, start: Marker, end: Marker) -> int:
        ms: float = cast(torch.cuda.Event, start).elapsed_time(cast(torch.cuda.Event, end))
        return round(ms * 1e6)

    def release(self, markers: Iterable[Marker]) -> None:
        self._pool.extend(m for m in markers if isinstance(m, torch.cuda.Event))


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (tuples, lists and dicts searched)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_size(item)
        if n:
            return n
    return 0


# ----------------------------------------------------------------------------------
# The tracker
# ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Open:
    """The step in progress: host time per phase, device markers, buckets, data."""

    host: dict[str, int] = field(default_factory=dict)
    marks: list[tuple[str, Marker, Marker]] = field(default_factory=list)
    comm: list[list[Any]] = field(default_factory=list)
    """``[ready marker, done marker or None, bytes]`` per bucket; the hook's callback fills in done."""
    data: int = 0
    samples: int = 0
    batches: int = 0

    def empty(self) -> bool:
        return not (self.host or self.marks or self.comm or self.batches)


@dataclass(slots=True)
class _Pending:
    """A finished step whose device markers may not have completed yet."""

    step: int
    start: int
    dur: int
    work: _Open
    last: Marker | None
    profiled: bool

    def ready(self) -> bool:
        if self.last is not None and not self.last.query():
            return False
        return all(c[1] is not None and c[1].query() for c in self.work.comm)


class _Phase:
    """``with tracker.phase(name):`` — a plain class: cheaper than a generator context manager."""

    __slots__ = ("_m0", "_name", "_t0", "_tracker")

    def __init__(self, tracker: StepTracker, name: str) -> None:
        self._tracker = tracker
        self._name = name

    def __enter__(self) -> None:
        t = self._tracker
        if t._step_start is None:
            t._step_start = t._clock()
        if t._nvtx:
            _nvtx_push(self._name)
        self._m0 = t._dev.mark() if t._dev is not None else None
        self._t0 = t._clock()

    def __exit__(self, *exc: object) -> None:
        t = self._tracker
        t1 = t._clock()
        host = t._open.host
        host[self._name] = host.get(self._name, 0) + t1 - self._t0
        if self._m0 is not None and t._dev is not None:
            t._open.marks.append((self._name, self._m0, t._dev.mark()))
        if t._nvtx:
            _nvtx_pop()


class StepTracker:
    """Times the phases of every training step on this rank; aggregates across ranks.

    :param out_dir: folder for ``rank-<r>.jsonl`` and, from rank 0, the job summary.
    :param model: a ``DistributedDataParallel`` model whose communication to time (see :meth:`watch_ddp`).
    :param every: steps between two exchanges of statistics across ranks.
    :param log_every: rank 0 logs a line every this many steps (None: never).
    :param phases: phase names with a column of their own; other names add to ``other``.
    :param compute_phases: phases whose time is device work (busy time).
    :param copy_phase: the phase that copies the batch to the device (its host time is ``memcpy``).
    :param group: the exchange's group: ``"auto"`` or ``"gloo"`` (a gloo group of its own, made here),
        ``"default"`` (the default group) or a process group.
    :param nvtx: also open ``torch.cuda.nvtx`` ranges per step and phase, for Nsight Systems.
    :param samples: counts the samples of a batch (default: :func:`batch_size`).
    :param resolve_lag: a step's device markers are waited for when it is this many steps old.
    :param device_clock: ``"auto"`` (CUDA events when CUDA is available), None (host timing), or a clock.
    :param clock: host clock in ns; with ``gather``, ``rank`` and ``world_size``, for tests.
    :param log: where rank 0's lines go (default: stderr).
    :param summary_steps: rank 0 keeps every rank's last this many steps for the job summary; the
        rank logs keep them all.
    :param label: the name of this run in the ledger (for ``gpuidle compare``).
    :param ledger: rank 0 records the job summary in the run ledger: True (the default ledger),
        a path, or False (no record).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] = "gpuidle-run",
        *,
        model: torch.nn.Module | None = None,
        every: int = 50,
        log_every: int | None = 500,
        phases: Sequence[str] = DEFAULT_PHASES,
        compute_phases: Sequence[str] = COMPUTE_PHASES,
        copy_phase: str = COPY_PHASE,
        group: str | dist.ProcessGroup = "auto",
        nvtx: bool = False,
        samples: Callable[[Any], int] | None = None,
        resolve_lag: int = 2,
        device_clock: DeviceClock | str | None = "auto",
        clock: Callable[[], int] = time.perf_counter_ns,
        gather: Gather | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        log: Callable[[str], None] | None = None,
        summary_steps: int = 5000,
        label: str | None = None,
        ledger: str | os.PathLike[str] | bool = True,
    ) -> None:
        if every < 1 or resolve_lag < 0 or (log_every is not None and log_every < 1):
            raise GpuidleError(f"every={every}, log_every={log_every}, resolve_lag={resolve_lag}",
                               "every and log_every must be at least 1, resolve_lag at least 0")
        self._label = label
        self._ledger = ledger
        self._clock = clock
        self._t0 = clock()
        self._every = every
        self._log_every = log_every
        self._phases = list(dict.fromkeys(p for p in phases if p != TRACKER_OTHER))
        self._compute = list(compute_phases)
        self._copy = copy_phase
        self._samples = samples or batch_size
        self._log = log or _stderr
        notes: list[str] = []
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if distributed else 1)

        if device_clock == "auto":
            device_clock = CudaClock() if torch.cuda.is_available() else None
        elif isinstance(device_clock, str):
            raise GpuidleError(f"device_clock={device_clock!r}", "use 'auto', None or a DeviceClock")
        self._dev: DeviceClock | None = device_clock
        self._comm_clock: DeviceClock = device_clock if device_clock is not None else HostClock(clock)
        self._lag = resolve_lag if device_clock is not None else 0
        self.timing = "device" if device_clock is not None else "host"
        if device_clock is None:
            notes.append(HOST_TIMED_NOTE)
        self._nvtx = nvtx and torch.cuda.is_available()
        if nvtx and not self._nvtx:
            notes.append("nvtx ranges off: CUDA is not available")
        cuda = isinstance(device_clock, CudaClock)
        self._device = torch.cuda.current_device() if cuda else 0
        device_name = torch.cuda.get_device_name(self._device) if cuda else None

        if gather is not None:
            self._gather = gather
        elif self.world_size > 1:
            self._gather = _dist_gather(_exchange_group(group), self.world_size)
        else:
            self._gather = _alone

        self._cols = ["step", "start", "dur", "data", *(f"host:{p}" for p in [*self._phases, TRACKER_OTHER]),
                      *(f"device:{p}" for p in [*self._phases, TRACKER_OTHER]),
                      "comm", "exposed", "buckets", "bytes", "samples", "batches", "profiled"]
        self._col = {c: i for i, c in enumerate(self._cols)}
        names = [*self._phases, TRACKER_OTHER]
        self._host_col = {p: self._col[f"host:{p}"] for p in names}
        self._device_col = {p: self._col[f"device:{p}"] for p in names}
        self._tail = [self._col[c] for c in ("comm", "exposed", "buckets", "bytes", "samples", "batches", "profiled")]
        self._step = 0
        self._step_start: int | None = None
        self._open = _Open()
        self._inflight: dict[str, tuple[int, Marker | None]] = {}
        self._pending: deque[_Pending] = deque()
        self._rows: list[list[float]] = []
        self._sent = 0
        self._job: deque[np.ndarray] = deque()
        self._job_steps = 0
        self._job_dropped = 0
        self._summary_steps = max(1, summary_steps)
        self._next_log = log_every or 0
        self._forced = 0
        self._comm_hook: str | None = None
        self._sink = _BucketSink(self)
        self._prof: torch.profiler.profile | None = None
        self._prof_steps = range(0)
        self._closed = False
        self.report: AnalysisReport | None = None
        self._notes = notes

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            _remove_stale(self.out_dir, self.world_size)
        self.path = self.out_dir / TRACKER_LOG.format(rank=self.rank)
        self._file = open(self.path, "wb")  # noqa: SIM115 - open until close()
        self._enc = msgspec.json.Encoder()
        self._header = TrackerHeader(
            format=TRACKER_FORMAT, rank=self.rank, world_size=self.world_size, timing=self.timing,
            device=self._device, device_name=device_name, host=socket.gethostname(), pid=os.getpid(),
            t0=time.time(), phases=[*self._phases, TRACKER_OTHER], compute_phases=self._compute,
            copy_phase=self._copy, every=every, notes=notes,
        )
        self._write([self._header])
        if self.rank == 0 and notes:
            for note in notes:
                self._log(note)
        if self.rank == 0:
            # numpy loads parts of itself on first use: pay that here, not in the middle of a step
            self._log_line(np.zeros((self.world_size, 1, len(self._cols) + 1)))
        if model is not None:
            self.watch_ddp(model)

    # -- the loop ------------------------------------------------------------------

    def loader(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield the batches of ``iterable``, timing the wait for each one (``iter()`` included).

        A new pass over a loader (a new epoch) starts a new step when it begins: what ran
        between the last step and the pass (evaluation, checkpoints) is no step's time.
        """
        clock = self._clock
        t0 = clock()
        it = iter(iterable)
        first = True
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = clock()
            work = self._open
            if self._step_start is None or (first and work.empty()):
                self._step_start = t0
            first = False
            work.data += t1 - t0
            work.batches += 1
            work.samples += self._samples(batch)
            yield batch
            t0 = clock()

    def phase(self, name: str) -> _Phase:
        """``with tracker.phase("forward"): ...``: time one phase of the step (may repeat within a step)."""
        return _Phase(self, name)

    def begin(self, name: str) -> None:
        """Start phase ``name`` (for callbacks that cannot use ``with``); :meth:`end` closes it."""
        if self._step_start is None:
            self._step_start = self._clock()
        if self._nvtx:
            _nvtx_push(name)
        mark = self._dev.mark() if self._dev is not None else None
        self._inflight[name] = (self._clock(), mark)

    def end(self, name: str) -> None:
        t1 = self._clock()
        started = self._inflight.pop(name, None)
        if started is None:
            return
        t0, m0 = started
        host = self._open.host
        host[name] = host.get(name, 0) + t1 - t0
        if m0 is not None and self._dev is not None:
            self._open.marks.append((name, m0, self._dev.mark()))
        if self._nvtx:
            _nvtx_pop()

    def add_data_wait(self, ns: int, samples: int = 0, batches: int = 1) -> None:
        """Count ``ns`` of waiting for data in this step, measured by the caller on the same clock."""
        if self._step_start is None:
            self._step_start = self._clock() - ns
        self._open.data += ns
        self._open.samples += samples
        self._open.batches += batches

    def add_time(self, name: str, ns: int) -> None:
        """Count ``ns`` of host time to phase ``name`` in this step (no device markers)."""
        host = self._open.host
        host[name] = host.get(name, 0) + ns

    def restart(self) -> None:
        """Start the current step now: what ran since the last step (evaluation, a checkpoint) is no step's time."""
        if self._open.empty():
            self._step_start = self._clock()

    @property
    def clock(self) -> Callable[[], int]:
        """The host clock of the tracker (ns), for callers that measure waits themselves."""
        return self._clock

    def step(self) -> None:
        """End the step: queue its markers, read those that completed, exchange every ``every`` steps."""
        now = self._clock()
        for name in list(self._inflight):
            self.end(name)
        start = self._step_start if self._step_start is not None else now
        work = self._open
        last = work.marks[-1][2] if work.marks else None
        profiled = self._step in self._prof_steps
        self._pending.append(_Pending(self._step, start - self._t0, now - start, work, last, profiled))
        self._open = _Open()
        self._step += 1
        self._step_start = now
        self._drain(self._step - self._lag)
        if self._step % self._every == 0:
            self._exchange(final=False)
        if self._prof is not None:
            self._prof.step()
            if self._step >= self._prof_steps.stop:
                self._prof.stop()
                self._prof = None
        if self._nvtx:
            torch.cuda.nvtx.mark(f"gpuidle step {self._step}")  # type: ignore[no-untyped-call]

    @property
    def steps_done(self) -> int:
        return self._step

    @property
    def forced_waits(self) -> int:
        """Steps whose markers had to be waited for (the device was more than ``resolve_lag`` steps behind)."""
        return self._forced

    # -- communication -------------------------------------------------------------

    def watch_ddp(self, model: torch.nn.Module, state: object = None,
                  hook: Callable[..., torch.futures.Future[torch.Tensor]] | None = None) -> None:
        """Time DDP's communication: register ``hook`` (default: the all-reduce DDP runs anyway) wrapped.

        DDP takes one comm hook, before the first backward; if you use your own, pass it here
        with its ``state`` instead of registering it yourself.
        """
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise GpuidleError(f"watch_ddp needs a DistributedDataParallel model, not {type(model).__name__}")
        if getattr(model, "_comm_hooks", None):
            raise GpuidleError("this DDP model already has a comm hook",
                               "pass it to tracker.watch_ddp(model, state, hook) instead of registering it")
        inner = hook if hook is not None else default_hooks.allreduce_hook
        model.register_comm_hook(state, timed_hook(inner, self._sink.ready, self._sink.done))
        self._comm_hook = getattr(inner, "__name__", type(inner).__name__)

    def _bucket_ready(self, buffer: torch.Tensor) -> list[Any]:
        entry = [self._comm_clock.mark(), None, buffer.numel() * buffer.element_size()]
        self._open.comm.append(entry)
        return entry

    def _bucket_done(self, entry: list[Any]) -> None:
        entry[1] = self._comm_clock.mark()

    def _let_go(self) -> None:
        """After close, DDP's hook passes buckets straight through and no longer holds the tracker."""
        self._sink.tracker = None

    # -- a profiled window -----------------------------------------------------------

    def profile(self, steps: range, out_dir: str | os.PathLike[str] | None = None, *,
                record_shapes: bool = False, with_stack: bool = False) -> Path:
        """Record a ``torch.profiler`` trace of ``steps`` (after one warm-up step) on this rank.

        Profile a few steps first: the trace (``<out_dir>/profile`` by default, one file per
        rank) splits what step timing leaves unattributed; ``gpuidle analyze`` reads it.
        Those steps are flagged in the log and left out of the step statistics.
        """
        if not isinstance(steps, range) or steps.step != 1 or len(steps) == 0:
            raise GpuidleError(f"profile(steps={steps!r})", "give a range of consecutive steps, e.g. range(100, 105)")
        if steps.start <= self._step:
            raise GpuidleError(f"cannot profile from step {steps.start}: step {self._step} is already running",
                               "choose steps after the current one")
        if self._prof is not None:
            raise GpuidleError("a profiled window is already set up", "one window at a time")
        where = Path(out_dir) if out_dir is not None else self.out_dir / "profile"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=len(steps), repeat=1, skip_first=steps.start - 1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(where), worker_name=f"rank{self.rank}",
                                                                    use_gzip=True),
            record_shapes=record_shapes, with_stack=with_stack,
        )
        prof.step_num = self._step  # ProfilerStep#N then carries the tracker's step numbers
        prof.start()
        self._prof = prof
        self._prof_steps = range(steps.start - 1, steps.stop)
        return where

    # -- resolution and exchange -----------------------------------------------------

    def _drain(self, cut: int) -> None:
        """Read finished steps in order: those below ``cut`` are waited for, later ones only if complete."""
        pending = self._pending
        while pending:
            p = pending[0]
            force = p.step < cut
            if not force and not p.ready():
                break
            pending.popleft()
            self._resolve(p, force)

    def _resolve(self, p: _Pending, force: bool) -> None:
        work = p.work
        if force and not p.ready():
            self._forced += 1
            if p.last is not None:
                p.last.synchronize()
            for c in work.comm:
                if c[1] is not None:
                    c[1].synchronize()
        row = [0.0] * len(self._cols)
        row[0], row[1], row[2], row[3] = p.step, p.start, p.dur, work.data
        cols, other = self._host_col, self._host_col[TRACKER_OTHER]
        for name, ns in work.host.items():
            row[cols.get(name, other)] += ns
        if self._dev is not None and work.marks:
            cols, other = self._device_col, self._device_col[TRACKER_OTHER]
            for name, a, b in work.marks:
                row[cols.get(name, other)] += self._dev.elapsed_ns(a, b)
            self._dev.release([m for _, a, b in work.marks for m in (a, b)])
        comm = exposed = nbytes = 0
        if work.comm:
            comm, exposed = self._comm_times(work.comm)
            nbytes = sum(c[2] for c in work.comm)
            self._comm_clock.release([m for c in work.comm for m in c[:2] if m is not None])
        tail = self._tail
        for i, v in zip(tail, (comm, exposed, len(work.comm), nbytes, work.samples, work.batches, p.profiled),
                        strict=True):
            row[i] = v
        self._rows.append(row)

    def _comm_times(self, buckets: list[list[Any]]) -> tuple[int, int]:
        """Union of the buckets' [ready, done] spans, and the part after the last bucket was ready."""
        done = [(c[0], c[1]) for c in buckets if c[1] is not None]
        if not done:
            return 0, 0
        clock, ref = self._comm_clock, done[0][0]
        spans = sorted((clock.elapsed_ns(ref, a), clock.elapsed_ns(ref, b)) for a, b in done)
        union, reach = 0, spans[0][0]
        for a, b in spans:
            a = max(a, reach)
            if b > a:
                union += b - a
                reach = b
        exposed = max(0, max(b for _, b in spans) - max(a for a, _ in spans))
        return union, exposed

    def _exchange(self, final: bool) -> None:
        """Send the finished steps to every rank, split out the wait for stragglers, write them."""
        count = len(self._rows) if final else (self._step - self._lag) - self._sent
        if count <= 0 and not final:
            return
        rows = np.array(self._rows[:count], dtype=np.float64).reshape(count, len(self._cols))
        del self._rows[:count]
        if final and self.world_size > 1:
            most = int(np.nanmax(self._gather(np.array([[float(count)]]))))
            rows = np.vstack([rows, np.full((most - count, len(self._cols)), np.nan)])
        everyone = self._gather(rows)
        full = ~np.isnan(everyone[:, :, 0]).any(axis=0)
        col = self._col
        wait = np.zeros(everyone.shape[:2], dtype=np.int64)
        if full.any():
            wait[:, full] = straggler_split(everyone[:, full, col["exposed"]].astype(np.int64))
        mine = everyone[self.rank]
        keep = ~np.isnan(mine[:, 0])
        self._write([self._line(r, int(w)) for r, w in zip(mine[keep], wait[self.rank][keep], strict=True)])
        self._sent += count
        if self.rank == 0:
            block = np.concatenate([everyone, wait[:, :, None].astype(np.float64)], axis=2)
            self._keep(block)
            if self._log_every and self._step >= self._next_log and not final:
                self._log(self._log_line(block))
                while self._next_log <= self._step:
                    self._next_log += self._log_every

    def _keep(self, block: np.ndarray) -> None:
        """Rank 0's memory of the job: the last ``summary_steps`` steps of every rank."""
        self._job.append(block)
        self._job_steps += block.shape[1]
        while self._job_steps - self._job[0].shape[1] >= self._summary_steps:
            dropped = self._job.popleft()
            self._job_steps -= dropped.shape[1]
            self._job_dropped += dropped.shape[1]

    def _line(self, r: np.ndarray, wait: int) -> TrackerStep:
        comm, exposed, buckets, nbytes, samples, batches, profiled = (int(r[i]) for i in self._tail)
        return TrackerStep(
            step=int(r[0]), start_ns=int(r[1]), dur_ns=int(r[2]), data_ns=int(r[3]),
            phases={p: int(r[i]) for p, i in self._host_col.items()},
            device_phases={p: int(r[i]) for p, i in self._device_col.items()} if self._dev is not None else {},
            comm_ns=comm, comm_exposed_ns=exposed, straggler_ns=wait, buckets=buckets, bucket_bytes=nbytes,
            samples=samples, batches=batches, profiled=bool(profiled),
        )

    def _series(self, rank: int, m: np.ndarray, notes: list[str]) -> StepSeries:
        """One rank's rows (``[n, F + 1]``, the wait last) as a :class:`StepSeries`."""
        m = m[~np.isnan(m[:, 0])]
        col = self._col

        def c(name: str) -> np.ndarray:
            return m[:, col[name]].astype(np.int64)

        names = [*self._phases, TRACKER_OTHER]
        return StepSeries(
            rank=rank, world_size=self.world_size, path=str(self.out_dir / TRACKER_LOG.format(rank=rank)),
            timing=self.timing, device=self._device, device_name=self._header.device_name,
            compute_phases=self._compute, copy_phase=self._copy, step=c("step"), start=c("start"), dur=c("dur"),
            data=c("data"), phases={p: c(f"host:{p}") for p in names},
            device_phases={p: c(f"device:{p}") for p in names} if self._dev is not None else {},
            comm=c("comm"), comm_exposed=c("exposed"), straggler=m[:, -1].astype(np.int64), buckets=c("buckets"),
            bucket_bytes=c("bytes"), samples=c("samples"), batches=c("batches"),
            profiled=m[:, col["profiled"]] > 0, comm_hook=self._comm_hook, notes=notes,
        )

    def _log_line(self, block: np.ndarray) -> str:
        """``step 1200 | 212 ms | GPU busy 61 % | data wait 31 % (rank 3: 48 %) | straggler: rank 3 ×1.4``."""
        stats = rank_stats([self._series(r, block[r], []) for r in range(block.shape[0])])
        step_ms = float(np.median([s.step_s for s in stats])) * 1e3
        busy = float(np.mean([s.busy_share for s in stats]))
        data = float(np.mean([s.data_share for s in stats]))
        parts = [f"step {self._step}", f"{step_ms:.0f} ms",
                 f"{'GPU' if self._dev is not None else 'host'} busy {busy * 100:.0f} %",
                 f"data wait {data * 100:.0f} %"]
        worst = max(stats, key=lambda s: s.data_share)
        if len(stats) > 1 and worst.data_share - data >= 0.05:
            parts[-1] += f" (rank {worst.rank}: {worst.data_share * 100:.0f} %)"
        if self._comm_hook is not None:
            parts.append(f"comm {float(np.mean([s.comm_share for s in stats])) * 100:.0f} %")
        slow = max(stats, key=lambda s: s.score)
        if len(stats) > 1:
            parts.append(f"straggler: rank {slow.rank} ×{slow.score:.2f}" if slow.score >= PERSISTENT_SCORE
                         else "no straggler")
        return " | ".join(parts)

    # -- the end -------------------------------------------------------------------

    def close(self) -> AnalysisReport | None:
        """Finish: read every marker, exchange the last steps, write the logs and (rank 0) the summary.

        Every rank must call it, like any collective. A step begun but not ended with
        :meth:`step` is dropped. Returns the job's report on rank 0, None elsewhere.
        """
        if self._closed:
            return self.report
        self._closed = True
        if self._prof is not None:
            self._prof.stop()
            self._prof = None
        self._let_go()
        self._drain(self._step)
        self._exchange(final=True)
        self._finish([])
        if self.rank == 0:
            try:
                self.report = self._summarize()
            except Exception as err:  # the end of a long run is no place to crash: the logs are complete
                self._log(f"no job summary ({type(err).__name__}: {err}); the rank logs are complete: "
                          f"gpuidle analyze {self.out_dir}")
        return self.report

    def _finish(self, notes: list[str]) -> None:
        if self.world_size > 1 and self._comm_hook is None:
            notes.append("communication not timed: no DDP comm hook (tracker.watch_ddp(model))")
        self._write([TrackerEnd(steps=self._step, comm_hook=self._comm_hook, notes=notes)])
        self._file.close()
        self._notes.extend(notes)

    def _summarize(self) -> AnalysisReport:
        from gpuidle.api import analyze_series

        width = len(self._cols) + 1
        job = np.concatenate(self._job, axis=1) if self._job else np.zeros((self.world_size, 0, width))
        notes = list(self._notes)
        if self._job_dropped:
            notes.append(f"the job summary covers the last {job.shape[1]} steps of {job.shape[1] + self._job_dropped}; "
                         f"gpuidle analyze {self.out_dir} reads every step from the rank logs")
        series = [self._series(r, job[r], notes) for r in range(job.shape[0])]
        report = analyze_series(series, [str(self.out_dir)])
        text = msgspec.json.format(msgspec.json.encode(report).decode(), indent=2) + "\n"
        (self.out_dir / TRACKER_SUMMARY).write_text(text, encoding="utf-8")
        for line in job_view(report, series, str(self.out_dir)):
            self._log(line)
        self._record(text)
        return report

    def _record(self, text: str) -> None:
        """Keep the job summary in the run ledger (``ledger=False`` skips; a path picks the file)."""
        if self._ledger is False:
            return
        from gpuidle import ledger

        try:
            ledger.record("tracker", text, label=self._label, inputs=[self.out_dir / TRACKER_SUMMARY],
                          path=None if self._ledger is True else Path(self._ledger))
        except GpuidleError as err:
            self._log(f"the job summary was not recorded in the ledger: {err}")

    def __enter__(self) -> StepTracker:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        elif not self._closed:
            # Another rank may be gone: no collective now. Keep the steps read so far.
            self._closed = True
            self._let_go()
            self._drain(self._step)
            rows = np.array(self._rows, dtype=np.float64).reshape(len(self._rows), len(self._cols))
            self._write([self._line(r, 0) for r in rows])
            self._finish([f"closed by {kind.__name__}: steps after the last exchange have no straggler split"])

    def _write(self, lines: Sequence[msgspec.Struct]) -> None:
        if lines:
            self._file.write(b"".join(self._enc.encode(x) + b"\n" for x in lines))
            self._file.flush()


# ----------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------


class _BucketSink:
    """Where DDP's hook reports buckets: the tracker while it runs, nothing once it closed."""

    __slots__ = ("tracker",)

    def __init__(self, tracker: StepTracker) -> None:
        self.tracker: StepTracker | None = tracker

    def ready(self, buffer: torch.Tensor) -> list[Any] | None:
        t = self.tracker
        return t._bucket_ready(buffer) if t is not None else None

    def done(self, entry: list[Any]) -> None:
        t = self.tracker
        if t is not None:
            t._bucket_done(entry)


def timed_hook(
    hook: Callable[..., torch.futures.Future[torch.Tensor]],
    ready: Callable[[torch.Tensor], list[Any] | None],
    done: Callable[[list[Any]], None],
) -> Callable[..., torch.futures.Future[torch.Tensor]]:
    """``hook`` wrapped so that each bucket is marked when it is handed over and when its future completes.

    For CUDA tensors the ``then`` callback runs on streams that wait for the communication,
    so a device marker recorded there completes with it. When ``ready`` returns None the
    bucket passes straight through, with no callback added.
    """

    # No annotations: DDP compares them by identity, and here they would be strings.
    def gpuidle_timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        entry = ready(bucket.buffer())
        fut = hook(state, bucket)
        if entry is None:
            return fut

        def finished(f):  # type: ignore[no-untyped-def]
            done(entry)
            return f.value()

        return fut.then(finished)

    return gpuidle_timed_hook


def _nvtx_push(name: str) -> None:
    torch.cuda.nvtx.range_push(name)  # type: ignore[no-untyped-call]


def _nvtx_pop() -> None:
    torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]


def _alone(rows: np.ndarray) -> np.ndarray:
    return rows[None]


def _exchange_group(group: str | dist.ProcessGroup) -> dist.ProcessGroup | None:
    """The group for the exchange: by default a gloo group of its own.

    Gloo, so that NCCL streams and the GPU are left alone. Its own group, also when the
    default group is gloo: sharing it with DDP's all-reduces made processes abort now and
    then in gloo's teardown at exit (torch 2.13, two ranks on one host).
    """
    if not isinstance(group, str):
        return group
    if group == "default":
        return None
    if group in ("auto", "gloo"):
        return cast(dist.ProcessGroup, dist.new_group(backend="gloo"))
    raise GpuidleError(f"group={group!r}", "use 'auto', 'default', 'gloo' or a ProcessGroup")


def _dist_gather(group: dist.ProcessGroup | None, world: int) -> Gather:
    backend = str(dist.get_backend(group)).lower()
    on_gpu = "gloo" not in backend and torch.cuda.is_available()

    def gather(rows: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float64))
        if on_gpu:
            t = t.cuda()
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t, group=group)
        return np.stack([o.cpu().numpy() for o in out])

    return gather


def _remove_stale(out_dir: Path, world: int) -> None:
    """Logs of ranks beyond this job's world, and an old summary, would mix two runs."""
    summary = out_dir / TRACKER_SUMMARY
    if summary.exists():
        summary.unlink()
    for f in out_dir.glob("rank-*.jsonl"):
        r = f.name[len("rank-"):-len(".jsonl")]
        if r.isdigit() and int(r) >= world:
            f.unlink()


def _stderr(line: str) -> None:
    print(f"gpuidle: {line}", file=sys.stderr, flush=True)


def job_view(report: AnalysisReport, series: list[StepSeries], out_dir: str) -> list[str]:
    """Rank 0's closing lines: the rank table, the straggler, the first fixes, and where the report is."""
    stats = rank_stats(series)
    steps = max((s.steps for s in stats), default=0)
    timed = "phases timed on the device" if series and series[0].device_timed else "phases timed on the host"
    lines = [f"job view: {len(stats)} rank(s) · {steps} steps · {timed}",
             f"{'rank':>5} {'step':>10} {'busy':>6} {'data wait':>10} {'comm':>6} {'score':>6} "
             f"{'samples':>10} {'batches':>8}"]
    for s in stats:
        lines.append(f"{s.rank:>5} {s.step_s * 1e3:>7.2f} ms {s.busy_share * 100:>4.0f} % {s.data_share * 100:>8.0f} % "
                     f"{s.comm_share * 100:>4.0f} % {s.score:>6.2f} {s.samples:>10,} {s.batches:>8,}")
    if report.job is not None:
        for st in report.job.stragglers:
            lines.append(f"straggler: rank {st.rank} ×{st.score:.2f} — {st.why}")
        lines.extend(f"note: {n}" for n in report.job.notes if n != HOST_TIMED_NOTE)
    for rec in [r for r in report.recommendations if r.alternative_to is None and not r.gain.minor][:3]:
        g = rec.gain
        gain = "gain not estimable" if g.step_s_saved is None or g.utilization_after is None else (
            f"saves {g.step_s_saved * 1e3:.2f} ms/step → utilization {g.utilization_after * 100:.0f} %")
        lines.append(f"fix: {rec.title} — {gain} [{rec.cause}]")
    if not report.recommendations:
        lines.append("no idle cause above its threshold")
    lines.append(f"full report: gpuidle analyze {out_dir}")
    return lines
