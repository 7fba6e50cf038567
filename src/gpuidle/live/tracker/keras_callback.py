"""The step tracker for Keras 3 on TensorFlow: a ``model.fit`` callback (usage: ``gpuidle.keras``).

Inside ``fit`` the batch is fetched inside the compiled train function, so the time between
two batch callbacks holds both the wait for data and the compute. The split is measured in
the pipeline itself: :meth:`GpuidleCallback.dataset` appends one ``map`` to the ``tf.data``
pipeline whose only work is a few graph ops (:class:`Arrivals`): ``tf.timestamp()`` written into
a ring of stamps held in a ``tf.Variable``, run inline on the thread that makes the batch. No
Python runs per batch (a ``tf.py_function`` stamp cost a trip through the interpreter and its
lock for every batch). The stamp marks when each batch is ready at the end of the pipeline:
tf.data runs a final synchronous ``map`` inside the prefetch it injects after it, so a batch that
is ready before its train call asks for it is stamped early and waited for not at all. A train
call that began at ``t0`` and ended at ``t1`` with its batch arriving at ``a`` waited
``max(0, a - t0)`` for data and computed the rest. The callbacks only read the clock; every
``every`` calls one read of the ring brings the new stamps and the calls so far become steps. The
stamps (epoch seconds, to a fraction of a µs) go onto the tracker's clock through the offset
between the two clocks, read then.

Stamps from before ``on_train_begin`` are not this fit's: under a distribution strategy Keras
draws batches from a first iterator to build the model, and they would otherwise shift every
arrival after them.

With ``steps_per_execution = k`` one train call runs ``k`` batches and the callbacks see only
its ends: one step of the log is one call (``batches = k``). Its batches' arrivals are known;
each batch is taken to compute for the same time ``c``, the one that makes the call end at
``t1`` when batch ``j`` starts at the later of its arrival and batch ``j - 1``'s end; the call's
data wait is the rest (:func:`split_execution`). That ``c`` is the most the batches can take: where
the data is late, it is the last batch's time from its arrival stamp to the call's end, which also
holds the batch's way into the train function and the call's closing work, counted ``k`` times.
The wait is therefore a lower bound (some 11 points low at ``k = 4`` on a 2-core CPU), and the
note says so.

The host clock brackets the train call: Keras reads the call's logs to the host before it calls
the batch-end callbacks, so on a GPU the call ends once the step's work has run, and this is the
device's time up to the host's overhead; the report says host-timed.
Ranks come from ``TF_CONFIG`` (the multi-worker strategies' cluster): each worker writes its
log, and ``gpuidle analyze <out_dir>`` merges them into the job view.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from gpuidle.errors import GpuidleError

from .base import TrackerBase

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport

PHASE = "train_step"
NO_DATASET_NOTE = ("data wait not measured: fit was not given callback.dataset(ds), so the whole train call "
                   "counts as compute")
EXECUTION_NOTE = ("steps_per_execution={k}: a step here is one train call of up to {k} batches; each of its batches "
                  "is taken to compute as long as the last one took from its arrival to the call's end (the call's "
                  "closing work included): the data share is a lower bound")
RING = 4096  # arrival stamps held: the callback reads them every `every` calls and every RING // 2 batches


def split_execution(begin: int, end: int, arrivals: Sequence[int]) -> tuple[int, int]:
    """``(data wait, compute)`` of one train call from ``begin`` to ``end`` whose batches arrived at ``arrivals``.

    Batch ``j`` (of ``k``) starts at the later of its arrival and the previous batch's end, and every
    batch computes for the same ``c``: the ``c`` with the last batch ending at ``end``. Unrolled, the
    last batch ends at ``max(begin + k c, max_j(a_j + (k - j) c))`` (``j`` from 0), a maximum of lines
    rising in ``c``; it reaches ``end`` where the first of them does, so ``c`` is the least of
    ``(end - begin) / k`` and ``(end - a_j) / (k - j)``. The wait is the call's time less ``k c``.
    """
    span = max(0, end - begin)
    k = len(arrivals)
    if not k:
        return 0, span
    c = min(span / k, *((end - a) / (k - j) for j, a in enumerate(arrivals)))
    compute = min(span, max(0, round(k * c)))
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
    """One clear error at construction: Keras 3 on the TensorFlow backend is what this callback reads (on JAX,
    ``gpuidle.keras`` gives the other one)."""
    major = int(keras.__version__.split(".")[0])
    if major < 3:
        raise GpuidleError(f"gpuidle.keras needs Keras 3, not {keras.__version__}", "pip install -U keras")
    backend = keras.backend.backend()
    if backend == "jax":
        raise GpuidleError("this callback times Keras on the TensorFlow backend, not 'jax'",
                           "import GpuidleCallback from gpuidle.keras: it gives the callback of the backend in use")
    if backend != "tensorflow":
        raise GpuidleError(f"gpuidle.keras times Keras on the TensorFlow or JAX backend, not {backend!r}",
                           "set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax")


class Arrivals:
    """Arrival stamps of batches: written by graph ops inside the ``tf.data`` pipeline, read in blocks.

    One float64 ``tf.Variable`` of ``capacity + 1`` on the CPU: slots ``[0, capacity)`` are a ring of
    ``tf.timestamp()`` seconds, the last slot counts the stamps ever written (exact to 2**53). One
    variable, so that one read sees the stamps and their count together.
    """

    def __init__(self, capacity: int = RING) -> None:
        self.capacity = capacity
        self.taken = 0
        """Stamps read so far: the next one to read is stamp ``taken``, in slot ``taken % capacity``."""
        # made on a fresh thread, outside the caller's distribution-strategy scope (its mirrored
        # variables cannot be written from tf.data) and device scope (tf.data runs on the CPU)
        with ThreadPoolExecutor(max_workers=1) as pool:
            self.ring = pool.submit(self._make, capacity).result()
        self.ring.numpy()  # the first read sets up its kernel (ms): here, not in the middle of the fit

    @staticmethod
    def _make(capacity: int) -> Any:
        import tensorflow as tf

        with tf.device("/CPU:0"):
            return tf.Variable(tf.zeros([capacity + 1], tf.float64), trainable=False, name="gpuidle_arrivals")

    def stamp(self, *element: Any) -> Any:
        """The ``map`` function: the element unchanged, once its arrival is written into the ring."""
        import tensorflow as tf

        count = self.ring[self.capacity]
        slot = tf.cast(tf.math.floormod(count, self.capacity), tf.int32)
        written = self.ring.scatter_nd_update(tf.stack([slot, self.capacity])[:, None],
                                              tf.stack([tf.timestamp(), count + 1]))
        with tf.control_dependencies([written]):
            out = tf.nest.map_structure(tf.identity, element)
        return out[0] if len(element) == 1 else out

    def apply(self, ds: Any) -> Any:
        """``ds`` mapped by :meth:`stamp`, its ops run inline on the thread that makes the batch.

        tf.data's public ``map`` runs a function's ops on TensorFlow's inter-op thread pool: a hop to
        another thread and back per batch, which on a 2-core machine cost about 3 times the ops (about
        50 µs against 15 µs per batch, beside a 0.3 ms train step). The map dataset's own
        ``use_inter_op_parallelism=False`` avoids it; it is not public, so where it is missing or
        changed the public ``map`` does the same work.
        """
        try:
            from tensorflow.python.data.ops.map_op import _MapDataset

            return _MapDataset(ds, self.stamp, force_synchronous=True, use_inter_op_parallelism=False,
                               preserve_cardinality=True)
        except (ImportError, TypeError):
            return ds.map(self.stamp, synchronous=True)

    def take(self) -> np.ndarray:
        """The stamps (seconds since the epoch) written since the last ``take``, oldest first."""
        values = self.ring.numpy()  # one op: each op in the middle of a fit costs ~0.1 ms on a busy CPU
        count = int(values[self.capacity])
        if count - self.taken > self.capacity:
            raise GpuidleError(f"{count - self.taken - self.capacity} batch arrivals were overwritten before they "
                               f"were read (the ring holds {self.capacity})",
                               "use a steps_per_execution below half of that")
        stamps: np.ndarray = values[np.arange(self.taken, count) % self.capacity]
        self.taken = count
        return stamps


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
        self._stamps: Arrivals | None = None
        self._queue: list[int] = []  # arrivals read from the ring, not yet matched to a train call
        self._calls: list[tuple[int, int, int]] = []  # (start, begin, end) of train calls not yet made steps
        self._wrapped = False
        self._fitting = False
        self._off = False
        self._fit_begin = 0
        self._begin: int | None = None
        self._prev_end: int | None = None
        self._per_call = 1
        TrackerBase.__init__(
            self, out_dir, framework="tensorflow", timing="host", rank=rank, world_size=world_size, gather=None,
            hosts=None, phases=[PHASE], compute_phases=[PHASE], copy_phase="", every=every, log_every=log_every,
            notes=[], clock=clock, log=log, summary_steps=summary_steps, label=label, ledger=ledger,
            prometheus_port=prometheus_port, prometheus_addr=prometheus_addr,
        )

    @property
    def steps_done(self) -> int:
        """Train calls ended, with those kept until the next read of the ring makes them steps."""
        return self._step + len(self._calls)

    def dataset(self, ds: Any) -> Any:
        """``ds`` (the training data, once) with one pass-through ``map`` that stamps each batch's arrival.

        The ``map`` is a few graph ops (:meth:`Arrivals.stamp`), kept synchronous (never run in
        parallel, out of order). If it cannot be added, ``ds`` comes back as it was and the fit's data
        wait is not measured.
        """
        try:
            if self._stamps is None:
                self._stamps = Arrivals()
            stamped = self._stamps.apply(ds)
        except Exception as err:  # the fit goes on, unmeasured
            self._log(f"gpuidle cannot stamp this dataset's batches ({type(err).__name__}: {err}); "
                      "the fit runs on the dataset as given")
            return ds
        self._wrapped = True
        return stamped

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
            self.note(EXECUTION_NOTE.format(k=k))
        if not self._wrapped:
            self.unmeasured("data_loading", NO_DATASET_NOTE)
        self._fit_begin = self._clock()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._prev_end = None  # a new pass: what ran between epochs (evaluation) is no step's time

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if not self._off:
            self._begin = self._clock()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._off:
            return
        end = self._clock()
        try:
            self._end_call(end)
        except Exception as err:  # never break the fit
            self._fail(err)

    def on_train_end(self, logs: Any = None) -> None:
        if self._fitting:
            self.close()

    # -- the steps -------------------------------------------------------------------

    def _end_call(self, end: int) -> None:
        """Keep the call's times; every ``every`` calls (and before the ring can fill), make them steps."""
        if not self._fitting or self._begin is None:
            raise GpuidleError("batch callbacks outside model.fit", "pass the callback to model.fit(callbacks=[...])")
        begin = self._begin
        self._calls.append((self._prev_end if self._prev_end is not None else begin, begin, end))
        self._prev_end, self._begin = end, None
        if (self._step + len(self._calls)) % self._every == 0 or len(self._calls) * self._per_call >= RING // 2:
            self._record()

    def _read_arrivals(self) -> None:
        """Queue the ring's new stamps on the tracker's clock, less those from before this fit."""
        if self._stamps is None:
            return
        stamps = self._stamps.take()
        now, now_s = self._clock(), time.time()  # tf.timestamp() reads the clock time.time() reads
        arrivals = np.rint((stamps - now_s) * 1e9).astype(np.int64) + now
        self._queue.extend(int(a) for a in arrivals if a >= self._fit_begin)

    def _record(self) -> None:
        """The kept calls as steps: each takes the next of its up to ``k`` arrivals that came before its end."""
        self._read_arrivals()
        queue, used, k = self._queue, 0, self._per_call
        layout = self._rows_layout
        for start, begin, end in self._calls:
            last = used
            while last < len(queue) and last - used < k and queue[last] <= end:
                last += 1
            arrivals, used = queue[used:last], last
            wait, compute = split_execution(begin, end, arrivals)
            row = [0.0] * layout.width
            row[0], row[1], row[2], row[3] = self._step, start - self._t0, end - start, wait
            row[layout.host_col[PHASE]] = compute
            row[layout.tail[5]] = len(arrivals) or 1
            self._rows.append(row)
            self._step += 1
        del queue[:used]
        self._calls.clear()
        if self._step - self._sent >= self._every:
            self._exchange(final=False, count=self._step - self._sent)

    def _fail(self, err: Exception) -> None:
        self._off = True
        self._calls.clear()
        self._log(f"the Keras step tracker stopped at step {self._step} ({type(err).__name__}: {err}); "
                  "training goes on, the steps recorded so far are kept")

    def close(self) -> AnalysisReport | None:
        """Make steps of the calls kept, write the logs and (rank 0) the summary; called by ``on_train_end``."""
        if self._closed:
            return self.report
        if self._calls and not self._off:
            try:
                self._record()
            except Exception as err:  # the end of the fit is no place to raise
                self._fail(err)
        self._closed = True
        return self._conclude([])
