"""The Keras callback on real TensorFlow (CPU), in one process: a tf.data map that sleeps is data loading, within
5 points of the truth (one batch per call), with a tf.data fix first; steps_per_execution > 1 keeps the split;
bad input is one line."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from gpuidle.errors import GpuidleError  # noqa: E402
from gpuidle.live.tracker.keras_callback import split_execution, tf_config_rank  # noqa: E402

SLEEP_S = 0.02
BATCHES = 30


class Periods(keras.callbacks.Callback):  # type: ignore[misc]
    """The truth's clock: when each train call ends, seen from a callback of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.ends.append(time.perf_counter())


def data(sleep: float) -> Any:
    xs = np.random.default_rng(0).random((64 * BATCHES, 32), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((xs, xs[:, :1])).batch(64)
    if not sleep:
        return ds.cache()

    def slow(x: Any, y: Any) -> Any:
        def wait(a: Any) -> Any:
            time.sleep(sleep)
            return a

        x2 = tf.py_function(wait, [x], tf.float32)
        x2.set_shape(x.shape)
        return x2, y

    return ds.map(slow)


def model(steps_per_execution: int = 1) -> Any:
    m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
    m.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    return m


def median_period(ds: Any, k: int) -> float:
    m, p = model(k), Periods()
    m.fit(ds, epochs=2, callbacks=[p], verbose=0)
    return float(np.median(np.diff(p.ends)))


@pytest.mark.parametrize("k", [1, 4])
def test_a_sleeping_map_is_data_loading_within_5_points(tmp_path: Path, k: int) -> None:
    from gpuidle.keras import GpuidleCallback

    compute = median_period(data(0), k)  # the train call on cached data: its compute, with nothing to wait for
    lines: list[str] = []
    cb, periods = GpuidleCallback(tmp_path, ledger=False, log=lines.append), Periods()
    model(k).fit(cb.dataset(data(SLEEP_S)), epochs=2, callbacks=[cb, periods], verbose=0)
    period = float(np.median(np.diff(periods.ends)))
    truth = 1 - compute / period  # the share of each call spent waiting: what it takes beyond its compute
    assert period > k * SLEEP_S  # the sleep is on the critical path
    report = cb.report
    assert report is not None
    assert report.source.framework == "tensorflow"
    d = report.ranks[0].devices[0]
    share = d.idle_by_cause_s["data_loading"] / d.window_s
    # one batch per call: measured at the batch's arrival, within 5 points; several: the equal-compute split, 8
    assert abs(share - truth) < (0.05 if k == 1 else 0.08), (share, truth)
    first = report.recommendations[0]
    assert first.cause == "data_loading"
    assert "num_parallel_calls=tf.data.AUTOTUNE" in first.fix
    assert ".prefetch(" in first.fix
    assert "torch" not in first.fix
    assert "DataLoader" not in first.fix
    if k > 1:
        assert any("steps_per_execution=4" in n for n in report.ranks[0].notes)


def test_split_execution_against_a_simulation() -> None:
    # 3 batches arriving at 10, 30, 31 ms; each computes 5 ms: ends at 15, 35, 40; the wait is 40 - 15 = 25
    assert split_execution(0, 40, [10, 30, 31]) == (25, 15)
    assert split_execution(0, 40, []) == (0, 40)
    assert split_execution(100, 140, [50]) == (0, 40)  # arrived before the call: no wait


def test_rank_from_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    assert tf_config_rank() == (2, 3)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(GpuidleError, match="TF_CONFIG"):
        tf_config_rank()


def test_outside_fit_and_odd_steps_per_execution_log_once_and_never_raise(tmp_path: Path) -> None:
    from gpuidle.keras import GpuidleCallback

    lines: list[str] = []
    cb = GpuidleCallback(tmp_path, ledger=False, log=lines.append)
    cb.on_train_batch_begin(0)
    cb.on_train_batch_end(0)  # outside fit
    cb.on_train_batch_end(1)
    assert sum("stopped" in line for line in lines) == 1
    cb2 = GpuidleCallback(tmp_path / "b", ledger=False, log=lines.append)
    m = model()
    m.steps_per_execution = "auto"
    cb2.set_model(m)
    cb2.on_train_begin()
    assert any("steps_per_execution='auto'" in line for line in lines)
