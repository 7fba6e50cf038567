"""A Prometheus exporter for ``gpuidle monitor --prometheus-port``: the latest sample as gauges.

The monitor hands each sample to :class:`LatestSample`; a scrape reads whatever is
latest, so scraping never waits for NVML and never triggers a query. Fields read only on
full ticks keep their last value between them. Metric names carry their unit, as
Prometheus asks (``gpuidle_gpu_power_watts``), and labels follow dcgm-exporter's (the
catalogue is :mod:`gpuidle.model.metrics`); a value that is not available is left out of
the scrape rather than exported as 0.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

from gpuidle.errors import GpuidleError
from gpuidle.model import (
    GPU_GAUGES,
    GPU_LABELS,
    HOST_CPU,
    HOST_GAUGES,
    LAST_SAMPLE,
    GpuInfo,
    GpuSample,
    HostSample,
    MonitorHeader,
    MonitorSample,
)

DEVICE_LABELS = [name for name in GPU_LABELS if name != "Hostname"]
"""The labels that tell one GPU of a node from another; ``Hostname`` comes with the exporter's own labels."""


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
    """A prometheus-client custom collector over :class:`LatestSample`.

    ``labels`` (``Hostname``, and ``job``/``rank`` when known) go on every series; a GPU
    series also carries its index, UUID and model, as dcgm-exporter's do.
    """

    def __init__(self, latest: LatestSample, labels: dict[str, str]) -> None:
        self.latest = latest
        self.labels = labels
        self._infos: dict[int, GpuInfo] = {g.index: g for g in latest.header.gpus}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        gpus, host, cpu, t = self.latest.snapshot()
        common = list(self.labels)
        values = list(self.labels.values())
        per_gpu = {idx: [*self._gpu_labels(idx), *values] for idx in sorted(gpus)}
        for m in GPU_GAUGES:
            fam = GaugeMetricFamily(m.name, m.help, labels=[*DEVICE_LABELS, *common])
            for idx, labels in per_gpu.items():
                v = gpus[idx].get(m.column or "")
                if v is not None:
                    fam.add_metric(labels, float(len(v) if isinstance(v, list) else v) * m.scale)
            if fam.samples:
                yield fam
        for m in HOST_GAUGES:
            v = host.get(m.column or "")
            if v is not None:
                fam = GaugeMetricFamily(m.name, m.help, labels=common)
                fam.add_metric(values, float(v) * m.scale)
                yield fam
        if cpu:
            fam = GaugeMetricFamily(HOST_CPU.name, HOST_CPU.help, labels=[*common, "core"])
            for i, v in enumerate(cpu):
                fam.add_metric([*values, str(i)], v * HOST_CPU.scale)
            yield fam
        if t is not None:
            fam = GaugeMetricFamily(LAST_SAMPLE.name, LAST_SAMPLE.help, labels=common)
            fam.add_metric(values, t)
            yield fam

    def _gpu_labels(self, idx: int) -> list[str]:
        """``gpu``, ``UUID``, ``modelName`` of one device (empty when NVML did not say)."""
        info = self._infos.get(idx)
        return [str(idx), (info.uuid or "") if info else "", (info.name or "") if info else ""]


def node_name() -> str:
    """The ``Hostname`` label: ``$NODE_NAME`` (set from the pod spec on Kubernetes), else this host's name.

    dcgm-exporter names the node the same way, so the two exporters' series join.
    """
    return os.environ.get("NODE_NAME") or socket.gethostname()


def series_labels(hostname: str, job: str | None = None, rank: int | None = None) -> dict[str, str]:
    """The labels every series of one exporter carries: ``Hostname`` first, then ``job``/``rank`` when known."""
    out = {"Hostname": hostname}
    if job:
        out["job"] = job
    if rank is not None:
        out["rank"] = str(rank)
    return out


class Exporter:
    """An HTTP endpoint (``/metrics``) served from a daemon thread.

    It listens as soon as it is made, so a bad address or a busy port stops a command
    before it samples or starts anything; :meth:`publish` then hands it the samples.
    """

    def __init__(self, port: int, addr: str = "127.0.0.1", labels: dict[str, str] | None = None) -> None:
        pc = _prometheus()
        self.labels = labels or series_labels(node_name())
        self.registry = pc.CollectorRegistry(auto_describe=False)
        try:
            self._server, self._thread = pc.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as err:
            raise _bind_error(addr, port, err) from None

    def publish(self, latest: LatestSample) -> None:
        """Serve ``latest`` from now on (until then a scrape finds no gpuidle series)."""
        self.registry.register(Collector(latest, self.labels))

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def address(self) -> str:
        """The address it listens on, as bound (``127.0.0.1``, ``::``, ...)."""
        return str(self._server.server_address[0])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2.0)


def _bind_error(addr: str, port: int, err: OSError) -> GpuidleError:
    """Why the endpoint could not listen, in one line, with the option that fixes it."""
    where = f"cannot serve metrics on {addr}:{port}"
    if isinstance(err, socket.gaierror):
        return GpuidleError(f"{where}: {addr!r} is not a known address ({err.strerror})",
                            "give --prometheus-addr an address of this machine, e.g. 127.0.0.1 or 0.0.0.0")
    if err.errno == errno.EADDRNOTAVAIL:
        return GpuidleError(f"{where}: {addr} is not an address of this machine",
                            "give --prometheus-addr an address of this machine, e.g. 127.0.0.1 or 0.0.0.0")
    if err.errno == errno.EADDRINUSE:
        return GpuidleError(f"{where}: the port is in use", "pick a free port with --prometheus-port")
    return GpuidleError(f"{where}: {err.strerror or err}", "pick another port with --prometheus-port")
