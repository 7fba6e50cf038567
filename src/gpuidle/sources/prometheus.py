"""A Prometheus range-query export: ``/api/v1/query_range`` JSON of dcgm-exporter or gpuidle metrics.

The response is ``{"status": "success", "data": {"resultType": "matrix", "result": [...]}}``;
each result is one series, ``{"metric": {labels}, "values": [[unix_s, "value"], ...]}``.
dcgm-exporter labels a GPU with ``gpu`` (the index), ``UUID``, ``modelName`` and
``Hostname``, and ``gpuidle monitor --prometheus-port`` labels its ``gpuidle_gpu_*``
series the same way (their ``job``/``rank`` labels are not needed here). One export may
hold several hosts; each GPU becomes one device (numbered in order of host, then index,
when there is more than one host). Values are strings (``"NaN"`` included); a series' own
timestamps are kept, so series scraped at different moments each keep their samples.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from gpuidle.errors import CorruptInput, NotATrace
from gpuidle.model import GPU_GAUGES, GPU_METRICS, DeviceSeries, UtilSeries, plausible_unix_s

FORMAT_PROMETHEUS = "prometheus-range"

MIB = 1024.0 * 1024.0
METRICS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_mib_s", 1.0 / MIB),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_mib_s", 1.0 / MIB),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_mib_s", 1.0 / MIB),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_mib_s", 1.0 / MIB),
}
"""dcgm-exporter metric -> our column and the factor into its unit (MiB are DCGM's MB; PCIe bytes/s)."""
METRICS.update({m.name: (m.column, 1.0 / m.scale) for m in GPU_GAUGES if m.column in GPU_METRICS})
"""... and gpuidle's own exporter, whose catalogue says how each gauge was scaled from its column."""
FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
"""Total device memory is used + free (+ reserved), at the timestamps all are known."""

Key = tuple[str, int]
"""(host, GPU index)."""


def looks_like(head: str) -> bool:
    """Whether the start of a file is a Prometheus query response."""
    return head.lstrip().startswith("{") and ('"resultType"' in head or '"errorType"' in head)


def read(text: str, path: str) -> UtilSeries:
    """The GPU series of one range-query response."""
    try:
        doc = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as err:
        raise CorruptInput(f"{path}: not valid JSON ({err})") from None
    if not isinstance(doc, dict):
        raise NotATrace(f"{path}: not a Prometheus query response")
    if doc.get("status") not in (None, "success"):
        raise NotATrace(f"{path}: the query failed: {str(doc.get('error', doc.get('status')))[:200]}")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise NotATrace(f"{path}: not a Prometheus query response (no data)")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise NotATrace(f"{path}: a {str(data.get('resultType'))[:40]} result, not a range query",
                        "export /api/v1/query_range (resultType matrix), not /api/v1/query")
    cols: dict[Key, dict[str, dict[float, float]]] = {}
    names: dict[Key, str] = {}
    seen: set[str] = set()
    skipped = 0
    for s in data["result"]:
        metric = s.get("metric") if isinstance(s, dict) else None
        values = s.get("values") if isinstance(s, dict) else None
        if not isinstance(metric, dict) or not isinstance(values, list):
            skipped += 1
            continue
        name = str(metric.get("__name__", ""))
        seen.add(name)
        if name not in METRICS and name not in FB_PARTS:
            continue
        key = _key(metric)
        if key is None:
            skipped += 1
            continue
        if isinstance(metric.get("modelName"), str):
            names[key] = metric["modelName"]
        points = cols.setdefault(key, {}).setdefault(name, {})
        for point in values:
            tv = _point(point)
            if tv is None:
                skipped += 1
            else:
                points[tv[0]] = tv[1]
    if not cols:
        found = ", ".join(sorted(n for n in seen if n)[:5]) or "none"
        raise NotATrace(f"{path}: no GPU series of dcgm-exporter or gpuidle in this export (metrics: {found})",
                        "query e.g. DCGM_FI_DEV_GPU_UTIL or gpuidle_gpu_utilization_ratio, with the gpu label kept")
    notes = [f"{skipped} unreadable series or point(s) ignored"] if skipped else []
    return _series(cols, names, path, notes)


def _key(metric: dict[str, Any]) -> Key | None:
    try:
        gpu = int(str(metric.get("gpu", "")))
    except ValueError:
        return None
    host = metric.get("Hostname", metric.get("instance", ""))
    return (str(host), gpu) if 0 <= gpu < 1 << 20 else None


def _point(point: object) -> tuple[float, float] | None:
    if not isinstance(point, list) or len(point) != 2:
        return None
    try:
        t, v = float(point[0]), float(str(point[1]))
    except (TypeError, ValueError, OverflowError):
        return None
    if not plausible_unix_s(t):
        return None
    return t, v if math.isfinite(v) else math.nan


def _series(cols: dict[Key, dict[str, dict[float, float]]], names: dict[Key, str], path: str,
            notes: list[str]) -> UtilSeries:
    hosts = sorted({h for h, _ in cols})
    t0 = min(t for by in cols.values() for pts in by.values() for t in pts)
    devices = []
    for n, key in enumerate(sorted(cols)):
        by = cols[key]
        stamps = np.array(sorted({t for pts in by.values() for t in pts}), dtype=np.float64)
        values: dict[str, np.ndarray] = {}
        for metric, pts in by.items():
            if metric not in METRICS:
                continue
            col, factor = METRICS[metric]
            values[col] = np.array([pts.get(t, math.nan) * factor for t in stamps.tolist()], dtype=np.float64)
        if FB_PARTS[0] in by and FB_PARTS[1] in by:
            parts = [by[p] for p in FB_PARTS if p in by]
            values["mem_total_mib"] = np.array(
                [sum(p.get(t, math.nan) for p in parts) for t in stamps.tolist()], dtype=np.float64)
        host, gpu = key
        index = gpu if len(hosts) == 1 else n
        model = names.get(key)
        label = f"{host} GPU {gpu}" if len(hosts) > 1 else None
        name = " · ".join(x for x in (label, model) if x) or None
        devices.append(DeviceSeries(device=index, name=name, t=stamps - t0, values=values))
    if len(hosts) > 1:
        notes.append(f"{len(hosts)} hosts: devices numbered in order of host, then GPU index")
    return UtilSeries(devices=devices, host=None, format=FORMAT_PROMETHEUS, paths=[path], t0=t0,
                      interval_s=None, notes=notes)
