"""The step tracker for Keras 3 on JAX: the same ``model.fit`` callback as on TensorFlow (usage: ``gpuidle.keras``).

On the JAX backend ``fit`` fetches each batch in Python, inside the train function it calls once
per step: ``next(iterator)``, then the jitted step's dispatch, which returns before the device
has run it. So the wait for data is on the host's clock, and the device is timed as the JAX
tracker times it (:mod:`.jax_tracker`): at ``on_train_begin`` the callback wraps the model's
``train_function`` for the length of the fit. Each call's ``next()`` is timed as the tracker's
loader, the dispatch after it as its ``train_step`` phase (so the call's first dispatch marks
when its work was queued), and the logs it returns (device arrays) end the step; their completion
is stamped as below. A wait for data overlaps the previous step's device work; only the device's
idle is reported.

Keras reads every step's logs to the host, on a thread of its own (or, when a callback that reads
them per batch is not marked ``async_safe``, as the progress bar of ``verbose=1`` is not, on the
loop's: a wait for the device that the JAX tracker times as a host sync). The callback is marked
``async_safe`` and, where Keras honours that mark, hears each step's logs once they are read: on
Keras's own thread that is the step's completion, stamped there instead of by the watcher thread
(which spares it a wake-up a step); where Keras reads them on the loop, the watcher times the steps.
Keras's choice is left as it was.

With ``steps_per_execution = k`` one call fetches and dispatches ``k`` batches and returns the
logs of its last: one step of the log is one call; the data waits after its first dispatch
overlap the device's work on the batches before and count as busy, so the data share is a lower
bound (a note says so).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras

from gpuidle.errors import GpuidleError

from .jax_tracker import JaxPhase, StepTracker

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport

PHASE = "train_step"
WRAPPED = "__gpuidle_wraps__"
"""The train function a timing wrapper wraps: a later fit's callback wraps that one, never the wrapper."""
BACKEND_NOTE = "Keras {version} on the JAX backend: the train function's fetch and dispatch timed, the device watched"
EXECUTION_NOTE = ("steps_per_execution={k}: a step here is one train call of up to {k} batches; the data waits "
                  "after its first batch count as busy (the device may still have been working): the data share "
                  "is a lower bound")


_FITTING: weakref.WeakSet[StepTracker] = weakref.WeakSet()
"""Trackers of fits that began and have not ended."""


def _close_stale_fits() -> None:
    """Close the trackers of fits that raised (Keras calls no ``on_train_end`` then): their steps are written, and
    their syncs' wrappers, held until then, let a new tracker time the syncs."""
    for stale in list(_FITTING):
        stale.abandon("a fit that raised")
    _FITTING.clear()


class _TimedFeed:
    """The iterator Keras's train function fetches from: each ``next()`` timed, the dispatch after it a phase."""

    __slots__ = ("_first", "_it", "_open", "_tracker")

    def __init__(self, tracker: StepTracker, it: Iterator[Any], first: bool) -> None:
        self._tracker, self._it, self._first = tracker, it, first
        self._open: JaxPhase | None = None

    def __iter__(self) -> _TimedFeed:
        return self

    def __next__(self) -> Any:
        self.end_dispatch()
        batch = self._tracker.fetch(self._it, self._first)
        self._first = False
        self._open = self._tracker.phase(PHASE)
        self._open.__enter__()
        return batch

    def end_dispatch(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None


@functools.cache
def keras_reads_logs_apart() -> bool:
    """Whether this Keras still reads the logs on a thread of its own for a callback marked ``async_safe`` that hears
    every batch's end (Keras 3 from about 3.8 on). Asked of Keras itself: on one that ignores the mark, a callback
    that hears batch ends would make every step wait for its logs on the loop."""
    class Probe(keras.callbacks.Callback):  # type: ignore[misc]
        async_safe = True

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            pass

    try:
        return getattr(keras.callbacks.CallbackList([Probe()]), "_async_train", False) is True
    except Exception:  # an unknown Keras: the watcher thread times the steps
        return False


class GpuidleCallback(keras.callbacks.Callback):  # type: ignore[misc]  # Keras is untyped
    """``model.fit(x, callbacks=[callback])`` on the JAX backend: every step's data wait, host syncs and device time.

    Parameters as for the TensorFlow backend's callback; ranks default to ``jax.process_index()`` and
    ``jax.process_count()``.
    """

    async_safe = True
    """Keras may call this callback's batch ends on its own thread (it reads the step's logs there)."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str] = "gpuidle-run",
        *,
        every: int = 50,
        log_every: int | None = 500,
        rank: int | None = None,
        world_size: int | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        log: Callable[[str], None] | None = None,
        summary_steps: int = 5000,
        label: str | None = None,
        ledger: str | os.PathLike[str] | bool = True,
        prometheus_port: int | None = None,
        prometheus_addr: str = "127.0.0.1",
    ) -> None:
        if int(keras.__version__.split(".")[0]) < 3 or keras.backend.backend() != "jax":
            raise GpuidleError(f"this callback times Keras 3 on the JAX backend, not Keras {keras.__version__} on "
                               f"{keras.backend.backend()!r}", "use gpuidle.keras.GpuidleCallback")
        super().__init__()
        _close_stale_fits()
        self._tracker = StepTracker(
            out_dir, phases=[PHASE], every=every, log_every=log_every, clock=clock, rank=rank, world_size=world_size,
            log=log, summary_steps=summary_steps, label=label, ledger=ledger, prometheus_port=prometheus_port,
            prometheus_addr=prometheus_addr, framework="keras",
        )
        self._tracker.note(BACKEND_NOTE.format(version=keras.__version__))
        self._log = self._tracker._log
        self._original: Callable[..., Any] | None = None
        self._new_pass = True
        self._loop_thread: int | None = None
        """The fit's thread while batch ends are taken as completions; None before the fit, and once Keras is seen
        to call them on the fit's own thread (then the watcher times the steps)."""
        self._hears_logs = keras_reads_logs_apart()
        if self._hears_logs:  # else Keras's default batch end, which leaves Keras's dispatch as it was
            self.on_train_batch_end = self._logs_read

    @property
    def report(self) -> AnalysisReport | None:
        """The job summary (rank 0, once the fit ended)."""
        return self._tracker.report

    @property
    def steps_done(self) -> int:
        return self._tracker.steps_done

    @property
    def out_dir(self) -> Path:
        return self._tracker.out_dir

    @property
    def path(self) -> Path:
        """This rank's log, ``rank-<r>.jsonl``."""
        return self._tracker.path

    @property
    def rank(self) -> int:
        return self._tracker.rank

    @property
    def world_size(self) -> int:
        return self._tracker.world_size

    @property
    def prometheus_port(self) -> int | None:
        """The port rank 0 serves its metrics on until the fit ends, None when it serves none."""
        return self._tracker.prometheus_port

    def dataset(self, ds: Any) -> Any:
        """``ds`` as it is: on the JAX backend the batches are fetched in Python, where their wait is timed."""
        return ds

    # -- model.fit's callbacks -------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        if self._tracker._closed:
            self._log("this GpuidleCallback already closed with the fit it timed: give each fit its own")
            return
        model = self.model
        k = getattr(model, "steps_per_execution", 1)
        function = getattr(model, "train_function", None)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or not callable(function):
            self._log(f"gpuidle cannot time this fit (steps_per_execution={k!r}, train function {function!r}); "
                      "the fit runs untimed")
            return
        _close_stale_fits()  # those that raised since this callback was made
        while hasattr(function, WRAPPED):  # and never reached on_train_end to unwrap the model's train function
            function = getattr(function, WRAPPED)
        if k > 1:
            self._tracker.note(EXECUTION_NOTE.format(k=k))
        self._original = function
        model.train_function = self._timed(function)
        _FITTING.add(self._tracker)
        self._loop_thread = threading.get_ident()
        self._tracker.report_completions(self._hears_logs)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._new_pass = True  # what ran between epochs (evaluation) is no step's idle

    def _logs_read(self, batch: int, logs: Any = None) -> None:
        """Keras read a step's logs from the device: on a thread of its own, the oldest step not yet stamped is
        complete by now; on the loop's (a callback that reads the logs per batch is not ``async_safe``), the
        watcher thread times the steps."""
        if self._loop_thread is None:
            return
        with contextlib.suppress(Exception):  # on Keras's thread, whose errors would stop the fit
            if threading.get_ident() == self._loop_thread:
                self._loop_thread = None
                self._tracker.report_completions(False)
            else:
                self._tracker.completed()

    def on_train_end(self, logs: Any = None) -> None:
        if self._original is None:
            return
        self.model.train_function = self._original
        self._original = None
        _FITTING.discard(self._tracker)
        self.close()

    def close(self) -> AnalysisReport | None:
        """Write the logs and (rank 0) the summary; called by ``on_train_end``."""
        return self._tracker.close()

    def _timed(self, function: Callable[..., Any]) -> Callable[..., Any]:
        tracker = self._tracker

        def train_function(state: Any, iterator: Iterator[Any]) -> Any:
            if tracker._closed:
                return function(state, iterator)
            feed = _TimedFeed(tracker, iterator, self._new_pass)
            self._new_pass = False
            try:
                out = function(state, feed)
            finally:
                feed.end_dispatch()
            logs = out[0] if isinstance(out, tuple) else out
            tracker.step(logs)
            return out

        setattr(train_function, WRAPPED, function)
        return train_function
