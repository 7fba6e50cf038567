"""``distinct`` gives what ``np.unique`` gives, ``median_of`` what ``np.median`` gives, on the dtypes columns have."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gpuidle.model.arrays import distinct, gathered, median_of, runs


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint8, np.float64, np.float32])
def test_distinct_is_np_unique(dtype: type) -> None:
    rng = np.random.default_rng(7)
    for size in (0, 1, 2, 3, 50, 2_000):
        values = rng.integers(-5 if np.issubdtype(dtype, np.signedinteger) or dtype in (np.float64, np.float32) else 0,
                              40, size).astype(dtype)
        got = distinct(values)
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, np.unique(values))


def test_nans_count_once_and_shape_is_flattened() -> None:
    values = np.array([[3.0, np.nan], [np.nan, -0.0], [0.0, np.inf]])
    np.testing.assert_array_equal(distinct(values), np.unique(values))
    assert np.isnan(distinct(values)).sum() == 1
    assert distinct([2, 2, 1]).tolist() == [1, 2]


def test_input_is_not_sorted_in_place() -> None:
    values = np.array([3, 1, 2, 1])
    distinct(values)
    assert values.tolist() == [3, 1, 2, 1]


@pytest.mark.parametrize("count", [0, 1, 9, 32])
def test_gathered_is_one_gather_per_table(count: int) -> None:
    rng = np.random.default_rng(count)
    tables = [rng.random(500) < p for p in np.linspace(0.0, 1.0, count)]
    index = rng.integers(0, 500, 10_000).astype(np.int32)
    got = gathered(index, *tables)
    assert len(got) == count
    for table, column in zip(tables, got, strict=True):
        assert column.dtype == np.bool_
        assert np.array_equal(column, table[index])


def test_gathered_refuses_more_tables_than_bits() -> None:
    with pytest.raises(ValueError, match="at most 32"):
        gathered(np.zeros(3, dtype=np.int64), *[np.ones(2, dtype=bool)] * 33)


def test_runs_lays_every_run_end_to_end() -> None:
    rng = np.random.default_rng(7)
    first = rng.integers(0, 50, 200)
    count = rng.integers(-3, 6, 200)
    owner, index = runs(first, count)
    want = [(i, f + j) for i, (f, c) in enumerate(zip(first.tolist(), count.tolist(), strict=True)) for j in range(c)]
    assert list(zip(owner.tolist(), index.tolist(), strict=True)) == want
    empty_owner, empty_index = runs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert empty_owner.size == 0
    assert empty_index.size == 0


@pytest.mark.parametrize("seed", range(60))
def test_median_of_is_numpys_median_to_the_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    for values in (rng.integers(-(1 << 62), 1 << 62, n), rng.integers(0, 5, n), rng.normal(size=n) * 1e9,
                   rng.integers(0, 1000, n).tolist(), rng.random(n).astype(np.float32)):
        got, want = median_of(values), np.median(values)
        assert got == want, (values, got, want)
        assert type(got) is np.float64


def test_median_of_with_nan_or_nothing_is_numpys() -> None:
    assert np.isnan(median_of(np.array([1.0, np.nan, 3.0])))
    with pytest.warns(RuntimeWarning):
        assert np.isnan(median_of(np.zeros(0)))


def test_median_of_loads_no_masked_arrays() -> None:
    code = ("import sys; from gpuidle.model.arrays import median_of; median_of([1.5, 2.0]); "
            "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
