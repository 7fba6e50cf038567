"""Counter values no device can report: set aside before any average, with a note saying how many.

``utilization.gpu`` is the share of a sample period in which a kernel ran: 0 to 100 %,
nothing else. A log that says -5 % or 250 % holds a corrupt field (a shifted column, a
wrapped counter, a hand-edited file), not a measurement slightly off. Clamping would
turn the 250 % into a fully busy sample and the -5 % into an idle one, inventing exactly
the numbers the report is about; so such a value counts as *not available* (NaN), like
nvidia-smi's own ``[N/A]``, and the report says how many there were. Only float noise
(within :data:`ROUNDING` of a bound, as a Prometheus rate or a DCGM ratio can carry) is
clamped. The same holds for the DCGM ratios (0 to 1), for the sizes, clocks, power and
throughputs (never negative) and for the clock-event bitmask (a 64-bit unsigned integer).
Infinite values are never a reading.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from gpuidle.model import F64, GPU_METRICS, DeviceSeries

ROUNDING = 1e-6
"""Share of a bounded range within which a value outside it is float noise, clamped to the bound."""

BOUNDS: dict[str, tuple[float, float]] = {
    "util_pct": (0.0, 100.0),
    "mem_util_pct": (0.0, 100.0),
    "sm_active": (0.0, 1.0),
    "sm_occupancy": (0.0, 1.0),
    "tensor_active": (0.0, 1.0),
    "dram_active": (0.0, 1.0),
    "throttle_reasons": (0.0, float(2**64 - 1)),
    "temp_c": (-273.15, math.inf),
}
"""The values a column can hold; every other column of :data:`GPU_METRICS` is at least 0."""


def bounds(key: str) -> tuple[float, float]:
    return BOUNDS.get(key, (0.0, math.inf))


def _checked(key: str, x: F64) -> tuple[F64, F64]:
    """The column with impossible values as NaN, and those values."""
    lo, hi = bounds(key)
    slack = ROUNDING * (hi - lo) if math.isfinite(hi - lo) else 0.0
    y = np.where((x >= lo - slack) & (x < lo), lo, x)
    y = np.where((y <= hi + slack) & (y > hi), hi, y)
    bad = ~np.isnan(y) & ~(np.isfinite(y) & (y >= lo) & (y <= hi))
    if not bad.any():
        return y, np.zeros(0)
    return np.where(bad, np.nan, y), x[bad]


def _range_text(key: str) -> str:
    lo, hi = bounds(key)
    if key == "throttle_reasons":
        return "not a 64-bit mask"
    if math.isinf(hi):
        return f"below {lo:g}" if lo else "negative or infinite"
    return f"outside {lo:g}–{hi:g}" + (" %" if key.endswith("_pct") else "")


def without_impossible_values(devices: list[DeviceSeries]) -> tuple[list[DeviceSeries], list[str]]:
    """The devices with impossible counter values set to NaN (not available), and one note per column and device.

    The note names the column as :data:`GPU_METRICS` does and shows up to three of the values.
    """
    out, notes = [], []
    for d in devices:
        values = {}
        for key, x in d.values.items():
            y, bad = _checked(key, x)
            values[key] = y
            if bad.size:
                shown = ", ".join(f"{v:g}" for v in bad[:3]) + (", …" if bad.size > 3 else "")
                what = GPU_METRICS.get(key, key).split(":")[0].split(",")[0]
                notes.append(f"device {d.device}: {bad.size} {what} value(s) {_range_text(key)} ({shown}) "
                             f"treated as not available")
        out.append(msgspec.structs.replace(d, values=values))
    return out, notes
