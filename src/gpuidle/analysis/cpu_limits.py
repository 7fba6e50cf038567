"""The CPU the host lent a run, from the host samples of ``gpuidle run``/``monitor``: how much of the run the
cgroup's quota throttled, how fast the cores ran against their maximum, and how much time a hypervisor stole.

Pure: a :class:`~gpuidle.model.HostSeries` in, a :class:`~gpuidle.model.CpuLimits` and findings out. The
cgroup's counters are cumulative, so the run's figures are the difference between its first and last reading.
"""

from __future__ import annotations

import numpy as np

from gpuidle.analysis.counters import MIN_SHARE
from gpuidle.model import F64, Cause, CpuLimits, HostSeries, UtilFinding

SLOW_CLOCK_PCT = 80.0
"""Cores below this share of their maximum frequency on average run slow."""
STEAL_PCT = 5.0
"""Steal above this share of CPU time: a hypervisor gives the cores to other guests."""

NOT_READABLE = {
    "cgroup": "the cgroup's CPU controller (cpu.max/cpu.stat, or cpu.cfs_quota_us/cpu.stat)",
    "freq": "the cores' frequency (cpufreq, or a nominal clock in /proc/cpuinfo)",
    "steal": "steal time (/proc/stat)",
}


def _finite(col: F64) -> F64:
    return col[np.isfinite(col)]


def cpu_limits(host: HostSeries) -> CpuLimits:
    """The run's CPU limits, from a log whose host samples carry them."""
    version = _finite(host.col("cgroup_version"))
    freq = _finite(host.col("cpu_freq_pct"))
    steal = _finite(host.col("cpu_steal_pct"))
    out = CpuLimits()
    if version.size:
        out.cgroup_version = int(version[-1])
        quota = _finite(host.col("cpu_quota"))
        out.quota_cpus = float(quota.max()) if quota.size else None
        periods, throttled, held = (_finite(host.col(k)) for k in ("cg_periods", "cg_throttled", "cg_throttled_s"))
        if periods.size >= 2:
            n = int(max(periods[-1] - periods[0], 0))
            out.periods = n
            out.throttled_share = round(max(float(throttled[-1] - throttled[0]), 0.0) / n, 4) if n else 0.0
            out.throttled_s = round(max(float(held[-1] - held[0]), 0.0), 3)
    else:
        out.not_readable.append(NOT_READABLE["cgroup"])
    if freq.size:
        out.freq_pct, out.freq_min_pct = round(float(freq.mean()), 1), round(float(freq.min()), 1)
    else:
        out.not_readable.append(NOT_READABLE["freq"])
    if steal.size:
        out.steal_pct = round(float(steal.mean()), 2)
    else:
        out.not_readable.append(NOT_READABLE["steal"])
    out.summary = describe(out)
    return out


def describe(c: CpuLimits) -> str:
    """``throttled 23 % of the run (cgroup quota 4 CPUs) · cores at 97 % of their maximum clock · steal 0.0 %``."""
    bits = []
    if c.cgroup_version is None:
        bits.append("CPU quota and throttling not readable here")
    elif c.throttled_share is None:
        bits.append(f"cgroup v{c.cgroup_version}: {_quota(c.quota_cpus)}, too few readings for its throttling")
    elif c.quota_cpus is None:
        bits.append(f"no cgroup CPU quota (v{c.cgroup_version})")
    else:
        bits.append(f"throttled {c.throttled_share * 100:.0f} % of the run ({_quota(c.quota_cpus)}"
                    + (f", held back {c.throttled_s:,.1f} s" if c.throttled_s else "") + ")")
    bits.append("core frequency not readable here" if c.freq_pct is None
                else f"cores at {c.freq_pct:.0f} % of their maximum clock")
    bits.append("steal time not readable here" if c.steal_pct is None else f"steal {c.steal_pct:.1f} %")
    return " · ".join(bits)


def _quota(cpus: float | None) -> str:
    return "no quota" if cpus is None else f"cgroup quota {cpus:g} CPUs"


def cpu_findings(c: CpuLimits | None, found: list[UtilFinding]) -> list[UtilFinding]:
    """One ``cpu_throttled`` finding when the quota held the run back, the cores ran slow or a hypervisor stole
    time; tied to the data-loading idle (its GPU idle and cause) when the counters also show the run input-bound."""
    if c is None:
        return []
    what = []
    if c.throttled_share is not None and c.quota_cpus is not None and c.throttled_share >= MIN_SHARE:
        what.append(f"throttled {c.throttled_share * 100:.0f} % of the run ({_quota(c.quota_cpus)})")
    if c.freq_pct is not None and c.freq_pct < SLOW_CLOCK_PCT:
        what.append(f"cores at {c.freq_pct:.0f} % of their maximum clock")
    if c.steal_pct is not None and c.steal_pct >= STEAL_PCT:
        what.append(f"{c.steal_pct:.1f} % of CPU time stolen by the hypervisor")
    if not what:
        return []
    data = next((f for f in found if f.kind == "input_bound" or (f.kind == "waiting_comm_or_io"
                                                                  and f.cause == Cause.DATA_LOADING.value)), None)
    summary = "CPU " + "; ".join(what)
    if data is not None:
        summary += f": the data loading the GPUs waited {data.seconds:,.1f} s for ran on a CPU held back"
    return [UtilFinding(
        kind="cpu_throttled", scope="host", seconds=data.seconds if data is not None else 0.0,
        share=c.throttled_share or 0.0, summary=summary,
        cause=Cause.DATA_LOADING.value if data is not None else None,
        evidence={"quota_cpus": c.quota_cpus, "throttled_share": c.throttled_share, "throttled_s": c.throttled_s,
                  "cgroup_version": c.cgroup_version, "freq_pct": c.freq_pct, "steal_pct": c.steal_pct,
                  "data_loading_idle_s": round(data.seconds, 3) if data is not None else None},
    )]
