"""A small Keras ``model.fit`` on the JAX backend under ``gpuidle.keras.GpuidleCallback``, run as a script by the tests.

    python tests/keras_jax_fit.py OUT_DIR MODE [STEPS]     # MODE: data, fast, k4, slow, synced
``data``: the input generator sleeps DATA_DELAY_S before each batch; ``fast``: it does not (the data fix's
after-state); ``k4``: a sleep of K4_DELAY_S with ``steps_per_execution=4``; ``slow``: a rank whose data is slower still;
``synced``: ``data`` with a callback that reads every batch's loss and is not ``async_safe``, so Keras reads the
logs on the loop's thread.
Rank and world size come from GPUIDLE_RANK / GPUIDLE_WORLD_SIZE (independent processes writing their rank logs
to one folder). Prints one JSON line: what the fit did, timed by itself (``period_s``: the second epoch's time per
train call, until Keras has its logs from the device; ``compute_s``: the median of one train step run
synchronously after the same sleep, the device's time per step at most, measured beforehand).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ["KERAS_BACKEND"] = "jax"

import keras
import numpy as np

from gpuidle.keras import GpuidleCallback
from gpuidle.live.tracker.keras_jax import keras_reads_logs_apart

DATA_DELAY_S = 0.02
K4_DELAY_S = 0.04
"""Four batches' compute run in each call: on a busy machine they fill most of a 20 ms sleep, and the wait the
device shows would shrink below what a fix is drawn for."""
SLOW_DELAY_S = 0.05
BATCH, DIM = 256, 512


class Epochs(keras.callbacks.Callback):  # type: ignore[misc]
    """The fit's own clock: each epoch from its start to its end, when Keras has read the epoch's logs from the
    device (it reads no batch's logs, so Keras's dispatch stays asynchronous)."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[float] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.spans.append(time.perf_counter() - self._t0)


class Losses(keras.callbacks.Callback):  # type: ignore[misc]
    """Reads every batch's loss, not marked ``async_safe``: Keras then reads each step's logs on the loop's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.losses.append(float(logs["loss"]))


def batches(delay: float, x: np.ndarray, y: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    while True:
        if delay:
            time.sleep(delay)
        yield x, y


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    rank, world = int(os.environ.get("GPUIDLE_RANK", "0")), int(os.environ.get("GPUIDLE_WORLD_SIZE", "1"))
    delay = {"data": DATA_DELAY_S, "k4": K4_DELAY_S, "synced": DATA_DELAY_S, "slow": SLOW_DELAY_S}.get(mode, 0.0)
    x = np.random.default_rng(0).random((BATCH, DIM), dtype=np.float32)
    y = x[:, :1]
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(DIM, activation="relu"),
                              keras.layers.Dense(DIM, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=4 if mode == "k4" else 1)
    times = []
    for _ in range(12):  # the reference: one step, synchronously, after the same wait for data
        time.sleep(delay)
        t0 = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - t0)
    callback = GpuidleCallback(out, rank=rank, world_size=world, every=20, ledger=False, log=lambda line: None)
    epochs = Epochs()
    losses = [Losses()] if mode == "synced" else []
    model.fit(batches(delay, x, y), steps_per_epoch=steps, epochs=2, callbacks=[callback, epochs, *losses], verbose=0)
    calls = -(-steps // (4 if mode == "k4" else 1))
    # who stamped the steps' completions: Keras's own thread, where it read the logs, or the tracker's watcher
    stamped_by = "watcher" if callback._tracker._watching else "keras"
    print(json.dumps({"period_s": epochs.spans[-1] / calls, "compute_s": float(np.median(times[2:])),
                      "calls": 2 * calls, "tracked": callback.steps_done, "stamped_by": stamped_by,
                      "keras_reads_apart": keras_reads_logs_apart()}))


if __name__ == "__main__":
    main()
