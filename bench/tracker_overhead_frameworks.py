"""Cost of the JAX and Keras step trackers: the same loop with and without them, interleaved A/B (target ≤ 0.5 %).

    python bench/tracker_overhead_frameworks.py                     # JAX, then Keras
    python bench/tracker_overhead_frameworks.py --only jax --rounds 20 --block 30
    python bench/tracker_overhead_frameworks.py --only jax --dim 4096               # on a GPU
    python bench/tracker_overhead_frameworks.py --only jax --dim 64 --wait-ms 10    # a GPU-like 10 ms on the CPU
    python bench/tracker_overhead_frameworks.py --only keras --dim 8192 --block 60  # steps of ~10 ms
    python bench/tracker_overhead_frameworks.py --only keras --dim 64 --wait-ms 10     # a GPU-like 10 ms wait a step
    python bench/tracker_overhead_frameworks.py --only keras-jax --dim 64 --wait-ms 10 # Keras on its JAX backend
    python bench/tracker_overhead_frameworks.py --only keras-jax --dim 64 --wait-ms 10 --held

Arms: A and A' (plain, identical: their difference is the noise floor) and B (tracked), run in
blocks of ``--block`` steps, each round in another of the six orders of the arms, in one process on the same model and
data. Printed per framework: the median step time of each arm, B against A and A' against A as
the mean of the per-round differences with a 95 % interval, side by side. JAX: a jitted MLP step
on CPU; B adds ``tracker.loader``, ``tracker.phase``, ``tracker.step(loss)`` and the sync watch.
Keras: ``model.fit`` on a cached ``tf.data`` pipeline; B adds ``callback.dataset`` and the
callback, which reads the arrival stamps and writes its log every ``every`` calls: 50 by default,
here ``min(50, block // 3)`` so that every block holds a few of those reads (from ``--block 150``
on, the default). Keras is timed twice: per step between the ends of the first and the last
train call (what every step pays; a callback records the ends in every arm), and over the whole
``fit`` (adds what a fit pays once: the iterator, the first pass of the stamping ``map``, the
summary at the end), whose difference shrinks as ``--block`` grows. Keras on its JAX backend
(``--only keras-jax``, alone in its process) is timed from the first train call to the epoch's end:
its host dispatches ahead of the device. ``--wait-ms`` adds a fixed wait inside the compiled step (a sleep the CPU
does not spend), as the host waits for a GPU: the tracker's cost against a step of known length
that its own work does not compete with. On JAX (and Keras on JAX) the wait is an XLA call that sleeps
without the interpreter's lock (``device_sleep.py``), so the host dispatches ahead of it as of a GPU; on
Keras's TensorFlow backend it is a ``tf.py_function``, which takes that lock to run.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def interval(diffs: list[float]) -> tuple[float, float]:
    """Mean and 95 % half-width (normal approximation) of per-round relative differences."""
    mean = statistics.fmean(diffs)
    half = 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return mean, half


def median_diff(a: list[float], b: list[float]) -> float:
    return statistics.median((y - x) / x for x, y in zip(a, b, strict=True))


def ab(arms: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Step times per arm, rounds cycling through every order of the arms, so that drift and a slow first or
    last block of a round hit every arm alike (the control A' too)."""
    orders = list(itertools.permutations(arms))
    out: dict[str, list[float]] = {n: [] for n in arms}
    for r in range(rounds):
        for n in orders[r % len(orders)]:
            out[n].append(arms[n]())
    return out


def report(framework: str, times: dict[str, list[float]]) -> None:
    a, a2, b = times["A"], times["A'"], times["B"]
    tracked = interval([(y - x) / x for x, y in zip(a, b, strict=True)])
    control = interval([(y - x) / x for x, y in zip(a, a2, strict=True)])
    print(f"{framework}: step A {statistics.median(a) * 1e3:.3f} ms | A' {statistics.median(a2) * 1e3:.3f} ms | "
          f"B (tracked) {statistics.median(b) * 1e3:.3f} ms")
    print(f"{framework}: tracker B/A {tracked[0] * 100:+.2f} % ± {tracked[1] * 100:.2f} %   "
          f"noise floor A'/A {control[0] * 100:+.2f} % ± {control[1] * 100:.2f} %   (target ≤ 0.5 %)")
    print(f"{framework}: medians of the per-round differences (robust to a hiccup in one block): "
          f"B/A {median_diff(a, b) * 100:+.2f} %   A'/A {median_diff(a, a2) * 100:+.2f} %")


class Hold:
    """The tracker's hold on the host, without the tracker (``--held``): every ``every`` steps, wait for the step
    ``lag`` back (the tracker's exchange waits for the steps its ``resolve_lag`` behind the last)."""

    def __init__(self, every: int, lag: int = 2) -> None:
        self.every, self.lag, self.steps = every, lag, 0
        self.recent: deque[Any] = deque(maxlen=lag + 1)

    def step(self, outputs: Any) -> None:
        import jax

        self.recent.append(outputs)
        self.steps += 1
        if self.steps % self.every == 0 and len(self.recent) > self.lag:
            jax.block_until_ready(self.recent[0])


def jax_arms(block: int, out: str, dim: int, wait_ms: float = 0.0, held: bool = False,
             ) -> dict[str, Callable[[], float]]:
    """``wait_ms``: the step also waits this long on the device (:mod:`device_sleep`: the CPU and the interpreter's
    lock free meanwhile, as for a GPU kernel), after its matmuls. ``held``: the plain arms' host held as the
    tracker's exchange holds it (:class:`Hold`; see :func:`keras_jax_arms`)."""
    import jax
    import jax.numpy as jnp

    from device_sleep import device_wait_fn
    from gpuidle.jax import StepTracker

    device_wait = device_wait_fn() if wait_ms else None

    @jax.jit
    def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = x
        for _ in range(4):
            h = jnp.tanh(h @ w)
        if device_wait is not None:
            h = device_wait(h, wait_ms)
        return w - 1e-4 * h.mean(), h.sum()

    state = {"w": jnp.full((dim, dim), 0.01)}
    x = jnp.ones((dim // 2, dim))
    state["w"], loss = step(state["w"], x)
    loss.block_until_ready()
    every = 50
    tracker = StepTracker(out, every=every, log_every=None, ledger=False)

    def plain() -> float:
        w, t0 = state["w"], time.perf_counter()
        hold = Hold(every) if held else None
        for batch in (x for _ in range(block)):
            w, loss = step(w, batch)
            if hold is not None:
                hold.step(loss)
        loss.block_until_ready()
        state["w"] = w
        return (time.perf_counter() - t0) / block

    def tracked() -> float:
        w, t0 = state["w"], time.perf_counter()
        for batch in tracker.loader(x for _ in range(block)):
            with tracker.phase("train_step"):
                w, loss = step(w, batch)
            tracker.step(loss)
        loss.block_until_ready()
        state["w"] = w
        return (time.perf_counter() - t0) / block

    return {"A": plain, "A'": plain, "B": tracked}


def keras_arms(block: int, out: str, dim: int, wait_ms: float = 0.0,
               ) -> tuple[dict[str, Callable[[], float]], dict[str, list[float]]]:
    """The arms (each returns its per-step time between the first and last train call) and their whole-fit times.

    ``wait_ms``: the step also waits this long inside the compiled train function, as the host waits for a GPU
    (a ``tf.py_function`` that sleeps, the CPU free meanwhile): the tracker's cost against a step of known length
    that its own work does not compete with."""
    import keras
    import numpy as np
    import tensorflow as tf

    from gpuidle.keras import GpuidleCallback

    class Ends(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ends: list[float] = []

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            self.ends.append(time.perf_counter())

    xs = np.random.default_rng(0).random((128 * block, 64), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((xs, xs[:, :1])).batch(128).cache()
    class DeviceWait(keras.layers.Layer):  # type: ignore[misc]
        def call(self, x: tf.Tensor) -> tf.Tensor:
            def wait(t: tf.Tensor) -> tf.Tensor:
                time.sleep(wait_ms / 1e3)
                return t

            y = tf.py_function(wait, [x], tf.float32)
            y.set_shape(x.shape)
            return y

    waits = [DeviceWait()] if wait_ms else []
    model = keras.Sequential([keras.Input((64,)), *waits, keras.layers.Dense(dim, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(ds, epochs=1, verbose=0)
    fits: dict[str, list[float]] = {"A": [], "A'": [], "B": []}

    def timed(arm: str, data: object, tracker: list[keras.callbacks.Callback]) -> float:
        ends = Ends()
        t0 = time.perf_counter()
        model.fit(data, epochs=1, verbose=0, callbacks=[*tracker, ends])
        fits[arm].append((time.perf_counter() - t0) / block)
        return (ends.ends[-1] - ends.ends[0]) / (len(ends.ends) - 1)

    def tracked() -> float:
        cb = GpuidleCallback(out, every=min(50, max(1, block // 3)), log_every=None, ledger=False,
                             log=lambda line: None)
        return timed("B", cb.dataset(ds), [cb])

    return {"A": lambda: timed("A", ds, []), "A'": lambda: timed("A'", ds, []), "B": tracked}, fits


def keras_jax_arms(block: int, out: str, dim: int, wait_ms: float = 0.0,
                   held: bool = False) -> dict[str, Callable[[], float]]:
    """Keras on the JAX backend (this process's Keras must be on it): each arm one ``fit`` of ``block`` steps on
    arrays in memory, timed from its first train call to the epoch's end, when Keras has read the last logs (the
    host dispatches ahead of the device: the time between two calls is not the step's). ``wait_ms``: a wait on the
    device inside the jitted step (:mod:`device_sleep`), as a GPU kernel of known length. ``held``: the plain arms'
    host is held as close to the device as the tracker's exchange holds it (every ``every`` calls it waits for the
    step two calls back), so that B against A is the tracker's cost alone, not that of a host queueing the whole
    epoch ahead."""
    import jax
    import keras
    import numpy as np

    from device_sleep import device_wait_fn
    from gpuidle.keras import GpuidleCallback

    device_wait = device_wait_fn() if wait_ms else None

    class DeviceWait(keras.layers.Layer):  # type: ignore[misc]
        def call(self, x: jax.Array) -> jax.Array:
            assert device_wait is not None
            return device_wait(x, wait_ms)

    xs = np.random.default_rng(0).random((128 * block, 64), dtype=np.float32)
    waits = [DeviceWait()] if wait_ms else []
    model = keras.Sequential([keras.Input((64,)), *waits, keras.layers.Dense(dim, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(xs, xs[:, :1], batch_size=128, epochs=1, verbose=0)

    class Span(keras.callbacks.Callback):  # type: ignore[misc]
        """From the first train call to the epoch's end, when Keras has the last logs (no batch-end hook: Keras's
        dispatch of batch callbacks stays as it is)."""

        def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
            if batch == 0:
                self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            self.t1 = time.perf_counter()

    every = min(50, max(1, block // 3))

    class Held(keras.callbacks.Callback):  # type: ignore[misc]
        """The fit's train calls held as the tracker's exchange holds them (:class:`Hold`, on each call's logs)."""

        def on_train_begin(self, logs: object = None) -> None:
            function, hold = self.model.train_function, Hold(every)

            def train_function(state: object, iterator: object) -> object:
                out = function(state, iterator)
                hold.step(out[0])
                return out

            self.function, self.model.train_function = function, train_function

        def on_train_end(self, logs: object = None) -> None:
            self.model.train_function = self.function

    def timed(callbacks: list[keras.callbacks.Callback]) -> float:
        span = Span()
        model.fit(xs, xs[:, :1], batch_size=128, epochs=1, verbose=0, shuffle=False, callbacks=[*callbacks, span])
        return (span.t1 - span.t0) / block

    def tracked() -> float:
        return timed([GpuidleCallback(out, every=every, log_every=None, ledger=False, log=lambda line: None)])

    def plain() -> float:
        return timed([Held()] if held else [])

    return {"A": plain, "A'": plain, "B": tracked}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["jax", "keras", "keras-jax"],
                   help="keras-jax: Keras on its JAX backend (run alone: Keras takes one backend per process)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=40)
    p.add_argument("--dim", type=int, default=512,
                   help="the model's width (JAX: 4096 gives ms-long steps on a GPU; Keras: 8192, ~10 ms CPU steps)")
    p.add_argument("--switch-interval", type=float, default=None, metavar="S",
                   help="the interpreter's switch interval (sys.setswitchinterval; 0.005 by default): keras's "
                        "--wait-ms (a tf.py_function) needs the interpreter lock, which a busy loop holds up to this "
                        "long")
    p.add_argument("--held", action="store_true",
                   help="jax, keras-jax: the plain arms' host held as close to the device as the tracker's exchange "
                        "holds it (every `every` steps, a wait for the step two back)")
    p.add_argument("--wait-ms", type=float, default=0.0,
                   help="each step also waits this long inside its compiled function, the CPU free (as for a GPU)")
    args = p.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.only == "keras-jax":
        os.environ["KERAS_BACKEND"] = "jax"
    with tempfile.TemporaryDirectory() as out:
        if args.only in (None, "jax"):
            report("jax", ab(jax_arms(args.block, os.path.join(out, "jax"), args.dim, args.wait_ms, args.held),
                             args.rounds))
        if args.only in (None, "keras"):
            arms, fits = keras_arms(args.block, os.path.join(out, "keras"), args.dim, args.wait_ms)
            report("keras per step", ab(arms, args.rounds))
            report("keras whole fit", fits)
        if args.only == "keras-jax":
            report("keras on jax, per step", ab(keras_jax_arms(args.block, os.path.join(out, "keras_jax"), args.dim,
                                                                args.wait_ms, args.held), args.rounds))


if __name__ == "__main__":
    main()
