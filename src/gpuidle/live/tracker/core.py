"""The in-process step tracker: where every step of every rank spends its time (usage: the package).

Timing never stalls the loop. With CUDA, each phase is bracketed by two events recorded on
the current stream (:mod:`.clock`). A step's events are read once they have completed, checked
with ``query()`` at later steps; only a step more than ``resolve_lag`` steps old is waited for,
and by then the device has that many steps of work queued, so the wait costs nothing.
Without CUDA the host clock times the phases, and the report says so. The wait for data
is timed on the host around ``next()``; DDP communication by a wrapper around the comm
hook that marks each bucket ready and its future done (:mod:`.ddp`).

Every ``every`` steps the ranks exchange their finished steps (:mod:`.exchange`). Each rank
then knows how long it waited for the slowest one and appends its steps to ``rank-<r>.jsonl``;
rank 0 keeps the job view, logs a line every ``log_every`` steps and, at :meth:`StepTracker.close`,
writes the job summary (:mod:`.output`) that ``gpuidle analyze <out_dir>`` reads, like the logs.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from gpuidle.analysis.series import HOST_TIMED_NOTE
from gpuidle.errors import GpuidleError
from gpuidle.live.exporter import node_name
from gpuidle.model import TRACKER_OTHER

from . import ddp
from .base import TrackerBase
from .clock import CudaClock, DeviceClock, HostClock, Marker
from .exchange import Gather, dist_gather, dist_rank_facts, exchange_group
from .groups import rank_groups
from .phases import (
    COMPUTE_PHASES,
    COPY_PHASE,
    DEFAULT_PHASES,
    OpenStep,
    PendingStep,
    Phase,
    batch_size,
    nvtx_pop,
    nvtx_push,
)
from .profile import NO_DEVICE_NOTE, ProfileWindow

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport

    from .fsdp import CommSink
    from .sharded import Summary

T = TypeVar("T")


class StepTracker(TrackerBase):
    """Times the phases of every training step on this rank; aggregates across ranks.

    :param out_dir: folder for ``rank-<r>.jsonl`` and, from rank 0, the job summary.
    :param model: the model whose communication to time: ``DistributedDataParallel`` (see :meth:`watch_ddp`),
        a ``fully_shard``-ed (FSDP2) model or a DeepSpeed engine (:mod:`.sharded`); any other model: one
        line says its communication is not timed.
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
    :param prometheus_port: rank 0 serves the job's numbers as Prometheus metrics on this port
        (0: any free one, see :attr:`prometheus_port`) until :meth:`close`; other ranks ignore it.
    :param prometheus_addr: the address the metrics are served on (default: this host only).
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
        prometheus_port: int | None = None,
        prometheus_addr: str = "127.0.0.1",
    ) -> None:
        if resolve_lag < 0:
            raise GpuidleError(f"resolve_lag={resolve_lag}", "resolve_lag must be at least 0")
        notes: list[str] = []
        distributed = dist.is_available() and dist.is_initialized()
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        world_size = world_size if world_size is not None else (dist.get_world_size() if distributed else 1)
        groups, unread = rank_groups(dist.get_rank(), dist.get_world_size()) if distributed else ([], None)
        if unread is not None:
            notes.append(unread)

        if device_clock == "auto":
            device_clock = CudaClock() if torch.cuda.is_available() else None
        elif isinstance(device_clock, str):
            raise GpuidleError(f"device_clock={device_clock!r}", "use 'auto', None or a DeviceClock")
        self._dev: DeviceClock | None = device_clock
        self._comm_clock: DeviceClock = device_clock if device_clock is not None else HostClock(clock)
        self._lag = resolve_lag if device_clock is not None else 0
        if device_clock is None:
            notes.append(HOST_TIMED_NOTE)
        self._nvtx = nvtx and torch.cuda.is_available()
        if nvtx and not self._nvtx:
            notes.append("nvtx ranges off: CUDA is not available")
        cuda = isinstance(device_clock, CudaClock)
        self._device = torch.cuda.current_device() if cuda else 0

        hosts = [node_name()] * world_size  # the metrics' Hostname labels; a test's gather runs every rank here
        by_rank = [groups if r == rank else [] for r in range(world_size)]
        if gather is None and world_size > 1:
            exchange = exchange_group(group)
            gather = dist_gather(exchange, world_size)
            hosts, by_rank = dist_rank_facts(exchange, world_size, hosts[0], groups)
        self._samples = samples or batch_size
        self._step_start: int | None = None
        self._open = OpenStep()
        self._inflight: dict[str, tuple[int, Marker | None]] = {}
        self._pending: deque[PendingStep] = deque()
        self._forced = 0
        self._sink = ddp.BucketSink(self)
        self._comm_summary: Summary = ddp.summary
        self._sharded_sink: CommSink | None = None
        self._window = ProfileWindow()
        super().__init__(
            out_dir, framework="pytorch", timing="device" if device_clock is not None else "host", rank=rank,
            world_size=world_size, gather=gather, hosts=hosts, phases=phases, compute_phases=compute_phases,
            copy_phase=copy_phase, every=every, log_every=log_every, notes=notes, clock=clock, log=log,
            summary_steps=summary_steps, label=label, ledger=ledger, prometheus_port=prometheus_port,
            prometheus_addr=prometheus_addr, device=self._device,
            device_name=torch.cuda.get_device_name(self._device) if cuda else None, process_groups=by_rank,
        )
        if model is not None:
            known = len(self._notes)
            self._watch(model)
            if self.rank == 0:
                for note in self._notes[known:]:
                    self._log(note)

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

    def phase(self, name: str) -> Phase:
        """``with tracker.phase("forward"): ...``: time one phase of the step (may repeat within a step)."""
        return Phase(self, name)

    def begin(self, name: str) -> None:
        """Start phase ``name`` (for callbacks that cannot use ``with``); :meth:`end` closes it."""
        if self._step_start is None:
            self._step_start = self._clock()
        if self._nvtx:
            nvtx_push(name)
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
            nvtx_pop()

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

    def step(self) -> None:
        """End the step: queue its markers, read those that completed, exchange every ``every`` steps."""
        now = self._clock()
        for name in list(self._inflight):
            self.end(name)
        start = self._step_start if self._step_start is not None else now
        work = self._open
        last = work.marks[-1][2] if work.marks else None
        profiled = self._step in self._window.steps
        self._pending.append(PendingStep(self._step, start - self._t0, now - start, work, last, profiled))
        self._open = OpenStep()
        self._step += 1
        self._step_start = now
        self._drain(self._step - self._lag)
        if self._step % self._every == 0:
            self._exchange(final=False, count=(self._step - self._lag) - self._sent)
        if self._window.running:
            self._window.step(self._step)
        if self._nvtx:
            torch.cuda.nvtx.mark(f"gpuidle step {self._step}")  # type: ignore[no-untyped-call]

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
        self._comm_hook = ddp.register(model, self._sink, state, hook)

    def _watch(self, model: Any) -> None:
        """DDP through its comm hook; FSDP2 and DeepSpeed through :mod:`.sharded`; else a note."""
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            self.watch_ddp(model)
            return
        from . import sharded  # FSDP2 and DeepSpeed: imported for the models that need them

        watched = sharded.watch(self, model)
        self._comm_hook, self._sharded_sink, self._comm_settings = watched.hook, watched.sink, watched.settings
        if watched.summary is not None:
            self._comm_summary = watched.summary
        for note in watched.notes:
            self.note(note)

    def _bucket_ready(self, buffer: torch.Tensor) -> list[Any]:
        entry = [self._comm_clock.mark(), None, buffer.numel() * buffer.element_size()]
        self._open.comm.append(entry)
        return entry

    def _bucket_done(self, entry: list[Any]) -> None:
        entry[1] = self._comm_clock.mark()

    def _let_go(self) -> None:
        """After close, DDP's hook passes buckets straight through and no longer holds the tracker."""
        self._sink.tracker = None
        if self._sharded_sink is not None:
            self._sharded_sink.tracker = None

    # -- a profiled window -----------------------------------------------------------

    def profile(self, steps: range, out_dir: str | os.PathLike[str] | None = None, *,
                record_shapes: bool = False, with_stack: bool = False) -> Path:
        """Record a ``torch.profiler`` trace of ``steps`` (after one warm-up step) on this rank.

        Profile a few steps first: the trace (``<out_dir>/profile`` by default, one file per
        rank) splits what step timing leaves unattributed; ``gpuidle analyze`` reads it.
        Those steps are flagged in the log and left out of the step statistics.
        """
        where = Path(out_dir) if out_dir is not None else self.out_dir / "profile"
        self._window.start(steps, self._step, where, self.rank, record_shapes=record_shapes, with_stack=with_stack)
        if not torch.cuda.is_available() and NO_DEVICE_NOTE not in self._notes:
            self.note(NO_DEVICE_NOTE)
            if self.rank == 0:
                self._log(NO_DEVICE_NOTE)
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

    def _resolve(self, p: PendingStep, force: bool) -> None:
        work = p.work
        if force and not p.ready():
            self._forced += 1
            if p.last is not None:
                p.last.synchronize()
            for c in work.comm:
                if c[1] is not None:
                    c[1].synchronize()
        layout = self._rows_layout
        row = [0.0] * layout.width
        row[0], row[1], row[2], row[3] = p.step, p.start, p.dur, work.data
        cols, other = layout.host_col, layout.host_col[TRACKER_OTHER]
        for name, ns in work.host.items():
            row[cols.get(name, other)] += ns
        if self._dev is not None and work.marks:
            cols, other = layout.device_col, layout.device_col[TRACKER_OTHER]
            for name, a, b in work.marks:
                row[cols.get(name, other)] += self._dev.elapsed_ns(a, b)
            self._dev.release([m for _, a, b in work.marks for m in (a, b)])
        comm = exposed = count = nbytes = 0
        if work.comm:
            comm, exposed, count, nbytes = self._comm_summary(self._comm_clock, work.comm)
            self._comm_clock.release([m for c in work.comm for m in c[:2] if m is not None])
        for i, v in zip(layout.tail, (comm, exposed, count, nbytes, work.samples, work.batches, p.profiled,
                                      0, 0), strict=True):
            row[i] = v
        self._rows.append(row)

    # -- the end -------------------------------------------------------------------

    def close(self) -> AnalysisReport | None:
        """Finish: read every marker, exchange the last steps, write the logs and (rank 0) the summary.

        Every rank must call it, like any collective. A step begun but not ended with
        :meth:`step` is dropped. Returns the job's report on rank 0, None elsewhere.
        """
        if self._closed:
            return self.report
        self._closed = True
        self._window.stop()
        self._let_go()
        self._drain(self._step)
        notes = []
        if self.world_size > 1 and self._comm_hook is None:
            notes.append("communication not timed: no DDP comm hook (tracker.watch_ddp(model))")
        return self._conclude(notes)

    def __enter__(self) -> StepTracker:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        elif not self._closed:
            # Another rank may be gone: no collective now. Keep the steps read so far.
            self._closed = True
            self._window.stop()
            self._let_go()
            self._drain(self._step)
            self._abandon(kind.__name__)
