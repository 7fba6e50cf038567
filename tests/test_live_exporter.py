"""The Prometheus exporter, scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuidle.errors import GpuidleError
from gpuidle.live.exporter import Exporter, LatestSample
from gpuidle.model import MONITOR_FORMAT, GpuInfo, GpuSample, HostSample, MonitorHeader, MonitorSample

MIB = 1 << 20
GPUS = [GpuInfo(index=0, name="A100", uuid="GPU-aa"), GpuInfo(index=1, name="A100", uuid="GPU-bb")]
HEADER = MonitorHeader(format=MONITOR_FORMAT, t0=100.0, interval_s=0.5, cores=2, gpus=GPUS)


@pytest.fixture
def served() -> Iterator[tuple[LatestSample, str]]:
    latest = LatestSample(HEADER)
    exp = Exporter(latest, 0, "127.0.0.1")
    try:
        yield latest, f"http://127.0.0.1:{exp.port}/metrics"
    finally:
        exp.close()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def gpu(i: int) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"gpu": str(i), "uuid": f"GPU-{'ab'[i] * 2}", "name": "A100"}.items()))


def test_scrape_latest_values(served: tuple[LatestSample, str]) -> None:
    latest, url = served
    assert not any(name.startswith("gpuidle_gpu") for name, _ in scrape(url))  # nothing sampled yet
    latest(MonitorSample(t=101.0, gpus=[
        GpuSample(index=0, util_pct=87.0, mem_used_mib=1000.0, power_w=250.5, temp_c=61.0, throttle_reasons=4),
        GpuSample(index=1, util_pct=12.0, temp_c=40.0),
    ], host=HostSample(cpu_pct=[25.0, 75.0], mem_used_mib=2048.0, proc_cpu_pct=150.0)))
    # a light tick: temperature not read; the last value stays
    latest(MonitorSample(t=101.5, gpus=[GpuSample(index=0, util_pct=90.0), GpuSample(index=1, util_pct=0.0)],
                         host=HostSample(cpu_pct=[50.0, 50.0])))
    m = scrape(url)
    assert m[("gpuidle_gpu_utilization_ratio", gpu(0))] == pytest.approx(0.90)
    assert m[("gpuidle_gpu_utilization_ratio", gpu(1))] == 0.0
    assert m[("gpuidle_gpu_memory_used_bytes", gpu(0))] == 1000 * MIB
    assert m[("gpuidle_gpu_power_watts", gpu(0))] == 250.5
    assert m[("gpuidle_gpu_temperature_celsius", gpu(0))] == 61.0
    assert m[("gpuidle_gpu_temperature_celsius", gpu(1))] == 40.0
    assert m[("gpuidle_gpu_clock_event_reasons", gpu(0))] == 4.0
    assert ("gpuidle_gpu_power_watts", gpu(1)) not in m  # never read: absent, not 0
    assert not any(name == "gpuidle_gpu_pcie_rx_bytes_per_second" for name, _ in m)
    assert m[("gpuidle_host_cpu_busy_ratio", (("core", "0"),))] == 0.5
    assert m[("gpuidle_host_memory_used_bytes", ())] == 2048 * MIB
    assert m[("gpuidle_process_cpu_ratio", ())] == 1.5
    assert m[("gpuidle_last_sample_timestamp_seconds", ())] == 101.5


def test_busy_port_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(GpuidleError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            Exporter(LatestSample(HEADER), port, "127.0.0.1")
