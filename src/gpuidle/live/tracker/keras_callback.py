"""The step tracker for Keras 3 on TensorFlow: a ``model.fit`` callback (usage: ``gpuidle.keras``).

Inside ``fit`` the batch is fetched inside the compiled train function, so the time between
two batch callbacks holds both the wait for data and the compute. The split is measured in
the pipeline itself: :meth:`GpuidleCallback.dataset` appends one ``map`` to the ``tf.data``
pipeline (it stays in the graph) whose only work is a ``tf.py_function`` that stamps the host
clock when each batch *arrives* at the end of the pipeline, before the train step gets it. A
train call that began at ``t0`` and ended at ``t1`` with its batch arriving at ``a`` waited
``max(0, a - t0)`` for data and computed the rest: exact to the stamp's cost (tens of µs).

With ``steps_per_execution = k`` one train call runs ``k`` batches and the callbacks see only
its ends: one step of the log is one call (``batches = k``). Its batches' arrivals are known;
each batch is taken to compute for the same time ``c``, the one that makes the call end at
``t1`` when batch ``j`` starts at the later of its arrival and batch ``j - 1``'s end; the call's
data wait is the rest (:func:`split_execution`). A note says so.

The host clock brackets the train call: on a GPU, TensorFlow returns once the step's work has
run, so this is the device's time up to the host's overhead; the report says host-timed.
Ranks come from ``TF_CONFIG`` (the multi-worker strategies' cluster): each worker writes its
log, and ``gpuidle analyze <out_dir>`` merges them into the job view.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import keras

from gpuidle.errors import GpuidleError

from .base import TrackerBase

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport

PHASE = "train_step"
NO_DATASET_NOTE = ("data wait not measured: fit was not given callback.dataset(ds), so the whole train call "
                   "counts as compute")
EXECUTION_NOTE = ("steps_per_execution={k}: a step here is one train call of up to {k} batches; its data wait "
                  "assumes each of its batches computes for the same time")


def split_execution(begin: int, end: int, arrivals: Sequence[int]) -> tuple[int, int]:
    """``(data wait, compute)`` of one train call from ``begin`` to ``end`` whose batches arrived at ``arrivals``.

    Batch ``j`` starts at the later of its arrival and the previous batch's end, and every batch
    computes for the same ``c``: the ``c`` with the last batch ending at ``end`` (found by bisection;
    the end is increasing in ``c``). The wait is the call's time less ``len(arrivals) * c``.
    """
    span = max(0, end - begin)
    if not arrivals:
        return 0, span

    def finish(c: float) -> float:
        t = float(begin)
        for a in arrivals:
            t = max(t, a) + c
        return t

    lo, hi = 0.0, span / len(arrivals)
    if finish(lo) >= end:
        return span, 0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if finish(mid) < end else (lo, mid)
    compute = min(span, round(len(arrivals) * (lo + hi) / 2))
    return span - compute, compute


def tf_config_rank() -> tuple[int, int]:
    """``(rank, world size)`` of this worker from ``TF_CONFIG``: the chief first, then the workers; (0, 1) without."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 0, 1
    try:
        config = json.loads(raw)
        cluster, task = config.get("cluster", {}), config.get("task", {})
        order = [*(("chief", i) for i in range(len(cluster.get("chief", [])))),
                 *(("worker", i) for i in range(len(cluster.get("worker", []))))]
        me = (task.get("type"), int(task.get("index", 0)))
        if me not in order:
            return 0, max(1, len(order))
        return order.index(me), len(order)
    except (ValueError, TypeError, AttributeError) as err:
        raise GpuidleError(f"TF_CONFIG is not a cluster description: {err}",
                           "give rank= and world_size=, or fix TF_CONFIG") from None


def check_keras() -> None:
    """One clear error at construction: Keras 3 on the TensorFlow backend is what this callback reads."""
    major = int(keras.__version__.split(".")[0])
    if major < 3:
        raise GpuidleError(f"gpuidle.keras needs Keras 3, not {keras.__version__}", "pip install -U keras")
    if keras.backend.backend() != "tensorflow":
        raise GpuidleError(f"gpuidle.keras times Keras on the TensorFlow backend, not {keras.backend.backend()!r}",
                           "set KERAS_BACKEND=tensorflow (for JAX use gpuidle.jax in a custom loop)")


class GpuidleCallback(keras.callbacks.Callback, TrackerBase):
    """``model.fit(callback.dataset(ds), callbacks=[callback])``: every train call's data wait and compute.

    :param out_dir: folder for ``rank-<r>.jsonl`` and, from rank 0, the job summary.
    :param rank: this worker's rank (default: from ``TF_CONFIG``); with ``world_size``.
    Other parameters as for the PyTorch tracker (``gpuidle.torch.StepTracker``).
    """

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
        check_keras()
        keras.callbacks.Callback.__init__(self)
        if rank is None or world_size is None:
            r, w = tf_config_rank()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        self._arrivals: list[int] = []
        self._used = 0
        self._wrapped = False
        self._fitting = False
        self._off = False
        self._begin: int | None = None
        self._prev_end: int | None = None
        self._per_call = 1
        TrackerBase.__init__(
            self, out_dir, framework="tensorflow", timing="host", rank=rank, world_size=world_size, gather=None,
            hosts=None, phases=[PHASE], compute_phases=[PHASE], copy_phase="", every=every, log_every=log_every,
            notes=[], clock=clock, log=log, summary_steps=summary_steps, label=label, ledger=ledger,
            prometheus_port=prometheus_port, prometheus_addr=prometheus_addr,
        )

    def dataset(self, ds: Any) -> Any:
        """``ds`` with one pass-through ``map`` that stamps each batch's arrival (the pipeline stays in the graph)."""
        import tensorflow as tf

        arrivals, clock = self._arrivals, self._clock

        def arrived() -> int:
            arrivals.append(clock())
            return 0

        def mark(*element: Any) -> Any:
            stamp = tf.py_function(arrived, [], tf.int64)
            with tf.control_dependencies([stamp]):
                out = tf.nest.map_structure(tf.identity, element)
            return out[0] if len(element) == 1 else out

        self._wrapped = True
        return ds.map(mark)

    # -- model.fit's callbacks -------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        if self._closed:
            self._log("this GpuidleCallback already closed with the fit it timed: give each fit its own")
            self._off = True
            return
        k = getattr(self.model, "steps_per_execution", 1)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            self._log(f"steps_per_execution={k!r} is not a whole number of steps: gpuidle timing is off for this fit")
            self._off = True
            return
        self._per_call, self._fitting = k, True
        if k > 1:
            self._notes.append(EXECUTION_NOTE.format(k=k))
        if not self._wrapped:
            self._notes.append(NO_DATASET_NOTE)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._prev_end = None  # a new pass: what ran between epochs (evaluation) is no step's time

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if not self._off:
            self._begin = self._clock()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._off:
            return
        try:
            self._end_call(self._clock())
        except Exception as err:  # never break the fit
            self._fail(err)

    def on_train_end(self, logs: Any = None) -> None:
        if self._fitting:
            self.close()

    # -- the steps -------------------------------------------------------------------

    def _end_call(self, end: int) -> None:
        if not self._fitting or self._begin is None:
            raise GpuidleError("batch callbacks outside model.fit", "pass the callback to model.fit(callbacks=[...])")
        begin, k = self._begin, self._per_call
        arrivals = [a for a in self._arrivals[self._used:self._used + k] if a <= end]
        self._used += len(arrivals)
        if self._used > 4096:  # keep the list short: drop what was read
            del self._arrivals[:self._used]
            self._used = 0
        wait, compute = split_execution(begin, end, arrivals)
        start = self._prev_end if self._prev_end is not None else begin
        layout = self._rows_layout
        row = [0.0] * layout.width
        row[0], row[1], row[2], row[3] = self._step, start - self._t0, end - start, wait
        row[layout.host_col[PHASE]] = compute
        batches = len(arrivals) or 1
        row[layout.tail[5]] = batches
        self._rows.append(row)
        self._prev_end = end
        self._begin = None
        self._step += 1
        if self._step % self._every == 0:
            self._exchange(final=False, count=self._step - self._sent)

    def _fail(self, err: Exception) -> None:
        self._off = True
        self._log(f"the Keras step tracker stopped at step {self._step} ({type(err).__name__}: {err}); "
                  "training goes on, the steps so far are kept")

    def close(self) -> AnalysisReport | None:
        """Write the logs and (rank 0) the summary; called by ``on_train_end``."""
        if self._closed:
            return self.report
        self._closed = True
        return self._conclude([])
