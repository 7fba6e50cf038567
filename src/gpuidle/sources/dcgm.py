"""``dcgmi dmon`` output saved to a file: ``dcgmi dmon -e 203,252,250,155,150,100,1002,1003,1004,1005 -d 1000``.

The tool prints a header naming the fields by short tags (``#Entity   GPUTL  FBUSD ...``),
a unit line (``ID``), then one row per entity per interval (``GPU 0   87   30210 ...``),
``N/A`` where a field is not available; the header repeats from time to time. Rows carry
no time: the n-th row of a GPU is at n × the interval (``-d``, in ms, 1000 by default; give
``--interval`` in seconds for another). Only ``GPU`` rows are read (not ``GPU-I``/``GPU-CI``
instances, switches or CPUs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from gpuidle.errors import NotATrace
from gpuidle.model import DeviceSeries, UtilSeries

FORMAT_DCGMI = "dcgmi-dmon"
DEFAULT_INTERVAL_S = 1.0

MIB = 1024.0 * 1024.0
TAGS: dict[str, tuple[str, float]] = {
    "GPUTL": ("util_pct", 1.0),          # 203 DCGM_FI_DEV_GPU_UTIL
    "MCUTL": ("mem_util_pct", 1.0),      # 204 DCGM_FI_DEV_MEM_COPY_UTIL
    "FBUSD": ("mem_used_mib", 1.0),      # 252 DCGM_FI_DEV_FB_USED
    "FBTTL": ("mem_total_mib", 1.0),     # 250 DCGM_FI_DEV_FB_TOTAL
    "SMCLK": ("sm_clock_mhz", 1.0),      # 100 DCGM_FI_DEV_SM_CLOCK
    "MMCLK": ("mem_clock_mhz", 1.0),     # 101 DCGM_FI_DEV_MEM_CLOCK
    "POWER": ("power_w", 1.0),           # 155 DCGM_FI_DEV_POWER_USAGE
    "TMPTR": ("temp_c", 1.0),            # 150 DCGM_FI_DEV_GPU_TEMP
    "SMACT": ("sm_active", 1.0),         # 1002
    "SMOCC": ("sm_occupancy", 1.0),      # 1003
    "TENSO": ("tensor_active", 1.0),     # 1004
    "DRAMA": ("dram_active", 1.0),       # 1005
    "PCITX": ("pcie_tx_mib_s", 1.0 / MIB),   # 1009, bytes/s
    "PCIRX": ("pcie_rx_mib_s", 1.0 / MIB),   # 1010
    "NVLTX": ("nvlink_tx_mib_s", 1.0 / MIB),  # 1011
    "NVLRX": ("nvlink_rx_mib_s", 1.0 / MIB),  # 1012
}
"""dcgmi dmon's column tag -> our column and the factor into its unit."""


def looks_like(first_line: str) -> bool:
    """``#Entity ...``, the header dcgmi dmon starts with."""
    return first_line.lstrip("#").strip().startswith("Entity")


def read(lines: Iterable[str], path: str, interval_s: float | None = None) -> UtilSeries:
    """The GPU rows of a saved ``dcgmi dmon`` run."""
    interval = interval_s or DEFAULT_INTERVAL_S
    columns: list[str] | None = None
    rows: dict[int, list[dict[str, float]]] = {}
    skipped = 0
    for raw in lines:
        parts = raw.split()
        if not parts:
            continue
        if parts[0].startswith("#"):
            columns = [p for p in (parts[0][1:], *parts[1:]) if p and p != "Entity"]
            continue
        if columns is None or parts[0] != "GPU":
            continue  # the unit line (ID), other entities, messages
        if len(parts) != len(columns) + 2 or not (parts[1].isascii() and parts[1].isdigit()) or len(parts[1]) > 6:
            skipped += 1
            continue
        row: dict[str, float] = {}
        for tag, cell in zip(columns, parts[2:], strict=True):
            if tag in TAGS:
                col, factor = TAGS[tag]
                row[col] = _number(cell) * factor
        rows.setdefault(int(parts[1]), []).append(row)
    if not rows:
        raise NotATrace(f"{path}: no GPU rows of dcgmi dmon found",
                        "record with: dcgmi dmon -e 203,252,250,155,150,1002,1003,1004,1005 > dcgm.log")
    devices = []
    for idx in sorted(rows):
        samples = rows[idx]
        keys = sorted({k for r in samples for k in r})
        values = {k: np.array([r.get(k, math.nan) for r in samples], dtype=np.float64) for k in keys}
        devices.append(DeviceSeries(device=idx, name=None, t=np.arange(len(samples), dtype=np.float64) * interval,
                                    values=values))
    notes = [f"dcgmi dmon rows carry no time: spaced {interval:g} s apart (pass --interval if it ran with "
             f"another -d)"]
    if not any("util_pct" in d.values for d in devices):
        notes.append("no GPUTL column (field 203): the window and idle periods need it; add -e 203")
    if skipped:
        notes.append(f"{skipped} malformed row(s) ignored")
    return UtilSeries(devices=devices, host=None, format=FORMAT_DCGMI, paths=[path], t0=None,
                      interval_s=interval, notes=notes)


def _number(cell: str) -> float:
    try:
        v = float(cell)
    except ValueError:
        return math.nan  # N/A, or a blank the tool printed
    return v if math.isfinite(v) else math.nan
