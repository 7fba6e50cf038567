"""The step tracker for JAX: the device's busy and idle per step, without stalling the loop (usage: ``gpuidle.jax``).

JAX dispatches asynchronously: the host's time in a step is its dispatch, not the device's
work, and a wait for data overlaps the previous step's device work. So the device is timed:
``tracker.step(outputs)`` hands one of the step's output arrays to a watcher thread that waits
for it (``block_until_ready`` releases the GIL) and stamps its completion; the loop also looks
(``is_ready()``) whenever it passes the tracker, and the earlier of the two is the step's end.
Outputs already complete when the loop reaches ``tracker.step`` completed, if the step synced
after its dispatch, when its last sync returned (that sync waited for them), else by then.
A step's device work starts at the later of the previous step's end and the moment its work
was queued (the return of its first phase, the dispatch, or a sync inside that phase; else the
arrival of its batch): a dispatch into an idle device is idle, which on an H200 was 0.3 ms a
step. What lies between is the device's idle, split by what the host was doing then:

- ``data_loading``: the host was in the loader's ``next()``, or had been blocked in it when the
  device ran dry, so the dispatch after the batch came late: as much of the idle as the host
  spent blocked since the previous step began (without the wait its own work would have come
  that much earlier; the idle beyond is that work, which a loop whose host outruns its device
  cannot hide);
- ``host_sync``: the host was in a sync (``float(loss)``, ``block_until_ready``, printing an
  array: :mod:`.jax_syncs`), or had been blocked in one when the device ran dry: the same rule;
- ``unattributed``: the rest (Python between steps, dispatch, the host's own work).

The stamp is taken once the watcher holds the GIL again: up to the interpreter's switch
interval (5 ms) late while the loop runs pure Python; the ``is_ready()`` looks bound it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import jax
import numpy as np

from gpuidle.errors import GpuidleError
from gpuidle.model import TRACKER_OTHER

from .base import TrackerBase
from .exchange import Gather
from .jax_syncs import SyncWatch
from .phases import batch_size

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport

T = TypeVar("T")


class _Ready(Protocol):
    """A step's output leaf: a jax.Array, whose ``is_ready`` some JAX versions leave out of its type."""

    def is_ready(self) -> bool: ...
MIN_JAX = (0, 4, 30)
CPU_ARRAY_NOTE = ("on JAX's CPU backend NumPy reads an array through its buffer, which no wrapper sees: syncs by "
                  "np.asarray(x) or np.array(x) (Keras's reads of the logs among them) are not timed, their idle is "
                  "unattributed")
HOST_ONLY_NOTE = ("tracker.step() was given no JAX array in {n} step(s): those are timed on the host "
                  "(their dispatch, not the device's work)")


def jax_version() -> tuple[int, ...]:
    """The installed JAX's version; one clear error when it is older than this tracker reads."""
    try:
        version = tuple(int(x) for x in jax.__version__.split(".")[:3])
    except ValueError:
        version = MIN_JAX
    if version < MIN_JAX or not hasattr(type(jax.numpy.zeros(())), "is_ready"):
        raise GpuidleError(f"gpuidle.jax needs JAX {'.'.join(map(str, MIN_JAX))} or later, not {jax.__version__}",
                           "pip install -U 'gpuidle[jax]'")
    return version


@dataclass(slots=True)
class HostStep:
    """What the loop did in one step, on the host clock; ``done`` once the device finished its outputs."""

    index: int = 0
    data: list[tuple[int, int]] = field(default_factory=list)
    syncs: list[tuple[int, int]] = field(default_factory=list)
    host: dict[str, int] = field(default_factory=dict)
    dispatch: int | None = None
    launched: int | None = None
    """When the first phase returned: its work was queued by then (a dispatch into an idle device is idle)."""
    floor: int | None = None
    """A new pass over the loader began here: the step starts no earlier."""
    end: int = 0
    samples: int = 0
    batches: int = 0
    leaf: Any = None
    stamp: int | None = None
    """Set by the watcher thread when ``leaf`` completed."""
    seen: int | None = None
    """Set by the loop when it first found ``leaf`` complete."""

    def done(self) -> int | None:
        if self.stamp is None:
            return self.seen
        return self.stamp if self.seen is None else min(self.stamp, self.seen)


def overlap(a: int, b: int, spans: Iterable[tuple[int, int]]) -> int:
    """Time of ``[a, b]`` covered by ``spans`` (the loop's spans do not overlap each other)."""
    covered = 0
    for s, e in spans:
        if e > a and s < b:
            covered += min(b, e) - max(a, s)
    return covered


def holds(t: int, spans: Iterable[tuple[int, int]]) -> bool:
    """Whether instant ``t`` lies in one of ``spans`` (ends included)."""
    return any(s <= t <= e for s, e in spans)


class JaxPhase:
    """``with tracker.phase(name):`` — host time of the phase; its first entry marks the step's dispatch."""

    __slots__ = ("_name", "_t0", "_tracker")

    def __init__(self, tracker: StepTracker, name: str) -> None:
        self._tracker = tracker
        self._name = name

    def __enter__(self) -> None:
        t = self._tracker
        self._t0 = t0 = t._clock()
        if t._open.dispatch is None:
            t._open.dispatch = t0

    def __exit__(self, *exc: object) -> None:
        t = self._tracker
        rec = t._open
        now = t._clock()
        if rec.launched is None:
            rec.launched = now
        rec.host[self._name] = rec.host.get(self._name, 0) + now - self._t0


class StepTracker(TrackerBase):
    """Times every step of a JAX training loop on this process; aggregates across processes.

    :param out_dir: folder for ``rank-<r>.jsonl`` and, from rank 0, the job summary.
    :param phases: phase names with a column of their own (host time); others add to ``other``.
    :param compute_phases: the device's time per step is recorded under the first of these.
    :param every: steps between two exchanges across processes (and writes of the log).
    :param log_every: rank 0 logs a line every this many steps (None: never).
    :param resolve_lag: at an exchange, steps this many steps old are waited for if not finished.
    :param watch_syncs: time the loop's host syncs (:mod:`.jax_syncs`).
    :param rank: this process's rank (default ``jax.process_index()``); with ``world_size``
        (default ``jax.process_count()``), for processes that JAX does not connect.
    :param framework: whose words the fixes take: ``jax``, or ``keras`` for the Keras callback on JAX.
    :param gather: the exchange across processes (default: JAX's host all-gather when
        ``jax.process_count() > 1``, else none: each process writes its log and
        ``gpuidle analyze <out_dir>`` merges them).
    Other parameters as for the PyTorch tracker (``gpuidle.torch.StepTracker``).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] = "gpuidle-run",
        *,
        phases: Sequence[str] = ("train_step",),
        compute_phases: Sequence[str] | None = None,
        every: int = 50,
        log_every: int | None = 500,
        resolve_lag: int = 2,
        watch_syncs: bool = True,
        samples: Callable[[Any], int] | None = None,
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
        framework: str = "jax",
    ) -> None:
        jax_version()
        compute = list(compute_phases) if compute_phases is not None else list(phases[:1])
        if not compute or resolve_lag < 0:
            raise GpuidleError(f"compute_phases={compute}, resolve_lag={resolve_lag}",
                               "name at least one compute phase (the device's time is recorded under it); "
                               "resolve_lag must be at least 0")
        notes: list[str] = []
        rank = rank if rank is not None else jax.process_index()
        world_size = world_size if world_size is not None else jax.process_count()
        if gather is None and world_size > 1 and world_size == jax.process_count():
            gather = process_allgather
        self._lag = resolve_lag
        self._samples = samples or batch_size
        self._open = HostStep()
        self._pending: deque[HostStep] = deque()
        self._last = HostStep()
        self._last_done: int | None = None
        self._last_begin: int | None = None
        self._host_only = 0
        self._off = False
        self._queue: queue.SimpleQueue[HostStep | None] = queue.SimpleQueue()
        self._watching = True
        """Steps whose outputs are not complete at their end are handed to the watcher thread."""
        self._in_order: deque[HostStep] | None = None
        """Steps whose completion the caller reports in turn (:meth:`completed`); None: it reports none."""
        self._watcher = threading.Thread(target=self._watch, name="gpuidle-jax-watcher", daemon=True)
        self._syncs: SyncWatch | None = None
        if watch_syncs:
            self._syncs = SyncWatch(self._synced, clock)
            if not self._syncs.install():
                self._syncs = None
                notes.append("host syncs not timed: another gpuidle JAX tracker is timing them")
            elif self._syncs.missing:
                notes.append(f"host syncs through {', '.join(self._syncs.missing)} not timed on JAX {jax.__version__}")
        elif not watch_syncs:
            notes.append("host syncs not timed (watch_syncs=False): their idle is unattributed")
        device = jax.local_devices()[0]
        if self._syncs is not None and device.platform == "cpu":
            notes.append(CPU_ARRAY_NOTE)
        try:
            super().__init__(
                out_dir, framework=framework, timing="device", rank=rank, world_size=world_size, gather=gather,
                hosts=None, phases=phases, compute_phases=compute, copy_phase="", every=every, log_every=log_every,
                notes=notes, clock=clock, log=log, summary_steps=summary_steps, label=label, ledger=ledger,
                prometheus_port=prometheus_port, prometheus_addr=prometheus_addr, device=int(device.id),
                device_name=str(device.device_kind),
            )
        except BaseException:
            if self._syncs is not None:
                self._syncs.uninstall()
            raise
        layout = self._rows_layout
        self._busy_col = layout.device_col.get(compute[0], layout.device_col[TRACKER_OTHER])
        self._host_cols, self._other_col = layout.host_col, layout.host_col[TRACKER_OTHER]
        self._tail_cols = tuple(layout.col[c] for c in ("samples", "batches", "sync", "syncs"))
        self._watcher.start()

    # -- the loop ------------------------------------------------------------------

    def loader(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield the batches of ``iterable``, timing the host's wait in ``next()`` (a new pass starts a new step)."""
        it = iter(iterable)
        first = True
        while True:
            try:
                batch = self.fetch(it, first)
            except StopIteration:
                return
            first = False
            yield batch

    def fetch(self, it: Iterator[T], first: bool = False) -> T:
        """``next(it)``, its wait timed as the loader's (``first``: a new pass over the data begins here).

        For loops that fetch inside a call of their own (Keras's train function); ``StopIteration`` passes
        through."""
        t0 = self._clock()
        if self._pending and not self._off:
            self._look(t0)
        batch = next(it)
        if not self._off:
            try:
                self._batch(t0, self._clock(), batch, first)
            except Exception as err:  # never break the loop
                self._fail(err)
        return batch

    def phase(self, name: str) -> JaxPhase:
        """``with tracker.phase("train_step"): state, loss = train_step(state, batch)``: host time of a phase;
        the step's first phase marks when its work was dispatched."""
        return JaxPhase(self, name)

    def step(self, outputs: Any = None) -> None:
        """End the step. ``outputs``: what the step returned (the loss is enough): its completion times the device."""
        if self._off:
            return
        try:
            self._end(outputs)
        except Exception as err:  # never break the loop
            self._fail(err)

    def _batch(self, t0: int, t1: int, batch: Any, first: bool) -> None:
        rec = self._open
        if first and not rec.batches and not rec.host:
            rec.floor = t0
        rec.data.append((t0, t1))
        rec.batches += 1
        rec.samples += self._samples(batch)
        self._look(t1)

    def _synced(self, t0: int, t1: int) -> None:
        if self._off:
            return
        try:
            self._open.syncs.append((t0, t1))
            self._look(t1)
        except Exception as err:
            self._fail(err)

    def _end(self, outputs: Any) -> None:
        now = self._clock()
        rec = self._open
        rec.index, rec.end = self._step, now
        leaf = next((x for x in jax.tree_util.tree_leaves(outputs) if isinstance(x, jax.Array)), None)
        self._open = HostStep()
        self._pending.append(rec)
        self._step += 1
        if leaf is None:
            rec.seen = now
            self._host_only += 1
        elif cast(_Ready, leaf).is_ready():  # finished before the loop got here: at the end of its last sync, if any
            dispatch = rec.dispatch if rec.dispatch is not None else rec.data[-1][1] if rec.data else 0
            rec.seen = max((e for a, e in rec.syncs if a >= dispatch), default=now)
        else:
            rec.leaf = leaf
            if self._watching:
                self._queue.put(rec)
        in_order = self._in_order
        if in_order is not None:
            in_order.append(rec)
        self._look(now)
        self._drain(0)
        if self._step % self._every == 0:
            with self._syncs.untimed() if self._syncs is not None else contextlib.nullcontext():
                self._exchange(final=False, count=self._ready(self._step - self._lag))

    # -- the device's side -----------------------------------------------------------

    def report_completions(self, on: bool) -> None:
        """``on``: a thread of the caller's own waits for each step's outputs in turn and says so (:meth:`completed`);
        from its first word on, the watcher thread is handed no more steps. Off: the watcher times them all.

        Keras's callback thread reads every step's logs from the device anyway: stamping there spares the watcher's
        wake-up (and its turn at the interpreter's lock) every step."""
        self._in_order = deque() if on else None
        self._watching = True

    def completed(self) -> None:
        """The oldest step not yet said to be complete is complete by now (called from the caller's own thread).

        Never early: a step whose outputs are not complete yet is left to the loop's looks and the exchange."""
        in_order = self._in_order
        if in_order is None:
            return
        self._watching = False
        try:
            rec = in_order.popleft()
        except IndexError:
            return
        try:
            leaf = rec.leaf
            if leaf is None or leaf.is_ready():
                rec.stamp = self._clock()
        except Exception:  # on another thread than the loop's: the watcher times the steps again
            self._in_order, self._watching = None, True

    def _watch(self) -> None:
        """The watcher thread: wait for each step's output in turn, stamp its completion."""
        while True:
            rec = self._queue.get()
            if rec is None:
                return
            with contextlib.suppress(Exception):  # a failed computation: the loop meets the error itself
                rec.leaf.block_until_ready()
            rec.stamp = self._clock()

    def _look(self, now: int) -> None:
        """The loop passes by: steps whose outputs completed are done by ``now``."""
        for rec in self._pending:
            if rec.seen is not None:
                continue
            if not rec.leaf.is_ready():
                return
            rec.seen = now

    def _ready(self, cut: int) -> int:
        """Resolve every step below ``cut`` (waiting for the device if need be); the count to exchange."""
        self._drain(cut)
        return cut - self._sent

    def _drain(self, cut: int) -> None:
        """Turn finished steps into rows, in order; those below ``cut`` are waited for."""
        while self._pending:
            rec = self._pending[0]
            if rec.done() is None:
                if rec.index >= cut:
                    return
                rec.leaf.block_until_ready()
                rec.seen = self._clock()
            self._pending.popleft()
            self._resolve(rec)

    def _resolve(self, rec: HostStep) -> None:
        """The step's row: the device's busy from its start to its end, the idle before it by what the host did.

        Runs once a step on the loop's thread: plain loops over the few spans, no lists made."""
        done = rec.done()
        assert done is not None
        last, data_spans, sync_spans = self._last, rec.data, rec.syncs
        prev_done = self._last_done
        if prev_done is None:
            prev_done = rec.floor or rec.end
            for a, _ in data_spans:
                prev_done = min(prev_done, a)
        start = max(prev_done, rec.floor or prev_done)
        done = max(done, start)
        dispatch = rec.dispatch if rec.dispatch is not None else data_spans[-1][1] if data_spans else rec.end
        # the device starts once the previous step is done and this one's work is queued: by the first phase's
        # return, or by a sync inside that phase (which waits for queued work)
        queued = rec.launched if rec.launched is not None else dispatch
        for a, _ in sync_spans:
            if dispatch <= a < queued:
                queued = a
        begin = min(max(start, queued), done)
        data = overlap(start, begin, last.data) + overlap(start, begin, data_spans)
        sync = overlap(start, begin, last.syncs) + overlap(start, begin, sync_spans)
        # the host was blocked (in the loader or a sync) when the device ran dry: without the block its own work
        # (the dispatch after it) would have come that much earlier, so the idle up to the time it was blocked
        # since the previous step began is the block's; the idle beyond is the host's own work
        since = self._last_begin if self._last_begin is not None else start
        if holds(prev_done, last.data) or holds(prev_done, data_spans):
            data = min(begin - start - sync, overlap(since, begin, last.data) + overlap(since, begin, data_spans))
        elif holds(prev_done, last.syncs) or holds(prev_done, sync_spans):
            sync = min(begin - start - data, overlap(since, begin, last.syncs) + overlap(since, begin, sync_spans))
        row = [0.0] * self._rows_layout.width
        row[0], row[1], row[2], row[3] = rec.index, start - self._t0, done - start, data
        cols, other = self._host_cols, self._other_col
        for name, ns in rec.host.items():
            row[cols.get(name, other)] += ns
        row[self._busy_col] = done - begin
        samples, batches, sync_col, syncs_col = self._tail_cols
        row[samples], row[batches], row[sync_col], row[syncs_col] = rec.samples, rec.batches, sync, len(sync_spans)
        self._rows.append(row)
        rec.leaf = None
        self._last, self._last_done, self._last_begin = rec, done, begin

    # -- the end -------------------------------------------------------------------

    def _fail(self, err: Exception) -> None:
        """Log once and step aside: the tracker never breaks the training loop."""
        self._off = True
        self._stop()
        self._log(f"the JAX step tracker stopped at step {self._step} ({type(err).__name__}: {err}); "
                  "training goes on, the steps so far are kept")

    def _stop(self) -> None:
        if self._syncs is not None:
            self._syncs.uninstall()
        self._queue.put(None)

    def close(self) -> AnalysisReport | None:
        """Wait for the last steps, exchange them, write the logs and (rank 0) the summary. Every process calls it."""
        if self._closed:
            return self.report
        self._closed = True
        notes = []
        if not self._off:
            self._stop()
            self._drain(self._step)
        else:
            notes.append(f"the tracker stopped at step {self._step}: the steps after it are not recorded")
        self._pending.clear()
        if self._host_only:
            notes.append(HOST_ONLY_NOTE.format(n=self._host_only))
        self._watcher.join(timeout=5.0)
        return self._conclude(notes)

    def __enter__(self) -> StepTracker:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon(kind.__name__)

    def abandon(self, why: str) -> None:
        """The loop ended by ``why`` (an error): write the steps so far, release the syncs' wrappers, no exchange."""
        if not self._closed:
            self._closed = True
            self._stop()
            self._abandon(why)


def process_allgather(rows: np.ndarray) -> np.ndarray:
    """:data:`~.exchange.Gather` over JAX's processes: every process's rows, stacked by process index."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(rows, tiled=False))
