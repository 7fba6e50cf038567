"""The Prometheus metrics gpuidle publishes: one catalogue for the exporter, the tracker and the readers.

Names carry gpuidle's prefix and their unit, as Prometheus asks; labels follow
dcgm-exporter's (``gpu``, ``UUID``, ``modelName``, ``Hostname``) so dashboards and
queries written for one fit the other, plus ``job`` and ``rank`` when they are known.
A gauge that carries a model column says which one and the factor from the column's
unit into the metric's (``util_pct`` * 0.01 = ``gpuidle_gpu_utilization_ratio``), so a
range-query export of these metrics reads back into the same columns.
"""

from __future__ import annotations

from typing import Literal

import msgspec

MIB = 1 << 20
GPU_LABELS: tuple[str, ...] = ("gpu", "UUID", "modelName", "Hostname")
"""dcgm-exporter's labels of one GPU: the index, the UUID, the model and the node."""
HOST_LABELS: tuple[str, ...] = ("Hostname",)
JOB_LABELS: tuple[str, ...] = ("job", "rank")
"""Added to every series of an exporter started with ``--job``/``--rank``."""


class Metric(msgspec.Struct, frozen=True):
    """One metric family: its name, type, labels, meaning, and the model column it carries."""

    name: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    help: str
    column: str | None = None
    """The :class:`~gpuidle.model.GpuSample` or :class:`~gpuidle.model.HostSample` field (``pids``: its length)."""
    scale: float = 1.0
    """metric value = column value * scale."""


def _gpu(name: str, column: str, doc: str, scale: float = 1.0) -> Metric:
    return Metric(name, "gauge", GPU_LABELS, doc, column, scale)


def _host(name: str, column: str, doc: str, scale: float = 1.0) -> Metric:
    return Metric(name, "gauge", HOST_LABELS, doc, column, scale)


GPU_GAUGES: tuple[Metric, ...] = (
    _gpu("gpuidle_gpu_utilization_ratio", "util_pct", "utilization.gpu: share of time at least one kernel ran",
         0.01),
    _gpu("gpuidle_gpu_memory_utilization_ratio", "mem_util_pct", "utilization.memory: share of time memory was busy",
         0.01),
    _gpu("gpuidle_gpu_memory_used_bytes", "mem_used_mib", "device memory used", MIB),
    _gpu("gpuidle_gpu_memory_total_bytes", "mem_total_mib", "device memory total", MIB),
    _gpu("gpuidle_gpu_sm_clock_hertz", "sm_clock_mhz", "SM clock", 1e6),
    _gpu("gpuidle_gpu_memory_clock_hertz", "mem_clock_mhz", "memory clock", 1e6),
    _gpu("gpuidle_gpu_power_watts", "power_w", "power draw"),
    _gpu("gpuidle_gpu_power_limit_watts", "power_limit_w", "enforced power limit"),
    _gpu("gpuidle_gpu_temperature_celsius", "temp_c", "GPU temperature"),
    _gpu("gpuidle_gpu_pcie_rx_bytes_per_second", "pcie_rx_mib_s", "PCIe receive throughput", MIB),
    _gpu("gpuidle_gpu_pcie_tx_bytes_per_second", "pcie_tx_mib_s", "PCIe transmit throughput", MIB),
    _gpu("gpuidle_gpu_nvlink_rx_bytes_per_second", "nvlink_rx_mib_s", "NVLink receive throughput, all links", MIB),
    _gpu("gpuidle_gpu_nvlink_tx_bytes_per_second", "nvlink_tx_mib_s", "NVLink transmit throughput, all links", MIB),
    _gpu("gpuidle_gpu_clock_event_reasons", "throttle_reasons", "NVML clock event (throttle) reason bitmask"),
    _gpu("gpuidle_gpu_sm_active_ratio", "sm_active", "DCGM SM_ACTIVE"),
    _gpu("gpuidle_gpu_sm_occupancy_ratio", "sm_occupancy", "DCGM SM_OCCUPANCY"),
    _gpu("gpuidle_gpu_tensor_active_ratio", "tensor_active", "DCGM PIPE_TENSOR_ACTIVE"),
    _gpu("gpuidle_gpu_dram_active_ratio", "dram_active", "DCGM DRAM_ACTIVE"),
    _gpu("gpuidle_gpu_processes", "pids", "processes holding a compute context (a GPU in use has at least one)"),
)
HOST_GAUGES: tuple[Metric, ...] = (
    _host("gpuidle_host_memory_used_bytes", "mem_used_mib", "host memory in use", MIB),
    _host("gpuidle_host_memory_total_bytes", "mem_total_mib", "host memory total", MIB),
    _host("gpuidle_host_disk_read_bytes_per_second", "disk_read_mib_s", "read throughput over all disks", MIB),
    _host("gpuidle_process_cpu_ratio", "proc_cpu_pct", "CPU of the wrapped command's tree, in cores", 0.01),
    _host("gpuidle_process_resident_memory_bytes", "proc_rss_mib", "resident memory of the wrapped command's tree",
          MIB),
)
HOST_CPU = Metric("gpuidle_host_cpu_busy_ratio", "gauge", (*HOST_LABELS, "core"), "host CPU busy, per core",
                  "cpu_pct", 0.01)
LAST_SAMPLE = Metric("gpuidle_last_sample_timestamp_seconds", "gauge", HOST_LABELS, "Unix time of the latest sample")

EXPORTER_METRICS: tuple[Metric, ...] = (*GPU_GAUGES, *HOST_GAUGES, HOST_CPU, LAST_SAMPLE)
"""Every family ``gpuidle monitor --prometheus-port`` can serve (a family with no value yet is left out)."""

TRACKER_LABELS: tuple[str, ...] = ("job", "rank", "Hostname")
TRACKER_METRICS: tuple[Metric, ...] = (
    Metric("gpuidle_tracker_step_seconds", "gauge", TRACKER_LABELS, "step time"),
    Metric("gpuidle_tracker_data_wait_ratio", "gauge", TRACKER_LABELS, "share of the step time spent waiting for data"),
    Metric("gpuidle_tracker_exposed_communication_seconds", "gauge", TRACKER_LABELS,
           "communication not overlapped with compute, per step"),
    Metric("gpuidle_tracker_straggler_score", "gauge", TRACKER_LABELS,
           "how far this rank lags the job's other ranks"),
    Metric("gpuidle_tracker_idle_seconds_total", "counter", (*TRACKER_LABELS, "cause"),
           "GPU idle time by cause (the idle-cause vocabulary) since the tracker started"),
)
"""What the in-process step tracker publishes, one series per rank."""
