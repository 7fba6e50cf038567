"""Device counters: monitor records, the columns every counter source becomes, and the utilization report.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from .advice import Recommendation
from .jsonio import JsonStruct

# ----------------------------------------------------------------------------------
# Device counters: what ``gpuidle monitor``/``run`` record (one JSON line per sample),
# the columns every counter source becomes (:class:`UtilSeries`), and the
# utilization report (schema ``gpuidle.utilization/1``).
# ----------------------------------------------------------------------------------

F64 = npt.NDArray[np.float64]

MONITOR_FORMAT = "gpuidle.monitor/1"
"""The first line of a monitor log: ``{"type": "header", "format": "gpuidle.monitor/1", ...}``."""
UTIL_SCHEMA = "gpuidle.utilization/1"
UTIL_SCHEMA_MINOR = 1
"""1 adds ``host.cpu_limits`` and the ``cpu_throttled`` finding."""

GPU_METRICS: dict[str, str] = {
    "util_pct": "utilization.gpu: % of the sample period in which at least one kernel ran",
    "mem_util_pct": "utilization.memory: % of the sample period device memory was read or written",
    "mem_used_mib": "device memory used, MiB",
    "mem_total_mib": "device memory total, MiB",
    "sm_clock_mhz": "SM clock, MHz",
    "mem_clock_mhz": "memory clock, MHz",
    "power_w": "power draw, W",
    "power_limit_w": "enforced power limit, W",
    "temp_c": "GPU temperature, °C",
    "pcie_rx_mib_s": "PCIe receive throughput, MiB/s",
    "pcie_tx_mib_s": "PCIe transmit throughput, MiB/s",
    "nvlink_rx_mib_s": "NVLink receive throughput, all links, MiB/s",
    "nvlink_tx_mib_s": "NVLink transmit throughput, all links, MiB/s",
    "throttle_reasons": "clock event (throttle) reasons: NVML bitmask, see THROTTLE_REASONS",
    "sm_active": "DCGM SM_ACTIVE: share of time a warp was resident, averaged over all SMs, 0..1",
    "sm_occupancy": "DCGM SM_OCCUPANCY: resident warps / maximum warps, averaged over all SMs, 0..1",
    "tensor_active": "DCGM PIPE_TENSOR_ACTIVE: share of cycles the tensor pipes were busy, 0..1",
    "dram_active": "DCGM DRAM_ACTIVE: share of cycles device memory was sending or receiving, 0..1",
}
"""Column name -> meaning and unit. Column names carry their unit; NaN means not available."""

HOST_METRICS: dict[str, str] = {
    "mem_used_mib": "host memory in use (total - available), MiB",
    "mem_total_mib": "host memory total, MiB",
    "disk_read_mib_s": "read throughput summed over all disks, MiB/s",
    "proc_cpu_pct": "CPU of the wrapped command's process tree, % of one core (400 = four cores busy)",
    "proc_rss_mib": "resident memory of the wrapped command's process tree, MiB",
    "procs": "processes in the wrapped command's tree",
    "cgroup_version": "the cgroup version whose CPU controller was read (1 or 2); absent: not readable here",
    "cpu_quota": "CPUs the cgroup's quota allows (quota / period); absent with a cgroup read: no quota",
    "cg_periods": "the cgroup's enforcement periods so far (cpu.stat nr_periods, cumulative)",
    "cg_throttled": "periods in which the cgroup was throttled (cpu.stat nr_throttled, cumulative)",
    "cg_throttled_s": "time the cgroup's processes were held back by the quota, s (cumulative)",
    "cpu_freq_pct": "the cores' mean frequency, % of their maximum",
    "cpu_steal_pct": "CPU time the hypervisor gave to others (steal), % of all CPU time since the last full sample",
}
"""Host columns besides ``cpu_pct`` (one column per core, % busy)."""

THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML clock event reason bits, named as nvidia-smi's ``clocks_event_reasons.*`` fields."""

SLOWDOWN_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""Reasons that lower clocks under load: power cap, hardware, thermal and power-brake slowdowns."""


class GpuInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    name: str | None = None
    uuid: str | None = None
    mem_total_mib: float | None = None


class MonitorHeader(msgspec.Struct, tag="header", kw_only=True, omit_defaults=True):
    """First line of a monitor log: what was sampled, from when, how often."""

    format: str
    """:data:`MONITOR_FORMAT`; always written, so a reader can tell the log's version."""
    t0: float
    """Unix time of the start, in seconds."""
    interval_s: float
    gpus: list[GpuInfo] = []
    cores: int | None = None
    command: list[str] | None = None
    gpu_unavailable: str | None = None
    """Why there are no GPU samples (no NVML, no driver), or None."""
    notes: list[str] = msgspec.field(default_factory=list)
    cpu_limits: bool = False
    """The host samples carry the CPU limits (:class:`CpuLimits`): a field absent from them was not readable."""


class GpuSample(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One device at one instant; ``None`` is an explicit "not available". Keys as :data:`GPU_METRICS`."""

    index: int
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    pcie_rx_mib_s: float | None = None
    pcie_tx_mib_s: float | None = None
    nvlink_rx_mib_s: float | None = None
    nvlink_tx_mib_s: float | None = None
    throttle_reasons: int | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    pids: list[int] | None = None
    """Processes holding a context on the device."""


class HostSample(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The host at the same instant. Keys as :data:`HOST_METRICS`."""

    cpu_pct: list[float] = []
    """Per core, % busy since the previous sample."""
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    disk_read_mib_s: float | None = None
    proc_cpu_pct: float | None = None
    proc_rss_mib: float | None = None
    procs: int | None = None
    cgroup_version: int | None = None
    cpu_quota: float | None = None
    cg_periods: int | None = None
    cg_throttled: int | None = None
    cg_throttled_s: float | None = None
    cpu_freq_pct: float | None = None
    cpu_steal_pct: float | None = None


MAX_UNIX_S = 1e11
"""Later than any sample (the year 5138, in Unix seconds)."""


def plausible_unix_s(t: float) -> bool:
    """A sample's time a counter log may hold: from 1970 to :data:`MAX_UNIX_S` (NaN and infinities not; two
    times of ±1e308 seconds would span infinity)."""
    return 0 <= t < MAX_UNIX_S


class MonitorSample(msgspec.Struct, tag="sample", kw_only=True, omit_defaults=True):
    """One batched sample: every device and the host, read together."""

    t: float
    """Unix time, seconds."""
    gpus: list[GpuSample] = []
    host: HostSample | None = None


class MonitorEnd(msgspec.Struct, tag="end", kw_only=True, omit_defaults=True):
    t: float
    samples: int
    exit_code: int | None = None
    """The wrapped command's exit code (``gpuidle run``)."""
    devices: list[int] | None = None
    """The GPUs the wrapped command's processes used (``gpuidle run``); None: not known."""
    notes: list[str] = msgspec.field(default_factory=list)


MonitorRecord = MonitorHeader | MonitorSample | MonitorEnd


class DeviceSeries(msgspec.Struct, frozen=True):
    """One device's samples in columns: times in seconds from :attr:`UtilSeries.t0`."""

    device: int
    name: str | None
    t: F64
    values: dict[str, F64]
    """:data:`GPU_METRICS` keys; a column absent or NaN is not available."""
    pids: list[list[int]] | None = None

    def col(self, key: str) -> F64:
        v = self.values.get(key)
        return v if v is not None else np.full(self.t.shape, np.nan)

    def has(self, key: str) -> bool:
        v = self.values.get(key)
        return v is not None and bool(np.isfinite(v).any())

    def __len__(self) -> int:
        return int(self.t.shape[0])


class HostSeries(msgspec.Struct, frozen=True):
    t: F64
    cpu_pct: F64
    """Shape ``(samples, cores)``, % busy per core."""
    values: dict[str, F64]
    """:data:`HOST_METRICS` keys."""

    def col(self, key: str) -> F64:
        v = self.values.get(key)
        return v if v is not None else np.full(self.t.shape, np.nan)

    def __len__(self) -> int:
        return int(self.t.shape[0])


class UtilSeries(msgspec.Struct):
    """Device counters over time, whatever recorded them (gpuidle, nvidia-smi, dmon)."""

    devices: list[DeviceSeries]
    host: HostSeries | None
    format: str
    """``gpuidle.monitor/1``, ``nvidia-smi-csv`` or ``nvidia-smi-dmon``."""
    paths: list[str]
    t0: float | None
    """Unix time of ``t = 0``, when the source says."""
    interval_s: float | None
    """The nominal sampling interval, when known."""
    command: list[str] | None = None
    exit_code: int | None = None
    used_devices: list[int] | None = None
    """The GPUs the wrapped command used, when the log says."""
    gpu_unavailable: str | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    cpu_limits: bool = False
    """The host samples carry the CPU limits; False for logs that did not read them."""

    def device(self, index: int) -> DeviceSeries | None:
        return next((d for d in self.devices if d.device == index), None)


def _column(values: list[Any]) -> F64:
    """Floats with None as NaN."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def util_series_from_records(
    header: MonitorHeader, samples: list[MonitorSample], end: MonitorEnd | None = None, path: str | None = None,
) -> UtilSeries:
    """Columns from a monitor log's records. A device missing from a sample reads NaN there."""
    t_abs = np.array([s.t for s in samples], dtype=np.float64)
    t = t_abs - header.t0
    names = {g.index: g.name for g in header.gpus}
    indices = sorted({g.index for g in header.gpus} | {g.index for s in samples for g in s.gpus})
    devices = []
    for idx in indices:
        rows = [next((g for g in s.gpus if g.index == idx), None) for s in samples]
        values = {key: _column([getattr(g, key) if g is not None else None for g in rows]) for key in GPU_METRICS}
        pids = [list(g.pids or []) if g is not None else [] for g in rows]
        devices.append(DeviceSeries(device=idx, name=names.get(idx), t=t, values=values, pids=pids))
    host = None
    hosts = [s.host for s in samples]
    if any(h is not None for h in hosts):
        cores = header.cores or max((len(h.cpu_pct) for h in hosts if h is not None), default=0)
        cpu = np.full((len(samples), cores), np.nan)
        for i, h in enumerate(hosts):
            if h is not None and h.cpu_pct:
                n = min(cores, len(h.cpu_pct))
                cpu[i, :n] = h.cpu_pct[:n]
        values = {key: _column([getattr(h, key) if h is not None else None for h in hosts]) for key in HOST_METRICS}
        host = HostSeries(t=t, cpu_pct=cpu, values=values)
    notes = list(header.notes) + (list(end.notes) if end is not None else [])
    return UtilSeries(
        devices=devices, host=host, format=header.format, paths=[path] if path else [], t0=header.t0,
        interval_s=header.interval_s, command=header.command, exit_code=end.exit_code if end else None,
        used_devices=end.devices if end else None, gpu_unavailable=header.gpu_unavailable, notes=notes,
        cpu_limits=header.cpu_limits,
    )


class IdlePeriod(msgspec.Struct):
    start_s: float
    """Seconds from the start of the log."""
    dur_s: float
    mean_util_pct: float


class PeriodicDrops(msgspec.Struct):
    """Utilization falls below ``threshold_pct`` at a regular period: something runs every N seconds."""

    threshold_pct: float
    period_s: float
    """Median time from one drop's start to the next."""
    drop_s: float
    """Median duration of a drop."""
    count: int
    regularity: float
    """Share of the gaps between drops within tolerance of the period."""
    period_steps: float | None = None
    """The period in training steps, when the step rate is known."""
    drop_steps: float | None = None


class DeviceUtil(msgspec.Struct, kw_only=True):
    device: int
    name: str | None
    samples: int
    window_s: float
    mean_util_pct: float
    """Time-weighted mean of utilization.gpu over the window."""
    median_util_pct: float
    below_80_s: float
    below_80_share: float
    below_90_s: float
    below_90_share: float
    idle_s: float
    """Time below the idle threshold (10 % by default)."""
    idle_share: float
    idle_period_count: int
    idle_periods: list[IdlePeriod]
    """The longest idle periods, longest first."""
    periodic: PeriodicDrops | None = None
    mem_util_mean_pct: float | None = None
    mem_used_max_mib: float | None = None
    mem_total_mib: float | None = None
    mem_headroom_share: float | None = None
    """``1 - max used / total``."""
    power_mean_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mean_mhz: float | None = None
    temp_max_c: float | None = None
    throttle_share: dict[str, float] = {}
    """Clock event reason -> share of busy samples in which it was active."""
    pcie_rx_mean_mib_s: float | None = None
    pcie_tx_mean_mib_s: float | None = None
    nvlink_rx_mean_mib_s: float | None = None
    nvlink_tx_mean_mib_s: float | None = None
    sm_active_mean: float | None = None
    sm_occupancy_mean: float | None = None
    tensor_active_mean: float | None = None
    dram_active_mean: float | None = None


class CpuLimits(msgspec.Struct, kw_only=True):
    """The CPU the host lent the run: cgroup quota and throttling, the cores' frequency, steal time.

    A field that is None was not readable here (``not_readable`` names the source); it is never read as zero.
    """

    cgroup_version: int | None = None
    quota_cpus: float | None = None
    """CPUs the cgroup's quota allows; None with a cgroup read: no quota."""
    periods: int | None = None
    """The cgroup's enforcement periods during the run."""
    throttled_share: float | None = None
    """Share of those periods in which the quota held the cgroup back."""
    throttled_s: float | None = None
    """Time the cgroup's processes were held back, summed over them."""
    freq_pct: float | None = None
    """The cores' mean frequency, % of their maximum."""
    freq_min_pct: float | None = None
    steal_pct: float | None = None
    """CPU time a hypervisor gave to others, % of all CPU time."""
    not_readable: list[str] = []
    summary: str = ""
    """``throttled 23 % of the run (cgroup quota 4 CPUs) · cores at 97 % of their maximum clock · steal 0.0 %``."""


class HostUtil(msgspec.Struct, kw_only=True):
    cores: int
    cpu_mean_pct: float
    """Mean over cores and time of % busy."""
    starved_s: float
    """Time the GPUs ran below the starved threshold (50 % by default) inside the window."""
    starved_cpu_saturated_s: float
    """... while the host CPU was saturated: input or CPU bound."""
    starved_cpu_idle_s: float
    """... while the host CPU was idle too: waiting on communication or I/O."""
    starved_other_s: float
    cpu_when_starved_pct: float | None = None
    cpu_when_busy_pct: float | None = None
    disk_read_when_starved_mib_s: float | None = None
    disk_read_when_busy_mib_s: float | None = None
    proc_cpu_mean_pct: float | None = None
    proc_rss_max_mib: float | None = None
    mem_used_max_mib: float | None = None
    mem_total_mib: float | None = None
    disk_read_mean_mib_s: float | None = None
    cpu_limits: CpuLimits | None = None
    """None: a log that did not record them (another tool's, or gpuidle's before utilization schema minor 1)."""


class UtilFinding(msgspec.Struct, kw_only=True):
    """What the counters show, in numbers: the utilization counterpart of a trace finding."""

    kind: str
    """``low_utilization``, ``periodic_drops``, ``imbalance``, ``input_bound``, ``waiting_comm_or_io``,
    ``memory_headroom``, ``throttling``, ``sm_underused`` or ``cpu_throttled``."""
    scope: str
    """``device N``, ``all devices`` or ``host``."""
    seconds: float
    """The time the finding accounts for: for idle kinds, GPU idle time (a sample at u % counts
    ``1 - u/100`` of its duration) per analysed device on average; 0 for ``memory_headroom``."""
    share: float
    """That time as a share of the window (``memory_headroom``: the free memory share)."""
    summary: str
    evidence: dict[str, Any]
    cause: str | None = None
    """The idle cause it points to (:class:`Cause`), when one does."""
    device: int | None = None


class UtilWindow(msgspec.Struct):
    """The span analysed: the log minus GPU idle at its start and end (model loading, teardown)."""

    start_s: float
    dur_s: float
    leading_idle_s: float
    trailing_idle_s: float
    interval_s: float
    """Median time between samples."""


class UtilSource(msgspec.Struct, kw_only=True):
    paths: list[str]
    format: str
    command: list[str] | None = None
    exit_code: int | None = None


class UtilizationReport(JsonStruct, kw_only=True):
    schema: str = UTIL_SCHEMA
    schema_minor: int = UTIL_SCHEMA_MINOR
    source: UtilSource
    window: UtilWindow
    devices: list[DeviceUtil]
    host: HostUtil | None = None
    gpu_unavailable: str | None = None
    findings: list[UtilFinding]
    recommendations: list[Recommendation]
    notes: list[str] = msgspec.field(default_factory=list)


