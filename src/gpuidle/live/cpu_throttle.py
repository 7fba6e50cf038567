"""The CPU the host lends the job: its cgroup quota and throttling, its cores' frequency, the steal time of a VM.

Read from ``/sys`` and ``/proc`` (their roots are arguments, so tests give fake trees):

- the cgroup of a process (``/proc/PID/cgroup``): v2 ``cpu.max`` and ``cpu.stat`` (``nr_periods``,
  ``nr_throttled``, ``throttled_usec``); v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` and ``cpu.stat``
  (``throttled_time`` in ns), under the hierarchy that holds the ``cpu`` controller;
- each core's frequency against its maximum: ``cpufreq/scaling_cur_freq`` over ``cpuinfo_max_freq``, else
  ``/proc/cpuinfo``'s ``cpu MHz`` over the nominal clock in its model name (``@ 2.20GHz``);
- steal time: the ``steal`` column of ``/proc/stat``'s ``cpu`` line, as a share of all CPU time between reads.

A file that cannot be read leaves its field ``None`` (said "not readable here" in the summary), never zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpuidle.model import HostSample

_NOMINAL = re.compile(r"@\s*([0-9.]+)\s*GHz", re.IGNORECASE)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _stat(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass(frozen=True, slots=True)
class CgroupCpu:
    """One reading of a cgroup's CPU controller; the counters are cumulative since the cgroup was made."""

    version: int
    quota_cpus: float | None
    """CPUs the quota allows (quota / period); None: no quota (``max``, ``-1``)."""
    periods: int
    throttled: int
    throttled_s: float


def _cgroup_paths(proc: Path, pid: int | None) -> dict[str, str]:
    """Controller (``""`` for v2's unified hierarchy) -> the process's cgroup path."""
    text = _read(proc / (str(pid) if pid is not None else "self") / "cgroup")
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(","):
            out[ctrl] = parts[2]
    return out


def _within(root: Path, rel: str) -> list[Path]:
    """The cgroup's folder, then each parent up to the root (a container sees its own cgroup as ``/``)."""
    base = root / rel.strip("/")
    return [base, *[p for p in base.parents if p.is_relative_to(root)]] if rel.strip("/") else [root]


def read_cgroup(sys_root: Path, proc_root: Path, pid: int | None = None) -> CgroupCpu | None:
    """The CPU controller of ``pid``'s cgroup (this process's by default); None when not readable."""
    paths = _cgroup_paths(proc_root, pid)
    fs = sys_root / "fs" / "cgroup"
    if "cpu" in paths:
        for d in (fs / "cpu", fs / "cpu,cpuacct", fs / "cpuacct,cpu"):
            for folder in _within(d, paths["cpu"]):
                got = _v1(folder)
                if got is not None:
                    return got
    if "" in paths:
        for d in (fs, fs / "unified"):
            for folder in _within(d, paths[""]):
                got = _v2(folder)
                if got is not None:
                    return got
    return None


def _v2(folder: Path) -> CgroupCpu | None:
    text, limit = _read(folder / "cpu.stat"), _read(folder / "cpu.max")
    if text is None or limit is None:
        return None
    st = _stat(text)
    parts = limit.split()
    quota = None
    if len(parts) == 2 and parts[0] != "max" and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]) > 0:
        quota = int(parts[0]) / int(parts[1])
    return CgroupCpu(version=2, quota_cpus=quota, periods=st.get("nr_periods", 0),
                     throttled=st.get("nr_throttled", 0), throttled_s=st.get("throttled_usec", 0) / 1e6)


def _v1(folder: Path) -> CgroupCpu | None:
    text = _read(folder / "cpu.stat")
    q, p = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if text is None or q is None or p is None:
        return None
    st = _stat(text)
    quota_us, period_us = q.strip(), p.strip()
    quota = None
    if quota_us.isdigit() and period_us.isdigit() and int(period_us) > 0:
        quota = int(quota_us) / int(period_us)
    return CgroupCpu(version=1, quota_cpus=quota, periods=st.get("nr_periods", 0),
                     throttled=st.get("nr_throttled", 0), throttled_s=st.get("throttled_time", 0) / 1e9)


def read_freq_pct(sys_root: Path, proc_root: Path) -> float | None:
    """The cores' mean frequency as % of their maximum; None when neither cpufreq nor cpuinfo says."""
    ratios = []
    for core in sorted((sys_root / "devices" / "system" / "cpu").glob("cpu[0-9]*")):
        cur, top = _read(core / "cpufreq" / "scaling_cur_freq"), _read(core / "cpufreq" / "cpuinfo_max_freq")
        if cur is None or top is None or not cur.strip().isdigit() or not top.strip().isdigit():
            continue
        if int(top) > 0:
            ratios.append(int(cur) / int(top))
    if not ratios:
        ratios = _cpuinfo_ratios(_read(proc_root / "cpuinfo") or "")
    return round(sum(ratios) / len(ratios) * 100.0, 1) if ratios else None


def _cpuinfo_ratios(text: str) -> list[float]:
    ratios, nominal = [], None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name":
            m = _NOMINAL.search(value)
            nominal = float(m.group(1)) * 1000.0 if m else None
        elif key == "cpu MHz" and nominal:
            try:
                ratios.append(float(value) / nominal)
            except ValueError:
                continue
    return ratios


def read_steal(proc_root: Path) -> tuple[int, int] | None:
    """``(steal, total)`` jiffies from ``/proc/stat``'s ``cpu`` line; None without a steal column."""
    for line in (_read(proc_root / "stat") or "").splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            nums = [int(x) for x in parts[1:] if x.isdigit()]
            if len(nums) < 8:
                return None
            # guest and guest_nice (columns 9 and 10) are counted in user and nice already
            return nums[7], sum(nums[:8])
    return None


class CpuThrottleProbe:
    """Fills a host sample's CPU-limit fields; ``pid`` is the process whose cgroup counts (the wrapped command)."""

    def __init__(self, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> None:
        self.sys_root, self.proc_root = sys_root, proc_root
        self._steal = read_steal(proc_root)

    def fill(self, s: HostSample, pid: int | None) -> None:
        cg = read_cgroup(self.sys_root, self.proc_root, pid)
        if cg is None and pid is not None:
            cg = read_cgroup(self.sys_root, self.proc_root, None)
        if cg is not None:
            s.cgroup_version = cg.version
            s.cpu_quota = cg.quota_cpus
            s.cg_periods, s.cg_throttled, s.cg_throttled_s = cg.periods, cg.throttled, cg.throttled_s
        s.cpu_freq_pct = read_freq_pct(self.sys_root, self.proc_root)
        now, before = read_steal(self.proc_root), self._steal
        self._steal = now
        if now is not None and before is not None and now[1] > before[1]:
            s.cpu_steal_pct = round(max(now[0] - before[0], 0) / (now[1] - before[1]) * 100.0, 2)
