"""Cost of the JAX and Keras step trackers: the same loop with and without them, interleaved A/B (target ≤ 0.5 %).

    python bench/tracker_overhead_frameworks.py                     # JAX, then Keras
    python bench/tracker_overhead_frameworks.py --only jax --rounds 20 --block 30
    python bench/tracker_overhead_frameworks.py --only jax --dim 4096               # on a GPU

Arms: A and A' (plain, identical: their difference is the noise floor) and B (tracked), run in
blocks of ``--block`` steps rotating A A' B, B A' A, … in one process on the same model and
data. Printed per framework: the median step time of each arm, B against A and A' against A as
the mean of the per-round differences with a 95 % interval, side by side. JAX: a jitted MLP step
on CPU; B adds ``tracker.loader``, ``tracker.phase``, ``tracker.step(loss)`` and the sync watch.
Keras: ``model.fit`` on a cached ``tf.data`` pipeline; B adds the callback and ``callback.dataset``.
"""

from __future__ import annotations

import argparse
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


def ab(arms: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Step times per arm, rounds rotating the order so drift hits every arm alike."""
    names = list(arms)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
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


def keras_arms(block: int, out: str) -> dict[str, Callable[[], float]]:
    import keras
    import numpy as np
    import tensorflow as tf

    from gpuidle.keras import GpuidleCallback

    xs = np.random.default_rng(0).random((128 * block, 64), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((xs, xs[:, :1])).batch(128).cache()
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(ds, epochs=1, verbose=0)

    def plain() -> float:
        t0 = time.perf_counter()
        model.fit(ds, epochs=1, verbose=0)
        return (time.perf_counter() - t0) / block

    def tracked() -> float:
        cb = GpuidleCallback(out, log_every=None, ledger=False, log=lambda line: None)
        t0 = time.perf_counter()
        model.fit(cb.dataset(ds), epochs=1, verbose=0, callbacks=[cb])
        return (time.perf_counter() - t0) / block

    return {"A": plain, "A'": plain, "B": tracked}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["jax", "keras"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=40)
    p.add_argument("--dim", type=int, default=512, help="JAX: the model's width (4096 gives ms-long steps on a GPU)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        if args.only in (None, "jax"):
            report("jax", ab(jax_arms(args.block, os.path.join(out, "jax"), args.dim), args.rounds))
        if args.only in (None, "keras"):
            report("keras", ab(keras_arms(args.block, os.path.join(out, "keras")), args.rounds))


if __name__ == "__main__":
    main()
