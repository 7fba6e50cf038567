"""Utilization findings from device counters: idle periods, periodic drops, imbalance, memory headroom,
throttling, and the rule of thumb that tells input-bound from communication-bound, made quantitative.

Pure and deterministic: a :class:`~gpuidle.model.UtilSeries` in, a :class:`UtilAnalysis` out; the
time-weighted statistics it stands on are in :mod:`gpuidle.analysis.counters`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuidle.analysis.counter_range import without_impossible_values
from gpuidle.analysis.counters import (
    DEFAULT_OPTIONS,
    MIN_SHARE,
    TARGET_PCT,
    UtilOptions,
    classify_host,
    device_util,
    find_window,
    headroom_factor,
    host_util,
    idle_equivalent,
    median_interval,
)
from gpuidle.analysis.cpu_limits import cpu_findings, cpu_limits
from gpuidle.model import (
    SLOWDOWN_REASONS,
    THROTTLE_REASONS,
    Cause,
    DeviceSeries,
    DeviceUtil,
    HostSeries,
    HostUtil,
    PeriodicDrops,
    UtilFinding,
    UtilSeries,
    UtilWindow,
)


@dataclass(frozen=True, slots=True)
class UtilAnalysis:
    window: UtilWindow
    devices: list[DeviceUtil]
    host: HostUtil | None
    findings: list[UtilFinding]
    notes: list[str]


# ----------------------------------------------------------------------------------
# Findings
# ----------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{x:.1f} %"


def _steps(p: PeriodicDrops) -> str:
    if p.period_steps is None or p.drop_steps is None:
        return ""
    return f" (every ~{p.period_steps:.0f} steps, ~{p.drop_steps:.0f} steps long)"


def describe_drops(p: PeriodicDrops) -> str:
    """``drops below 10 % every 60.0 s for ~8.0 s (5 times)``."""
    return (f"drops below {p.threshold_pct:g} % every {p.period_s:.1f} s for ~{p.drop_s:.1f} s "
            f"({p.count} times){_steps(p)}")


def _scope(devs: list[DeviceUtil]) -> str:
    return f"device {devs[0].device}" if len(devs) == 1 else "all devices"


def _findings(devs: list[DeviceUtil], series_devices: list[DeviceSeries], host: HostSeries | None,
              hu: HostUtil | None, win: UtilWindow, opt: UtilOptions) -> list[UtilFinding]:
    out: list[UtilFinding] = []
    if not devs:
        return out
    span = win.dur_s or 1.0
    means = {d.device: d.mean_util_pct for d in devs}
    avg = float(np.mean(list(means.values())))
    if avg < TARGET_PCT:
        lost = float(np.mean([d.window_s * (1 - d.mean_util_pct / 100) for d in devs]))
        below = float(np.mean([d.below_80_share for d in devs]))
        out.append(UtilFinding(
            kind="low_utilization", scope=_scope(devs), seconds=lost, share=1 - avg / 100,
            summary=f"mean utilization {_pct(avg)} (target {TARGET_PCT:.0f} %); below 80 % for "
                    f"{below * 100:.0f} % of the time",
            evidence={"mean_util_pct": {str(k): round(v, 2) for k, v in means.items()},
                      "below_80_share": round(below, 4)},
            device=devs[0].device if len(devs) == 1 else None,
        ))
    out.extend(_periodic_findings(devs, span, opt))
    if len(devs) > 1:
        lo = min(devs, key=lambda d: (d.mean_util_pct, d.device))
        hi = max(devs, key=lambda d: (d.mean_util_pct, -d.device))
        spread = hi.mean_util_pct - lo.mean_util_pct
        if spread >= 10.0:
            out.append(UtilFinding(
                kind="imbalance", scope=f"device {lo.device}", seconds=lo.window_s * spread / 100 / len(devs),
                share=spread / 100, device=lo.device,
                summary=f"device {lo.device} averages {_pct(lo.mean_util_pct)} while device {hi.device} averages "
                        f"{_pct(hi.mean_util_pct)} (spread {spread:.1f} points)",
                evidence={"lowest_device": lo.device, "lowest_util_pct": round(lo.mean_util_pct, 2),
                          "highest_device": hi.device, "highest_util_pct": round(hi.mean_util_pct, 2),
                          "spread_points": round(spread, 2)},
            ))
    if host is not None and hu is not None and hu.starved_s > 0:
        out.extend(_host_findings(series_devices, host, hu, win, opt))
    out.extend(_memory_findings(devs, avg, opt))
    out.extend(_throttle_findings(devs, span))
    out.extend(_sm_findings(devs))
    return out


def _periodic_findings(devs: list[DeviceUtil], span: float, opt: UtilOptions) -> list[UtilFinding]:
    if not any(d.periodic is not None for d in devs):
        return []
    found = [(d, d.periodic) for d in devs if d.periodic is not None]
    first = found[0][1]
    same = len(found) == len(devs) > 1 and all(abs(p.period_s - first.period_s) <= 0.2 * first.period_s
                                                for _, p in found)
    groups = [found] if same else [[x] for x in found]
    out = []
    for g in groups:
        p = g[0][1]
        lost = sum(q.count * q.drop_s for _, q in g) / len(devs)
        out.append(UtilFinding(
            kind="periodic_drops", scope=_scope([d for d, _ in g]),
            seconds=lost, share=lost / span, device=g[0][0].device if len(g) == 1 else None,
            summary=f"utilization {describe_drops(p)}",
            evidence={"threshold_pct": p.threshold_pct, "period_s": round(p.period_s, 3),
                      "drop_s": round(p.drop_s, 3), "count": p.count, "regularity": round(p.regularity, 3),
                      "period_steps": None if p.period_steps is None else round(p.period_steps, 1),
                      "devices": [d.device for d, _ in g]},
        ))
    return out


def _host_findings(devices: list[DeviceSeries], host: HostSeries, hu: HostUtil, win: UtilWindow,
                   opt: UtilOptions) -> list[UtilFinding]:
    c = classify_host(devices, host, win, opt)
    span = win.dur_s or 1.0
    out = []
    sat_idle = idle_equivalent(c, c.saturated)
    if hu.starved_cpu_saturated_s / span >= MIN_SHARE:
        out.append(UtilFinding(
            kind="input_bound", scope="host", cause=Cause.DATA_LOADING.value, seconds=sat_idle,
            share=hu.starved_cpu_saturated_s / span,
            summary=f"GPUs below {opt.starved_pct:.0f} % for {hu.starved_s:.1f} s while all {hu.cores} CPU cores "
                    f"were saturated ({_pct(float(np.average(c.cpu[c.saturated], weights=c.weight[c.saturated])))}"
                    f" busy) in {hu.starved_cpu_saturated_s:.1f} s of it: input/CPU bound",
            evidence={"starved_s": round(hu.starved_s, 3), "cpu_saturated_s": round(hu.starved_cpu_saturated_s, 3),
                      "cores": hu.cores, "gpu_idle_s": round(sat_idle, 3),
                      "cpu_when_starved_pct": _r(hu.cpu_when_starved_pct),
                      "cpu_when_busy_pct": _r(hu.cpu_when_busy_pct)},
        ))
    idle_idle = idle_equivalent(c, c.idle)
    if hu.starved_cpu_idle_s / span >= MIN_SHARE:
        ds, db = hu.disk_read_when_starved_mib_s, hu.disk_read_when_busy_mib_s
        io = ds is not None and ds >= 50.0 and (db is None or ds >= 2 * max(db, 1.0))
        what = (f"disk reads rise to {ds:.0f} MiB/s then (vs {db or 0.0:.0f} MiB/s when busy): likely storage I/O"
                if io else "waiting on communication or I/O")
        out.append(UtilFinding(
            kind="waiting_comm_or_io", scope="host",
            cause=(Cause.DATA_LOADING if io else Cause.COMMUNICATION).value, seconds=idle_idle,
            share=hu.starved_cpu_idle_s / span,
            summary=f"GPUs below {opt.starved_pct:.0f} % while the CPU was mostly idle "
                    f"({_pct(float(np.average(c.cpu[c.idle], weights=c.weight[c.idle])))} busy) for "
                    f"{hu.starved_cpu_idle_s:.1f} s: {what}",
            evidence={"starved_s": round(hu.starved_s, 3), "cpu_idle_s": round(hu.starved_cpu_idle_s, 3),
                      "gpu_idle_s": round(idle_idle, 3), "disk_read_when_starved_mib_s": _r(ds),
                      "disk_read_when_busy_mib_s": _r(db), "storage_io": io},
        ))
    return out


def _r(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def _memory_findings(devs: list[DeviceUtil], avg: float, opt: UtilOptions) -> list[UtilFinding]:
    known = [d for d in devs if d.mem_headroom_share is not None and d.mem_used_max_mib and d.mem_total_mib]
    if not known:
        return []
    tight = min(known, key=lambda d: (d.mem_headroom_share or 0.0, d.device))
    used, total, free = tight.mem_used_max_mib or 0.0, tight.mem_total_mib or 0.0, tight.mem_headroom_share or 0.0
    k = headroom_factor(used, total)
    if free < opt.min_headroom or k < 2:
        return []
    return [UtilFinding(
        kind="memory_headroom", scope=_scope(devs), seconds=0.0, share=free,
        device=tight.device if len(devs) == 1 else None,
        summary=f"peak device memory {used / 1024:.1f} of {total / 1024:.1f} GiB ({free * 100:.0f} % free) on the "
                f"fullest device: room for a ~{k}x larger batch",
        evidence={"device": tight.device, "mem_used_max_mib": round(used, 1), "mem_total_mib": round(total, 1),
                  "batch_factor": k, "mean_util_pct": round(avg, 2)},
    )]


def _throttle_findings(devs: list[DeviceUtil], span: float) -> list[UtilFinding]:
    out = []
    for d in devs:
        slow = {k: v for k, v in d.throttle_share.items()
                if any(THROTTLE_REASONS[b] == k for b in THROTTLE_REASONS if b & SLOWDOWN_REASONS) and v >= 0.1}
        if not slow:
            continue
        name, share = max(slow.items(), key=lambda kv: kv[1])
        busy_s = d.window_s - d.idle_s
        out.append(UtilFinding(
            kind="throttling", scope=f"device {d.device}", device=d.device, seconds=busy_s * share,
            share=busy_s * share / span,
            summary=f"device {d.device}: clocks slowed by {name} in {share * 100:.0f} % of busy samples"
                    + (f" (mean SM clock {d.sm_clock_mean_mhz:.0f} MHz)" if d.sm_clock_mean_mhz else ""),
            evidence={"reasons": {k: round(v, 3) for k, v in slow.items()},
                      "sm_clock_mean_mhz": _r(d.sm_clock_mean_mhz, 0), "temp_max_c": d.temp_max_c,
                      "power_mean_w": _r(d.power_mean_w, 1), "power_limit_w": _r(d.power_limit_w, 1)},
        ))
    return out


def _sm_findings(devs: list[DeviceUtil]) -> list[UtilFinding]:
    out = []
    for d in devs:
        if d.sm_active_mean is None or d.mean_util_pct < 70.0 or d.sm_active_mean >= 0.5:
            continue
        out.append(UtilFinding(
            kind="sm_underused", scope=f"device {d.device}", device=d.device, seconds=0.0,
            share=1 - d.sm_active_mean,
            summary=f"device {d.device}: utilization.gpu {_pct(d.mean_util_pct)} but SMs active only "
                    f"{d.sm_active_mean * 100:.0f} % of the time: kernels too small to fill the GPU",
            evidence={"util_pct": round(d.mean_util_pct, 2), "sm_active": round(d.sm_active_mean, 3),
                      "sm_occupancy": _r(d.sm_occupancy_mean, 3), "tensor_active": _r(d.tensor_active_mean, 3)},
        ))
    return out


UTIL_GPU_NOTE = ("utilization.gpu is the share of time in which at least one kernel ran, not how much of the GPU "
                 "it used: 100 % can still leave most SMs idle")


def analyze(series: UtilSeries, opt: UtilOptions = DEFAULT_OPTIONS) -> UtilAnalysis:
    """Everything the counters say, over the window where the GPUs worked."""
    notes = list(series.notes)
    devices = series.devices
    if opt.devices is not None:
        devices = [d for d in series.devices if d.device in opt.devices]
    elif series.used_devices:
        devices = [d for d in series.devices if d.device in series.used_devices]
        notes.append(f"devices used by the command: {sorted(series.used_devices)}")
    elif series.used_devices is not None and series.devices:
        notes.append("the command's processes were not seen on any GPU (another PID namespace?): "
                     "all devices analysed")
    devices, impossible = without_impossible_values(devices)
    notes.extend(impossible)
    interval = median_interval(series)
    host = series.host if series.host is not None and len(series.host) else None
    win = find_window(devices, host, interval, opt.idle_pct)
    devs = [device_util(d, win, opt) for d in devices if len(d)]
    hu = host_util(devices, host, win, opt) if host is not None else None
    if hu is not None and host is not None and series.cpu_limits:
        hu.cpu_limits = cpu_limits(host)
    if devs:
        if any(d.sm_active_mean is not None for d in devs):
            notes.append(UTIL_GPU_NOTE + "; SM_ACTIVE (DCGM) measures the SM array itself")
        else:
            notes.append(UTIL_GPU_NOTE + "; for SM_ACTIVE, run with DCGM (--dcgm-url, or dcgmi on PATH)")
        if all(d.idle_share >= 1.0 for d in devs):
            notes.append("the GPUs were idle for the whole log")
    if host is None and devs:
        notes.append("no host CPU samples in this log: record with gpuidle run to tell input-bound from "
                     "communication-bound")
    findings = _findings(devs, devices, host, hu, win, opt)
    findings += cpu_findings(hu.cpu_limits if hu is not None else None, findings)
    return UtilAnalysis(window=win, devices=devs, host=hu, findings=findings, notes=notes)
