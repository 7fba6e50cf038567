"""A Prometheus exporter for ``gpuidle monitor --prometheus-port``: the latest sample as gauges.

The monitor hands each sample to :class:`LatestSample`; a scrape reads whatever is
latest, so scraping never waits for NVML and never triggers a query. Fields read only on
full ticks keep their last value between them. Metric names carry their unit, as
Prometheus asks (``gpuidle_gpu_power_watts``); a value that is not available is left out
of the scrape rather than exported as 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from gpuidle.errors import GpuidleError
from gpuidle.model import GpuInfo, GpuSample, HostSample, MonitorHeader, MonitorSample

GPU_GAUGES: list[tuple[str, str, str, float]] = [
    # (metric name, GpuSample field, help, scale)
    ("gpuidle_gpu_utilization_ratio", "util_pct", "utilization.gpu: share of time at least one kernel ran", 0.01),
    ("gpuidle_gpu_memory_utilization_ratio", "mem_util_pct", "utilization.memory: share of time memory was busy",
     0.01),
    ("gpuidle_gpu_memory_used_bytes", "mem_used_mib", "device memory used", 1 << 20),
    ("gpuidle_gpu_memory_total_bytes", "mem_total_mib", "device memory total", 1 << 20),
    ("gpuidle_gpu_sm_clock_hertz", "sm_clock_mhz", "SM clock", 1e6),
    ("gpuidle_gpu_memory_clock_hertz", "mem_clock_mhz", "memory clock", 1e6),
    ("gpuidle_gpu_power_watts", "power_w", "power draw", 1.0),
    ("gpuidle_gpu_power_limit_watts", "power_limit_w", "enforced power limit", 1.0),
    ("gpuidle_gpu_temperature_celsius", "temp_c", "GPU temperature", 1.0),
    ("gpuidle_gpu_pcie_rx_bytes_per_second", "pcie_rx_mib_s", "PCIe receive throughput", 1 << 20),
    ("gpuidle_gpu_pcie_tx_bytes_per_second", "pcie_tx_mib_s", "PCIe transmit throughput", 1 << 20),
    ("gpuidle_gpu_nvlink_rx_bytes_per_second", "nvlink_rx_mib_s", "NVLink receive throughput, all links", 1 << 20),
    ("gpuidle_gpu_nvlink_tx_bytes_per_second", "nvlink_tx_mib_s", "NVLink transmit throughput, all links", 1 << 20),
    ("gpuidle_gpu_clock_event_reasons", "throttle_reasons", "NVML clock event (throttle) reason bitmask", 1.0),
    ("gpuidle_gpu_sm_active_ratio", "sm_active", "DCGM SM_ACTIVE", 1.0),
    ("gpuidle_gpu_sm_occupancy_ratio", "sm_occupancy", "DCGM SM_OCCUPANCY", 1.0),
    ("gpuidle_gpu_tensor_active_ratio", "tensor_active", "DCGM PIPE_TENSOR_ACTIVE", 1.0),
    ("gpuidle_gpu_dram_active_ratio", "dram_active", "DCGM DRAM_ACTIVE", 1.0),
]
HOST_GAUGES: list[tuple[str, str, str, float]] = [
    ("gpuidle_host_memory_used_bytes", "mem_used_mib", "host memory in use", 1 << 20),
    ("gpuidle_host_memory_total_bytes", "mem_total_mib", "host memory total", 1 << 20),
    ("gpuidle_host_disk_read_bytes_per_second", "disk_read_mib_s", "read throughput over all disks", 1 << 20),
    ("gpuidle_process_cpu_ratio", "proc_cpu_pct", "CPU of the wrapped command's tree, in cores", 0.01),
    ("gpuidle_process_resident_memory_bytes", "proc_rss_mib", "resident memory of the wrapped command's tree",
     1 << 20),
]


class LatestSample:
    """A monitor sink that keeps the newest value of every field, per GPU and for the host."""

    def __init__(self, header: MonitorHeader) -> None:
        self.header = header
        self._lock = threading.Lock()
        self.gpus: dict[int, dict[str, Any]] = {}
        self.host: dict[str, Any] = {}
        self.cpu_pct: list[float] = []
        self.t: float | None = None
        self.samples = 0

    def __call__(self, s: MonitorSample) -> None:
        with self._lock:
            self.t = s.t
            self.samples += 1
            for g in s.gpus:
                cur = self.gpus.setdefault(g.index, {})
                for key in GpuSample.__struct_fields__:
                    v = getattr(g, key)
                    if v is not None:
                        cur[key] = v
            if s.host is not None:
                if s.host.cpu_pct:
                    self.cpu_pct = list(s.host.cpu_pct)
                for key in HostSample.__struct_fields__:
                    v = getattr(s.host, key)
                    if v is not None and key != "cpu_pct":
                        self.host[key] = v

    def snapshot(self) -> tuple[dict[int, dict[str, Any]], dict[str, Any], list[float], float | None]:
        with self._lock:
            return ({k: dict(v) for k, v in self.gpus.items()}, dict(self.host), list(self.cpu_pct), self.t)

    def gpu_samples(self) -> dict[int, GpuSample]:
        """The merged latest values as samples (for the live view)."""
        gpus, _, _, _ = self.snapshot()
        return {i: GpuSample(**v) for i, v in gpus.items()}


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise GpuidleError("prometheus-client is not installed", "pip install 'gpuidle[prometheus]'") from None
    return prometheus_client


class Collector:
    """A prometheus-client custom collector over :class:`LatestSample`."""

    def __init__(self, latest: LatestSample) -> None:
        self.latest = latest
        self._infos: dict[int, GpuInfo] = {g.index: g for g in latest.header.gpus}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        gpus, host, cpu, t = self.latest.snapshot()
        labels = ["gpu", "uuid", "name"]
        for metric, key, doc, scale in GPU_GAUGES:
            fam = GaugeMetricFamily(metric, doc, labels=labels)
            for idx in sorted(gpus):
                v = gpus[idx].get(key)
                if v is None:
                    continue
                info = self._infos.get(idx)
                fam.add_metric([str(idx), (info.uuid or "") if info else "", (info.name or "") if info else ""],
                               float(v) * scale)
            if fam.samples:
                yield fam
        for metric, key, doc, scale in HOST_GAUGES:
            v = host.get(key)
            if v is not None:
                yield GaugeMetricFamily(metric, doc, value=float(v) * scale)
        if cpu:
            fam = GaugeMetricFamily("gpuidle_host_cpu_busy_ratio", "host CPU busy, per core", labels=["core"])
            for i, v in enumerate(cpu):
                fam.add_metric([str(i)], v / 100.0)
            yield fam
        if t is not None:
            yield GaugeMetricFamily("gpuidle_last_sample_timestamp_seconds", "Unix time of the latest sample",
                                    value=t)


class Exporter:
    """An HTTP endpoint (``/metrics``) serving :class:`Collector` from a daemon thread."""

    def __init__(self, latest: LatestSample, port: int, addr: str = "0.0.0.0") -> None:
        pc = _prometheus()
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.registry.register(Collector(latest))
        try:
            self._server, self._thread = pc.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as err:
            raise GpuidleError(f"cannot serve metrics on {addr}:{port}: {err.strerror}",
                               "pick a free port with --prometheus-port") from None

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2.0)
