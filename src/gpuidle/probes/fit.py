"""``time = latency + bytes / bandwidth`` fitted on measured sizes, or no fit when time does not grow.

The probes extrapolate a transfer's time beyond the sizes they measured. A least-squares
slope always comes out *some* number, even through equal times (rounding noise of either
sign), so "time grows with size" is decided physically, not by the slope's sign: the growth
the fit claims across the sizes must stand above the runs' own spread (and above
:data:`TIMER_TOLERANCE` of the times), and the bandwidth it implies must be one a link can
carry (:data:`MAX_LINK_GBPS`). Otherwise there is nothing to extrapolate and the caller
compares with the nearest size measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from gpuidle.model.arrays import distinct

TIMER_TOLERANCE = 0.01
"""Growth under 1 % of the median time is timer resolution and jitter, not bandwidth."""
MAX_LINK_GBPS = 10_000.0
"""No interconnect or memory moves 10 TB/s per rank (NVLink 5: 1.8 TB/s; HBM3e: ~8 TB/s)."""


class TimeFit(msgspec.Struct, frozen=True):
    """``time = latency_s + bytes / (bandwidth_gbps × 1e9)``, fitted on ``sizes``."""

    latency_s: float
    bandwidth_gbps: float
    sizes: list[int]

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / (self.bandwidth_gbps * 1e9)


class TimedSize(msgspec.Struct, frozen=True):
    """One measured size: its median time and the spread of its runs (p90 − fastest), seconds."""

    nbytes: int
    seconds: float
    spread_s: float = 0.0


def fit_latency_bandwidth(points: Sequence[TimedSize]) -> TimeFit | None:
    """Least-squares ``latency + bytes / bandwidth`` through ``points``; None where time does not grow.

    A negative latency is taken as zero (the fit through the origin). None with fewer than two
    distinct sizes, a growth across the sizes within the runs' spread or the timer tolerance, or
    a bandwidth no link reaches.
    """
    pts = sorted(points, key=lambda p: p.nbytes)
    x = np.array([p.nbytes for p in pts], dtype=np.float64)
    y = np.array([p.seconds for p in pts], dtype=np.float64)
    if len(distinct(x)) < 2 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        return None
    dx = x - x.mean()
    slope = float((dx * (y - y.mean())).sum() / (dx * dx).sum())  # centred: equal times give exactly 0
    latency = float(y.mean() - slope * x.mean())
    if latency < 0:
        latency, slope = 0.0, float((x * y).sum() / (x * x).sum())
    growth = slope * float(x[-1] - x[0])
    noise = max(float(np.median([p.spread_s for p in pts])), TIMER_TOLERANCE * float(np.median(y)))
    if growth <= noise:
        return None
    bandwidth_gbps = 1 / slope / 1e9
    if bandwidth_gbps > MAX_LINK_GBPS:
        return None
    return TimeFit(latency, bandwidth_gbps, [int(v) for v in x])
