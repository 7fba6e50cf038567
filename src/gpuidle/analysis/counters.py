"""Time-weighted statistics of device counter series: the window, sample weights, runs below a
threshold, periodic drops, and each device's and the host's summary over the window.

Every sample stands for the time until the next one (the last for the median interval;
a gap longer than :data:`GAP_FACTOR` intervals counts for one interval only, so a paused
logger cannot stretch a sample). Means and shares are time-weighted; medians are of the
samples. "Idle time" counts a sample at ``u`` % as ``(1 - u/100)`` of its duration, which
is what utilization.gpu means: the share of time in which at least one kernel ran.

The window is the log without the GPU idle at its start and end (model loading,
teardown): from the first to the end of the last sample in which any analysed device
was above the idle threshold, aligned to each device's own samples (a sample the window's
end cuts to less than one sampling interval is left out, see :func:`_clip`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuidle.model import (
    F64,
    THROTTLE_REASONS,
    DeviceSeries,
    DeviceUtil,
    HostSeries,
    HostUtil,
    IdlePeriod,
    PeriodicDrops,
    UtilSeries,
    UtilWindow,
)
from gpuidle.model.arrays import median_of

GAP_FACTOR = 3.0
MIN_SHARE = 0.05
"""A host-side pattern below 5 % of the window is not worth a finding."""
TARGET_PCT = 90.0


@dataclass(frozen=True, slots=True)
class UtilOptions:
    idle_pct: float = 10.0
    """Below this utilization.gpu a device counts as idle."""
    starved_pct: float = 50.0
    """Below this (mean over devices) the GPUs count as starved, for the host rule of thumb."""
    cpu_saturated_pct: float = 80.0
    """Mean core busy at or above this: the CPU is saturated."""
    cpu_idle_pct: float = 30.0
    """Mean core busy below this, and no core above :attr:`hot_core_pct`: the CPU is idle."""
    hot_core_pct: float = 90.0
    steps_per_s: float | None = None
    devices: Sequence[int] | None = None
    """Analyse only these GPU indices (default: all in the log)."""
    top_idle_periods: int = 5
    drop_thresholds: tuple[float, ...] = (10.0, 30.0, 50.0)
    min_headroom: float = 0.3
    """Free device memory share from which a larger batch is suggested."""


DEFAULT_OPTIONS = UtilOptions()


# ----------------------------------------------------------------------------------
# Sample weights and the window
# ----------------------------------------------------------------------------------


def sample_weights(t: F64, interval: float | None = None) -> F64:
    """Seconds each sample stands for: the time to the next sample, capped at ``GAP_FACTOR`` intervals."""
    if t.size == 0:
        return np.zeros(0)
    d = np.diff(t)
    step = interval if interval is not None else (float(median_of(d)) if d.size else 1.0)
    if step <= 0:
        step = 1.0
    w = np.empty_like(t)
    w[:-1] = np.where(d > GAP_FACTOR * step, step, d)
    w[-1] = step
    return w


def median_interval(series: UtilSeries) -> float:
    diffs = [np.diff(d.t) for d in series.devices if len(d) > 1]
    if series.host is not None and len(series.host) > 1:
        diffs.append(np.diff(series.host.t))
    if diffs:
        return float(median_of(np.concatenate(diffs)))
    return series.interval_s or 1.0


def _active_span(d: DeviceSeries, w: F64, idle_pct: float) -> tuple[float, float] | None:
    u = d.col("util_pct")
    busy = np.flatnonzero(np.isfinite(u) & (u >= idle_pct))
    if busy.size == 0:
        return None
    return float(d.t[busy[0]]), float(d.t[busy[-1]] + w[busy[-1]])


def find_window(devices: list[DeviceSeries], host: HostSeries | None, interval: float,
                idle_pct: float) -> UtilWindow:
    """First to last non-idle sample over all devices; the whole log when none is ever busy."""
    spans, lo, hi = [], math.inf, -math.inf
    for d in devices:
        if len(d) == 0:
            continue
        w = sample_weights(d.t, interval)
        lo, hi = min(lo, float(d.t[0])), max(hi, float(d.t[-1] + w[-1]))
        span = _active_span(d, w, idle_pct)
        if span is not None:
            spans.append(span)
    if not math.isfinite(lo) and host is not None and len(host):
        w = sample_weights(host.t, interval)
        lo, hi = float(host.t[0]), float(host.t[-1] + w[-1])
    if not math.isfinite(lo):
        return UtilWindow(start_s=0.0, dur_s=0.0, leading_idle_s=0.0, trailing_idle_s=0.0, interval_s=interval)
    if not spans:
        return UtilWindow(start_s=lo, dur_s=hi - lo, leading_idle_s=0.0, trailing_idle_s=0.0, interval_s=interval)
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    return UtilWindow(start_s=start, dur_s=end - start, leading_idle_s=start - lo, trailing_idle_s=hi - end,
                      interval_s=interval)


def _clip(t: F64, w: F64, win: UtilWindow) -> tuple[np.ndarray, F64]:
    """Samples starting inside the window, and their weights cut at its end.

    The window is aligned to each device's own samples: a sample the end cuts to less than one
    sampling interval is left out. Another GPU's lines a few ms later (normal in real logs) end
    the shared window that much later; the sliver of this GPU's next (idle) sample it takes in is
    not an idle period.
    """
    end = win.start_s + win.dur_s
    sel = (t >= win.start_s - 1e-9) & (t < end - 1e-9)
    cut = np.minimum(w, end - t)
    sel &= (cut >= w - 1e-9) | (cut >= win.interval_s - 1e-9)
    return sel, cut[sel]


# ----------------------------------------------------------------------------------
# Per device
# ----------------------------------------------------------------------------------


def runs_below(u: F64, threshold: float) -> list[tuple[int, int]]:
    """``[start, stop)`` index ranges of consecutive samples below ``threshold``."""
    below = np.concatenate(([False], u < threshold, [False]))
    edges = np.flatnonzero(np.diff(below.astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def periodic_drops(t: F64, w: F64, u: F64, threshold: float, interval: float,
                   steps_per_s: float | None = None) -> PeriodicDrops | None:
    """Drops below ``threshold`` that recur at a regular period.

    Needs at least three drops. The period is the median time between drop starts;
    the drops are periodic when at least 3/4 of those gaps are within 20 % of it (or
    1.5 sampling intervals, whichever is larger), and the period spans at least two
    sampling intervals so it is resolved at all.
    """
    runs = runs_below(u, threshold)
    if len(runs) < 3:
        return None
    starts = np.array([t[a] for a, _ in runs])
    durs = np.array([w[a:b].sum() for a, b in runs])
    gaps = np.diff(starts)
    period = float(median_of(gaps))
    if period < 2 * interval:
        return None
    tol = max(0.2 * period, 1.5 * interval)
    regular = float(np.mean(np.abs(gaps - period) <= tol))
    if regular < 0.75:
        return None
    drop = float(median_of(durs))
    return PeriodicDrops(
        threshold_pct=threshold, period_s=period, drop_s=drop, count=len(runs), regularity=regular,
        period_steps=period * steps_per_s if steps_per_s else None,
        drop_steps=drop * steps_per_s if steps_per_s else None,
    )


def _nanmean(x: F64, w: F64 | None = None) -> float | None:
    ok = np.isfinite(x)
    if w is not None:
        ok &= w > 0
    if not ok.any():
        return None
    if w is None:
        return float(x[ok].mean())
    return float(np.average(x[ok], weights=w[ok]))


def _nanmax(x: F64) -> float | None:
    ok = np.isfinite(x)
    return float(x[ok].max()) if ok.any() else None


def device_util(d: DeviceSeries, win: UtilWindow, opt: UtilOptions) -> DeviceUtil:
    w_all = sample_weights(d.t, win.interval_s)
    sel, w = _clip(d.t, w_all, win)
    t = d.t[sel]
    u_raw = d.col("util_pct")[sel]
    ok = np.isfinite(u_raw)
    tu, wu, u = t[ok], w[ok], u_raw[ok]
    total = float(wu.sum())

    def share(mask: np.ndarray) -> tuple[float, float]:
        s = float(wu[mask].sum())
        return s, (s / total if total else 0.0)

    b80, b80s = share(u < 80.0)
    b90, b90s = share(u < 90.0)
    idle, idle_share = share(u < opt.idle_pct)
    runs = runs_below(u, opt.idle_pct)
    periods = sorted(
        (IdlePeriod(start_s=float(tu[a]), dur_s=float(wu[a:b].sum()),
                    mean_util_pct=float(np.average(u[a:b], weights=wu[a:b])) if wu[a:b].sum() > 0 else 0.0)
         for a, b in runs),
        key=lambda p: (-p.dur_s, p.start_s),
    )
    drops = [p for thr in opt.drop_thresholds
             if (p := periodic_drops(tu, wu, u, thr, win.interval_s, opt.steps_per_s)) is not None]
    periodic = max(drops, key=lambda p: (p.count * p.drop_s, -p.threshold_pct)) if drops else None

    col = {k: d.col(k)[sel] for k in d.values}
    mem_used = _nanmax(col.get("mem_used_mib", np.full(t.shape, np.nan)))
    mem_total = _nanmax(d.col("mem_total_mib"))
    busy = np.isfinite(u_raw) & (u_raw >= opt.idle_pct)
    return DeviceUtil(
        device=d.device, name=d.name, samples=int(ok.sum()), window_s=total,
        mean_util_pct=float(np.average(u, weights=wu)) if total > 0 else 0.0,
        median_util_pct=float(median_of(u)) if u.size else 0.0,
        below_80_s=b80, below_80_share=b80s, below_90_s=b90, below_90_share=b90s,
        idle_s=idle, idle_share=idle_share, idle_period_count=len(runs),
        idle_periods=periods[: opt.top_idle_periods], periodic=periodic,
        mem_util_mean_pct=_mean(col, "mem_util_pct", w),
        mem_used_max_mib=mem_used, mem_total_mib=mem_total,
        mem_headroom_share=(1.0 - mem_used / mem_total) if mem_used is not None and mem_total else None,
        power_mean_w=_mean(col, "power_w", w),
        power_limit_w=_median(col, "power_limit_w"),
        sm_clock_mean_mhz=_mean(col, "sm_clock_mhz", w),
        temp_max_c=_nanmax(col["temp_c"]) if "temp_c" in col else None,
        throttle_share=_throttle_share(col.get("throttle_reasons"), busy),
        pcie_rx_mean_mib_s=_mean(col, "pcie_rx_mib_s", w),
        pcie_tx_mean_mib_s=_mean(col, "pcie_tx_mib_s", w),
        nvlink_rx_mean_mib_s=_mean(col, "nvlink_rx_mib_s", w),
        nvlink_tx_mean_mib_s=_mean(col, "nvlink_tx_mib_s", w),
        sm_active_mean=_mean(col, "sm_active", w),
        sm_occupancy_mean=_mean(col, "sm_occupancy", w),
        tensor_active_mean=_mean(col, "tensor_active", w),
        dram_active_mean=_mean(col, "dram_active", w),
    )


def _mean(col: dict[str, F64], key: str, w: F64) -> float | None:
    x = col.get(key)
    return None if x is None else _nanmean(x, w)


def _median(col: dict[str, F64], key: str) -> float | None:
    x = col.get(key)
    if x is None or not np.isfinite(x).any():
        return None
    return float(median_of(x[np.isfinite(x)]))


def _throttle_share(mask: F64 | None, busy: np.ndarray) -> dict[str, float]:
    """Share of busy samples (with a known mask) in which each clock event reason was active."""
    if mask is None:
        return {}
    ok = busy & np.isfinite(mask)
    if not ok.any():
        return {}
    bits = np.fmod(mask[ok], 2.0**32).astype(np.int64)  # the reasons are low bits; a mask can use all 64
    out = {}
    for bit, name in THROTTLE_REASONS.items():
        s = float(np.mean((bits & bit) != 0))
        if s > 0:
            out[name] = s
    return out


# ----------------------------------------------------------------------------------
# Host: the rule of thumb
# ----------------------------------------------------------------------------------


def gpu_util_at(devices: list[DeviceSeries], t: F64) -> F64:
    """Mean utilization.gpu over devices at times ``t``: each device's latest sample at or before."""
    cols = []
    for d in devices:
        u = d.col("util_pct")
        ok = np.isfinite(u)
        dt, du = d.t[ok], u[ok]
        if dt.size == 0:
            continue
        i = np.searchsorted(dt, t + 1e-9, side="right") - 1
        cols.append(np.where(i >= 0, du[np.clip(i, 0, None)], np.nan))
    if not cols:
        return np.full(t.shape, np.nan)
    stacked = np.vstack(cols)
    with np.errstate(all="ignore"):
        count = np.isfinite(stacked).sum(axis=0)
        total = np.nansum(stacked, axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


@dataclass(frozen=True, slots=True)
class HostClasses:
    """Per host sample inside the window: GPU mean util, weight, and which class the sample falls in."""

    weight: F64
    gpu: F64
    cpu: F64
    starved: np.ndarray
    saturated: np.ndarray
    idle: np.ndarray


def classify_host(devices: list[DeviceSeries], host: HostSeries, win: UtilWindow,
                  opt: UtilOptions) -> HostClasses:
    w_all = sample_weights(host.t, win.interval_s)
    sel, w = _clip(host.t, w_all, win)
    t = host.t[sel]
    cores = host.cpu_pct[sel]
    with np.errstate(all="ignore"):
        cpu = np.nanmean(cores, axis=1) if cores.size else np.full(t.shape, np.nan)
        hot = np.nanmax(cores, axis=1) if cores.size else np.full(t.shape, np.nan)
    gpu = gpu_util_at(devices, t)
    starved = np.isfinite(gpu) & (gpu < opt.starved_pct) & np.isfinite(cpu)
    saturated = starved & (cpu >= opt.cpu_saturated_pct)
    idle = starved & (cpu < opt.cpu_idle_pct) & ~(hot >= opt.hot_core_pct)
    return HostClasses(weight=w, gpu=gpu, cpu=cpu, starved=starved, saturated=saturated, idle=idle)


def host_util(devices: list[DeviceSeries], host: HostSeries, win: UtilWindow, opt: UtilOptions) -> HostUtil:
    c = classify_host(devices, host, win, opt)
    sel, _ = _clip(host.t, sample_weights(host.t, win.interval_s), win)
    w = c.weight

    def secs(mask: np.ndarray) -> float:
        return float(w[mask].sum())

    busy = np.isfinite(c.gpu) & ~c.starved
    disk = host.col("disk_read_mib_s")[sel]
    return HostUtil(
        cores=int(host.cpu_pct.shape[1]) if host.cpu_pct.ndim == 2 else 0,
        cpu_mean_pct=_nanmean(c.cpu, w) or 0.0,
        starved_s=secs(c.starved), starved_cpu_saturated_s=secs(c.saturated), starved_cpu_idle_s=secs(c.idle),
        starved_other_s=secs(c.starved & ~c.saturated & ~c.idle),
        cpu_when_starved_pct=_nanmean(c.cpu[c.starved], w[c.starved]),
        cpu_when_busy_pct=_nanmean(c.cpu[busy], w[busy]),
        disk_read_when_starved_mib_s=_nanmean(disk[c.starved], w[c.starved]),
        disk_read_when_busy_mib_s=_nanmean(disk[busy], w[busy]),
        proc_cpu_mean_pct=_nanmean(host.col("proc_cpu_pct")[sel], w),
        proc_rss_max_mib=_nanmax(host.col("proc_rss_mib")[sel]),
        mem_used_max_mib=_nanmax(host.col("mem_used_mib")[sel]),
        mem_total_mib=_nanmax(host.col("mem_total_mib")),
        disk_read_mean_mib_s=_nanmean(disk, w),
    )


def idle_equivalent(c: HostClasses, mask: np.ndarray) -> float:
    """GPU idle seconds in the samples ``mask`` selects: sum of weight x (1 - util)."""
    return float((c.weight[mask] * (1.0 - np.clip(c.gpu[mask], 0, 100) / 100.0)).sum())


def headroom_factor(used_mib: float, total_mib: float, usable: float = 0.9) -> int:
    """How many times the batch could grow if all used memory grew with it: ``floor(usable*total/used)``.

    Conservative: weights, optimizer state and the CUDA context do not grow with the batch.
    """
    if used_mib <= 0:
        return 1
    return max(1, math.floor(usable * total_mib / used_mib))
