"""Cost of the JAX and Keras step trackers: the same loop with and without them, interleaved A/B (target ≤ 0.5 %).

    python bench/tracker_overhead_frameworks.py                     # JAX, then Keras
    python bench/tracker_overhead_frameworks.py --only jax --rounds 20 --block 30
    python bench/tracker_overhead_frameworks.py --only jax --dim 4096               # on a GPU
    python bench/tracker_overhead_frameworks.py --only keras --dim 8192 --block 60  # steps of ~10 ms

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
summary at the end), whose difference shrinks as ``--block`` grows.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable

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


def jax_arms(block: int, out: str, dim: int) -> dict[str, Callable[[], float]]:
    import jax
    import jax.numpy as jnp

    from gpuidle.jax import StepTracker

    @jax.jit
    def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = x
        for _ in range(4):
            h = jnp.tanh(h @ w)
        return w - 1e-4 * h.mean(), h.sum()

    state = {"w": jnp.full((dim, dim), 0.01)}
    x = jnp.ones((dim // 2, dim))
    state["w"], loss = step(state["w"], x)
    loss.block_until_ready()
    tracker = StepTracker(out, every=50, log_every=None, ledger=False)

    def plain() -> float:
        w, t0 = state["w"], time.perf_counter()
        for batch in (x for _ in range(block)):
            w, loss = step(w, batch)
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


def keras_arms(block: int, out: str, dim: int) -> tuple[dict[str, Callable[[], float]], dict[str, list[float]]]:
    """The arms (each returns its per-step time between the first and last train call) and their whole-fit times."""
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
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(dim, activation="relu"), keras.layers.Dense(1)])
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["jax", "keras"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=40)
    p.add_argument("--dim", type=int, default=512,
                   help="the model's width (JAX: 4096 gives ms-long steps on a GPU; Keras: 8192, ~10 ms CPU steps)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        if args.only in (None, "jax"):
            report("jax", ab(jax_arms(args.block, os.path.join(out, "jax"), args.dim), args.rounds))
        if args.only in (None, "keras"):
            arms, fits = keras_arms(args.block, os.path.join(out, "keras"), args.dim)
            report("keras per step", ab(arms, args.rounds))
            report("keras whole fit", fits)


if __name__ == "__main__":
    main()
