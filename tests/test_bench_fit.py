"""The latency + bytes / bandwidth fit: flat, noisy-flat and falling times give no fit, whatever numpy rounds."""

from __future__ import annotations

import numpy as np
import pytest

from gpuidle.probes.fit import MAX_LINK_GBPS, TIMER_TOLERANCE, TimedSize, fit_latency_bandwidth

SIZES = [1 << 20, 2 << 20, 4 << 20, 8 << 20]


def _points(times: list[float], spread_s: float = 0.0) -> list[TimedSize]:
    return [TimedSize(n, t, spread_s) for n, t in zip(SIZES, times, strict=True)]


def _reference_slope(x: list[int], y: list[float]) -> float:
    """Least squares by the textbook formula, in exact rational arithmetic."""
    from fractions import Fraction

    fx = [Fraction(v) for v in x]
    fy = [Fraction(v) for v in y]
    n = len(fx)
    mx, my = sum(fx) / n, sum(fy) / n
    return float(sum((a - mx) * (b - my) for a, b in zip(fx, fy, strict=True)) / sum((a - mx) ** 2 for a in fx))


@pytest.mark.parametrize("t", [1e-3, 0.1 + 0.2, 7.3e-5, 3.0])
def test_equal_times_do_not_grow(t: float) -> None:
    assert fit_latency_bandwidth(_points([t] * 4)) is None


def test_noise_within_the_runs_spread_is_flat() -> None:
    rng = np.random.default_rng(7)
    times = list(1e-3 + rng.uniform(-20e-6, 20e-6, 4))
    assert fit_latency_bandwidth(_points(times, spread_s=50e-6)) is None


def test_noise_within_timer_tolerance_is_flat_without_a_spread() -> None:
    times = [1e-3, 1e-3 * (1 + TIMER_TOLERANCE / 4), 1e-3, 1e-3 * (1 + TIMER_TOLERANCE / 2)]
    assert fit_latency_bandwidth(_points(times)) is None


def test_falling_times_do_not_grow() -> None:
    assert fit_latency_bandwidth(_points([4e-3, 3e-3, 2e-3, 1e-3])) is None


def test_a_bandwidth_no_link_reaches_is_no_fit() -> None:
    # 20 TB/s per rank: on MiB sizes the growth is within the timer tolerance, on TiB sizes it is clear
    # but no link carries it
    latency = 1e-3
    fast = [latency + n / (2 * MAX_LINK_GBPS * 1e9) for n in SIZES]
    assert fit_latency_bandwidth(_points(fast)) is None
    far = [TimedSize(n << 20, latency + (n << 20) / (2 * MAX_LINK_GBPS * 1e9)) for n in SIZES]
    assert fit_latency_bandwidth(far) is None


def test_a_real_growth_is_fitted_exactly() -> None:
    times = [200e-6 + n / 1.5e9 for n in SIZES]
    fit = fit_latency_bandwidth(_points(times, spread_s=10e-6))
    assert fit is not None
    assert fit.latency_s == pytest.approx(200e-6, rel=1e-9)
    assert fit.bandwidth_gbps == pytest.approx(1.5, rel=1e-9)
    assert 1 / (fit.bandwidth_gbps * 1e9) == pytest.approx(_reference_slope(SIZES, times), rel=1e-9)
    assert fit.sizes == SIZES


def test_a_negative_intercept_fits_through_the_origin() -> None:
    times = [n / 2e9 for n in SIZES]
    times[0] *= 0.5  # pulls the least-squares intercept below zero
    fit = fit_latency_bandwidth(_points(times))
    assert fit is not None
    assert fit.latency_s == 0.0
    x = np.array(SIZES, dtype=np.float64)
    assert 1 / (fit.bandwidth_gbps * 1e9) == pytest.approx(float((x * np.array(times)).sum() / (x * x).sum()))


def test_too_few_sizes_or_bad_times() -> None:
    assert fit_latency_bandwidth([TimedSize(1 << 20, 1e-3)]) is None
    assert fit_latency_bandwidth([TimedSize(1 << 20, 1e-3), TimedSize(1 << 20, 2e-3)]) is None
    assert fit_latency_bandwidth(_points([1e-3, float("nan"), 2e-3, 3e-3])) is None
    assert fit_latency_bandwidth(_points([0.0, 1e-3, 2e-3, 3e-3])) is None
