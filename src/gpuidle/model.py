"""The core model: one columnar :class:`Timeline` per rank, and the report it becomes.

This module is the ground floor of the package. It imports nothing of ours, so any
source, analysis, advice or renderer may import it.

Times inside a :class:`Timeline` are integer nanoseconds (``int64``) measured from
``meta.t0_ns``, the earliest timestamp of the trace; add ``t0_ns`` back to get the
trace's own clock. Reports carry seconds as floats, as the JSON contract says.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]

SCHEMA = "gpuidle.analysis/1"
SCHEMA_MINOR = 1
"""Minor version of :data:`SCHEMA`: additions only (1: the ``job`` object)."""


class Cause(enum.StrEnum):
    """Why a device was idle. Every idle nanosecond gets exactly one cause.

    The order is the order of reports, not a priority; see ``analysis.idle`` for that.
    """

    DATA_LOADING = "data_loading"
    HOST_SYNC = "host_sync"
    LAUNCH_OVERHEAD = "launch_overhead"
    CPU_COMPUTE = "cpu_compute"
    MEMCPY = "memcpy"
    COMMUNICATION = "communication"
    STRAGGLER_WAIT = "straggler_wait"
    UNATTRIBUTED = "unattributed"


CAUSES: tuple[Cause, ...] = tuple(Cause)


class DeviceOpKind(enum.IntEnum):
    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    COLLECTIVE = 3
    """A communication kernel (NCCL/RCCL); not compute, see ``analysis.idle``."""


class HostKind(enum.IntEnum):
    OP = 0
    """An operator (``cpu_op``): dispatcher work that may launch device work."""
    RUNTIME = 1
    """A CUDA/HIP runtime or driver call (launch, copy, synchronize, ...)."""
    ANNOTATION = 2
    """A ``record_function`` range: profiler steps, DataLoader, user ranges."""


class CopyKind(enum.IntEnum):
    NONE = 0
    HTOD_PAGEABLE = 1
    HTOD_PINNED = 2
    HTOD = 3
    """Host to device, memory kind not recorded (ROCm writes ``Host -> Device``)."""
    DTOH_PAGEABLE = 4
    DTOH_PINNED = 5
    DTOD = 6
    OTHER = 7


HTOD_KINDS = (CopyKind.HTOD_PAGEABLE, CopyKind.HTOD_PINNED, CopyKind.HTOD)


@dataclass(frozen=True, slots=True)
class DeviceOps:
    """Work that ran on a device: kernels, copies, sets, collectives. One row each."""

    start: I64
    end: I64
    device: I32
    stream: I32
    kind: I8
    name: I32
    """Index into :attr:`Timeline.strings`."""
    correlation: I64
    """Links the row to the runtime call that launched it; -1 when unknown."""
    copy_kind: I8
    nbytes: I64
    """Bytes moved by a copy or set; -1 when unknown or not a copy."""

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass(frozen=True, slots=True)
class HostEvents:
    """Ranges recorded on host threads: operators, runtime calls, annotations."""

    start: I64
    end: I64
    thread: I32
    """Index into :attr:`Timeline.threads`."""
    kind: I8
    name: I32
    correlation: I64
    """For runtime calls: the id shared with the device work they launched; else -1."""

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass(frozen=True, slots=True)
class CollectiveCalls:
    """Host-side collective records (``record_param_comms``, ``nccl:*`` ranges).

    ``host_index`` points into :attr:`Timeline.host`; sizes are -1 when the trace
    does not record them.
    """

    host_index: I64
    collective: list[str]
    process_group: list[str]
    in_bytes: I64
    out_bytes: I64
    group_size: I32

    def __len__(self) -> int:
        return int(self.host_index.shape[0])


@dataclass(frozen=True, slots=True)
class Steps:
    """Training iterations: ``[start, end)`` per step, in host time."""

    number: I64
    start: I64
    end: I64
    source: str
    """``profiler_step``, ``inferred:<method>`` or ``none``."""

    def __len__(self) -> int:
        return int(self.number.shape[0])


@dataclass(slots=True)
class TraceMeta:
    path: str
    format: str
    t0_ns: int
    """Trace clock of time zero, in ns."""
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device_names: dict[int, str] = field(default_factory=dict)
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Timeline:
    """Everything one rank's trace says, in columns. Built once by a source."""

    strings: list[str]
    threads: list[tuple[str, str]]
    """(pid, tid) per thread index, as the trace spells them."""
    device_ops: DeviceOps
    host: HostEvents
    collectives: CollectiveCalls
    steps: Steps
    meta: TraceMeta
    devices: list[int] = field(init=False)
    """Device indices with any activity, ascending."""

    def __post_init__(self) -> None:
        self.devices = [int(d) for d in np.unique(self.device_ops.device)]


# ----------------------------------------------------------------------------------
# The report: typed, and serialised as-is to the versioned JSON schema.
# ----------------------------------------------------------------------------------


def zero_causes() -> dict[str, float]:
    return {c.value: 0.0 for c in CAUSES}


class Window(msgspec.Struct):
    """The span analysed, so a reader knows what "utilization" is a share of."""

    kind: str
    """``profiler_steps``, ``inferred_steps`` or ``gpu_activity``."""
    start_s: float
    """Start, in seconds from the first event of the trace."""
    dur_s: float


class DeviceReport(msgspec.Struct):
    device: int
    name: str | None
    window_s: float
    busy_s: float
    """Union of compute kernels, copies and sets. Exposed collectives are idle."""
    idle_s: float
    utilization: float
    idle_by_cause_s: dict[str, float]
    active_s: float
    """Union of all device work, collectives included: what nvidia-smi counts."""


class StepReport(msgspec.Struct):
    step: int
    start_s: float
    dur_s: float
    busy_s: float
    idle_s: float
    idle_by_cause_s: dict[str, float]


class KernelStat(msgspec.Struct):
    name: str
    count: int
    total_s: float
    share: float


class KernelFacts(msgspec.Struct):
    count: int
    total_s: float
    short_kernel_share: float
    """Share of kernel time spent in kernels shorter than 10 µs."""
    short_kernel_count: int
    reduced_precision_gemm_share: float | None
    """Share of GEMM/conv kernel time in tensor-core or fp16/bf16 kernels; None: no GEMMs."""
    gemm_share: float
    """Share of kernel time in GEMM/convolution kernels."""
    conv_share: float
    top: list[KernelStat]
    syncs_per_step: float
    item_calls_per_step: float
    pageable_htod_copies: int
    pageable_htod_bytes: int
    median_launch_us: float | None


class CollectiveStat(msgspec.Struct):
    """One collective type, process group and message-size bucket (``unknown``: size not recorded)."""

    collective: str
    process_group: str
    size_bucket: str
    count: int
    total_s: float
    bytes: int
    """Sum of message bytes where known."""
    algbw_gbps: float | None
    busbw_gbps: float | None


class CommReport(msgspec.Struct):
    comm_s: float
    """Union of collective kernel time."""
    exposed_s: float
    """Collective time with no compute running."""
    overlap_ratio: float | None
    """Compute during communication / communication time (HTA's definition)."""
    collectives: list[CollectiveStat]
    per_step_count: float
    size_histogram: dict[str, int]


class RankReport(msgspec.Struct):
    rank: int
    path: str
    notes: list[str]
    step_source: str
    window: Window
    devices: list[DeviceReport]
    steps: list[StepReport]
    kernels: KernelFacts
    communication: CommReport
    world_size: int | None = None

    def primary(self) -> DeviceReport:
        """The device this rank trains on: the one with the most busy time."""
        return max(self.devices, key=lambda d: (d.busy_s, -d.device))


class Gain(msgspec.Struct):
    step_s_saved: float
    utilization_after: float


class Recommendation(msgspec.Struct):
    id: str
    cause: str
    title: str
    evidence: dict[str, Any]
    fix: str
    gain: Gain
    confidence: str
    """``high``: measured idle of this cause; ``medium``/``low``: an estimate."""
    rank: int | None = None


class CalcLine(msgspec.Struct):
    """One result with its formula, the formula with the numbers in, and how it was rounded for display."""

    name: str
    value: float
    """Exact; only ``shown`` is rounded."""
    unit: str
    formula: str
    worked: str
    rounding: str
    shown: str


class CostResult(msgspec.Struct, kw_only=True):
    """What idle GPUs cost, and what a target utilization would save. Savings are never negative.

    Built by ``advice.calc.cost``; ``lines`` show each formula with its numbers and rounding.
    """

    gpus: int
    hours: float
    utilization: float
    price_per_gpu_hour: float | None
    target: float | None
    gpu_hours: float
    wasted_gpu_hours: float
    wasted_usd: float | None
    hours_at_target: float | None
    hours_saved: float | None
    gpu_hours_saved: float | None
    usd_saved: float | None
    lines: list[CalcLine]
    notes: list[str] = []


class Straggler(msgspec.Struct):
    rank: int
    steps: list[int]
    lateness_s: float
    """Mean over ``steps`` of how long the others waited for this rank (summed over a step's collectives)."""
    score: float
    """Median step time of this rank / fastest rank's median (NVRx-style)."""
    cause: str
    why: str


class RankRow(msgspec.Struct):
    rank: int
    step_s: float
    utilization: float
    top_cause: str


class JobCommunication(msgspec.Struct):
    exposed_s: float
    straggler_wait_s: float
    overlap_ratio: float | None
    collectives: list[CollectiveStat]


class JobStep(msgspec.Struct):
    step: int
    skew: float | None
    """Max / median of this step's duration across ranks."""
    last_rank: int | None
    """The rank the others waited for longest in this step's collectives; None: nobody waited."""
    lateness_s: float
    """How long the others waited for ``last_rank`` in this step, summed over its collectives."""


class JobReport(msgspec.Struct):
    world_size: int | None
    ranks_found: list[int]
    missing_ranks: list[int]
    duplicate_ranks: list[int]
    step_skew: float | None
    """Max / median of per-rank mean step time."""
    rank_table: list[RankRow]
    stragglers: list[Straggler]
    communication: JobCommunication
    notes: list[str]
    steps: list[JobStep] = []


class Source(msgspec.Struct):
    paths: list[str]
    format: str
    skipped: list[str] = []


class AnalysisReport(msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    schema_minor: int = SCHEMA_MINOR
    source: Source
    ranks: list[RankReport]
    job: JobReport | None = None
    recommendations: list[Recommendation]
    cost: CostResult | None = None
    """Present when a price per GPU-hour was given."""


# ----------------------------------------------------------------------------------
# Where idle time lies (plots, annotated traces) and before/after comparisons.
# ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceTimeline:
    """One device's idle intervals, by cause, for plots and annotated traces. Times in ns from ``t0_ns``."""

    device: int
    name: str | None
    window: tuple[int, int]
    seg_start: I64
    seg_end: I64
    seg_cause: I64
    """Index into :data:`CAUSES`."""
    seg_step: I64
    """The step number each segment lies in (segments never cross a step boundary)."""
    bin_edges: I64
    """Equal slices of the window, ``n + 1`` edges, for a utilization-over-time plot."""
    bin_busy: npt.NDArray[np.float64]
    """Busy share of each slice."""
    bin_idle: npt.NDArray[np.float64]
    """Idle share of each slice by cause: shape ``(n, len(CAUSES))``; a row plus its busy share is 1."""

    def __len__(self) -> int:
        return int(self.seg_start.shape[0])


@dataclass(frozen=True, slots=True)
class IdleTimeline:
    """The idle intervals of every device of one trace file."""

    path: str
    rank: int
    t0_ns: int
    """Trace clock of time zero, in ns: add it back to write the trace's own timestamps."""
    step_numbers: I64
    step_bounds: I64
    """Step ``i`` is ``[step_bounds[i], step_bounds[i + 1])``; the last bound is the window end."""
    devices: list[DeviceTimeline]
    note: str | None = None
    """Why this trace was chosen, when it stands for a job."""


COMPARE_SCHEMA = "gpuidle.compare/1"


class RunSummary(msgspec.Struct):
    """One side of a comparison: the figures that tell whether a change helped."""

    ref: str
    """How the run was named: ``run 12``, or a report path."""
    label: str | None
    gpu_model: str | None
    world_size: int
    batch_size: int | None
    ranks: int
    steps: int
    """Steps analysed, summed over ranks."""
    utilization: float
    """Busy / window over the primary device of every rank."""
    step_s: float
    """Mean step time over all ranks' steps."""
    idle_s: float
    """Mean idle time per step."""
    idle_by_cause_s: dict[str, float]
    """Mean idle time per step, by cause."""
    recommendations: list[str]
    """Recommendation ids, largest gain first."""


class RecommendationChange(msgspec.Struct):
    id: str
    cause: str
    title: str
    status: str
    """``resolved`` (before only), ``new`` (after only) or ``remaining`` (both)."""
    gain_before_s: float | None
    """Step time the fix would save, before; None when not recommended then."""
    gain_after_s: float | None


class CostDelta(msgspec.Struct):
    """What the step-time change is worth: ``step_s * steps * GPUs * price / 3600``."""

    price_per_gpu_hour: float
    steps: int
    """Steps priced: an epoch, a run, or 1000 by default."""
    before: float
    after: float
    saved: float
    """``before - after``; negative when the change made it dearer."""


class Comparison(msgspec.Struct, kw_only=True):
    schema: str = COMPARE_SCHEMA
    before: RunSummary
    after: RunSummary
    comparable: bool
    differences: list[str]
    """Why the runs are not comparable: GPU model, world size or batch differs."""
    notes: list[str]
    """Differences worth knowing that do not make the numbers meaningless."""
    utilization_delta: float
    step_s_delta: float
    speedup: float | None
    """``before.step_s / after.step_s``."""
    idle_by_cause_delta_s: dict[str, float]
    """Per step, after minus before."""
    recommendations: list[RecommendationChange]
    cost: CostDelta | None = None


# ----------------------------------------------------------------------------------
# Device counters: what ``gpuidle monitor``/``run`` record (one JSON line per sample),
# the columns every counter source becomes (:class:`UtilSeries`), and the
# utilization report (schema ``gpuidle.utilization/1``).
# ----------------------------------------------------------------------------------

F64 = npt.NDArray[np.float64]

MONITOR_FORMAT = "gpuidle.monitor/1"
"""The first line of a monitor log: ``{"type": "header", "format": "gpuidle.monitor/1", ...}``."""
UTIL_SCHEMA = "gpuidle.utilization/1"
UTIL_SCHEMA_MINOR = 0

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
    notes: list[str] = []


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
    notes: list[str] = []


MonitorRecord = MonitorHeader | MonitorSample | MonitorEnd


@dataclass(frozen=True, slots=True)
class DeviceSeries:
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


@dataclass(frozen=True, slots=True)
class HostSeries:
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


@dataclass(slots=True)
class UtilSeries:
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
    notes: list[str] = field(default_factory=list)

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


class UtilFinding(msgspec.Struct, kw_only=True):
    """What the counters show, in numbers: the utilization counterpart of a trace finding."""

    kind: str
    """``low_utilization``, ``periodic_drops``, ``imbalance``, ``input_bound``, ``waiting_comm_or_io``,
    ``memory_headroom``, ``throttling`` or ``sm_underused``."""
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


class UtilizationReport(msgspec.Struct, kw_only=True):
    schema: str = UTIL_SCHEMA
    schema_minor: int = UTIL_SCHEMA_MINOR
    source: UtilSource
    window: UtilWindow
    devices: list[DeviceUtil]
    host: HostUtil | None = None
    gpu_unavailable: str | None = None
    findings: list[UtilFinding]
    recommendations: list[Recommendation]
    notes: list[str] = []


# ----------------------------------------------------------------------------------
# The in-process step tracker (live/torch.py): one JSONL log per rank, read back as a
# StepSeries per rank. Times are integer nanoseconds.
# ----------------------------------------------------------------------------------

TRACKER_FORMAT = "gpuidle.tracker/1"
"""The first line of a tracker log: ``{"type": "header", "format": "gpuidle.tracker/1", ...}``."""
TRACKER_LOG = "rank-{rank}.jsonl"
"""One log per rank, in the tracker's output folder."""
TRACKER_SUMMARY = "gpuidle-summary.json"
"""The job's :class:`AnalysisReport`, written by rank 0 when the tracker closes."""
TRACKER_OTHER = "other"
"""The phase column that sums every phase without a column of its own."""


class TrackerHeader(msgspec.Struct, tag="header", kw_only=True, omit_defaults=True):
    """First line of one rank's tracker log: who measured, on what, and how."""

    format: str
    """:data:`TRACKER_FORMAT`; always written, so a reader can tell the log's version."""
    rank: int
    world_size: int
    timing: str
    """``device``: phases timed with device events (CUDA); ``host``: with the host clock only."""
    device: int = 0
    device_name: str | None = None
    host: str = ""
    pid: int = 0
    t0: float = 0.0
    """Unix time of the tracker's start, in seconds."""
    phases: list[str] = []
    """Phases with a column of their own; any other phase adds to :data:`TRACKER_OTHER`."""
    compute_phases: list[str] = []
    """Phases whose time is the device's work: they make up busy time."""
    copy_phase: str = "h2d"
    """The phase that copies the batch to the device; its host time is ``memcpy`` idle."""
    every: int = 50
    """Steps between two exchanges of statistics across ranks."""
    notes: list[str] = []


class TrackerStep(msgspec.Struct, tag="step", kw_only=True, omit_defaults=True):
    """One training step on one rank."""

    step: int
    start_ns: int
    """Host clock at the start of the step, from the tracker's start."""
    dur_ns: int
    """Host time from the end of the previous step (or the first batch request) to this one's end."""
    data_ns: int = 0
    """Host time waiting for the loader's next batch."""
    phases: dict[str, int] = {}
    """Host time per phase."""
    device_phases: dict[str, int] = {}
    """Device time per phase (between device events); empty when timed on the host."""
    comm_ns: int = 0
    """Union of the DDP buckets' communication, each from its bucket ready to its future done."""
    comm_exposed_ns: int = 0
    """Communication still running after the last bucket was ready, when nothing was left to overlap it."""
    straggler_ns: int = 0
    """The part of ``comm_exposed_ns`` spent waiting for the last rank to hand in its gradients."""
    buckets: int = 0
    bucket_bytes: int = 0
    """Bytes of the gradient buckets handed to the communication hook."""
    samples: int = 0
    batches: int = 0
    profiled: bool = False
    """A ``torch.profiler`` capture ran in this step: its times include the profiler's cost."""


class TrackerEnd(msgspec.Struct, tag="end", kw_only=True, omit_defaults=True):
    """Last line of a tracker log, written by ``close()``; a log without it was cut short."""

    steps: int
    comm_hook: str | None = None
    """The DDP communication hook that was timed (``allreduce_hook``, or the user's); None: none."""
    notes: list[str] = []


TrackerLine = TrackerHeader | TrackerStep | TrackerEnd


@dataclass(slots=True)
class StepSeries:
    """One rank's steps as the tracker measured them: columns of nanoseconds, one row per step."""

    rank: int
    world_size: int
    path: str
    timing: str
    """``device`` or ``host``, as :attr:`TrackerHeader.timing`."""
    device: int
    device_name: str | None
    compute_phases: list[str]
    copy_phase: str
    step: I64
    start: I64
    dur: I64
    data: I64
    phases: dict[str, I64]
    """Host time per phase column."""
    device_phases: dict[str, I64]
    """Device time per phase column; empty when timed on the host."""
    comm: I64
    comm_exposed: I64
    straggler: I64
    buckets: I64
    bucket_bytes: I64
    samples: I64
    batches: I64
    profiled: npt.NDArray[np.bool_]
    comm_hook: str | None = None
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @property
    def device_timed(self) -> bool:
        return self.timing == "device"

    def compute(self) -> I64:
        """Time of the compute phases per step: on the device when it was timed there, else on the host."""
        source = self.device_phases if self.device_timed else self.phases
        total = np.zeros(len(self), dtype=np.int64)
        for name in self.compute_phases:
            if name in source:
                total += source[name]
        return total

    def copy(self) -> I64:
        """Host time of the copy phase per step: what a blocking host-to-device copy costs the loop."""
        col = self.phases.get(self.copy_phase)
        return col.copy() if col is not None else np.zeros(len(self), dtype=np.int64)

    def select(self, rows: npt.NDArray[np.bool_]) -> StepSeries:
        """The same series restricted to the rows where ``rows`` is true."""
        return StepSeries(
            rank=self.rank, world_size=self.world_size, path=self.path, timing=self.timing,
            device=self.device, device_name=self.device_name, compute_phases=self.compute_phases,
            copy_phase=self.copy_phase, step=self.step[rows], start=self.start[rows], dur=self.dur[rows],
            data=self.data[rows], phases={k: v[rows] for k, v in self.phases.items()},
            device_phases={k: v[rows] for k, v in self.device_phases.items()}, comm=self.comm[rows],
            comm_exposed=self.comm_exposed[rows], straggler=self.straggler[rows], buckets=self.buckets[rows],
            bucket_bytes=self.bucket_bytes[rows], samples=self.samples[rows], batches=self.batches[rows],
            profiled=self.profiled[rows], comm_hook=self.comm_hook, notes=list(self.notes),
        )
