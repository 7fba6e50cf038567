"""The Prometheus exporter, scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.live.exporter import Exporter, LatestSample, series_labels
from gpuidle.model import (
    EXPORTER_METRICS,
    GPU_GAUGES,
    HOST_GAUGES,
    JOB_LABELS,
    MONITOR_FORMAT,
    GpuInfo,
    GpuSample,
    HostSample,
    MonitorHeader,
    MonitorSample,
)

MIB = 1 << 20
GPUS = [GpuInfo(index=0, name="A100", uuid="GPU-aa"), GpuInfo(index=1, name="A100", uuid="GPU-bb")]
HEADER = MonitorHeader(format=MONITOR_FORMAT, t0=100.0, interval_s=0.5, cores=2, gpus=GPUS)


@pytest.fixture
def served() -> Iterator[tuple[LatestSample, str]]:
    latest = LatestSample(HEADER)
    exp = Exporter(0, "127.0.0.1", series_labels("node-3", job="train-42", rank=5))
    exp.publish(latest)
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


EXPORTER = {"Hostname": "node-3", "job": "train-42", "rank": "5"}


def gpu(i: int) -> tuple[tuple[str, str], ...]:
    """dcgm-exporter's labels of one GPU, and the exporter's own."""
    return tuple(sorted({"gpu": str(i), "UUID": f"GPU-{'ab'[i] * 2}", "modelName": "A100", **EXPORTER}.items()))


def host(**extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**EXPORTER, **extra}.items()))


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
    assert m[("gpuidle_host_cpu_busy_ratio", host(core="0"))] == 0.5
    assert m[("gpuidle_host_memory_used_bytes", host())] == 2048 * MIB
    assert m[("gpuidle_process_cpu_ratio", host())] == 1.5
    assert m[("gpuidle_last_sample_timestamp_seconds", host())] == 101.5


def test_busy_port_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(GpuidleError, match=f"cannot serve metrics on 127.0.0.1:{port}: the port is in use"):
            Exporter(port, "127.0.0.1")


def full_gpu(i: int) -> GpuSample:
    """A sample with every field the exporter serves."""
    fields: dict[str, object] = {m.column: 1.0 + i for m in GPU_GAUGES if m.column}
    fields["pids"] = list(range(100, 101 + i))  # served as a count: 1 + i, like the other fields
    return GpuSample(index=i, **fields)


def test_every_catalogued_metric_is_served_with_its_labels(served: tuple[LatestSample, str]) -> None:
    latest, url = served
    latest(MonitorSample(t=101.0, gpus=[full_gpu(0), full_gpu(1)], host=HostSample(
        cpu_pct=[25.0, 75.0], **{m.column: 3.0 for m in HOST_GAUGES})))
    m = scrape(url)
    served_names = {name for name, _ in m if name.startswith("gpuidle_")}
    assert served_names == {x.name for x in EXPORTER_METRICS}
    for x in EXPORTER_METRICS:
        for name, labels in m:
            if name == x.name:
                assert {k for k, _ in labels} == {*x.labels, *JOB_LABELS}, name
        if x.column is not None and x in GPU_GAUGES:
            assert m[(x.name, gpu(1))] == pytest.approx(2.0 * x.scale)
        elif x in HOST_GAUGES:
            assert m[(x.name, host())] == pytest.approx(3.0 * x.scale)


def test_without_job_or_rank_only_the_node_is_labelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "k8s-node-12")  # as a DaemonSet sets it from spec.nodeName
    latest = LatestSample(HEADER)
    exp = Exporter(0)
    exp.publish(latest)
    try:
        assert exp.address == "127.0.0.1"  # never every interface unless asked
        latest(MonitorSample(t=1.0, gpus=[GpuSample(index=0, util_pct=50.0)]))
        m = scrape(f"http://127.0.0.1:{exp.port}/metrics")
    finally:
        exp.close()
    labels = {"gpu": "0", "UUID": "GPU-aa", "modelName": "A100", "Hostname": "k8s-node-12"}
    assert m[("gpuidle_gpu_utilization_ratio", tuple(sorted(labels.items())))] == 0.5


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (apt-get install prometheus)")
def test_promtool_finds_nothing_to_lint(served: tuple[LatestSample, str]) -> None:
    latest, url = served
    latest(MonitorSample(t=101.0, gpus=[full_gpu(0), full_gpu(1)], host=HostSample(cpu_pct=[25.0, 75.0])))
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read()
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, check=False)
    problems = (done.stdout + done.stderr).decode().splitlines()
    # dcgm-exporter's own label names (UUID, modelName, Hostname) are camelCase, and kept so on purpose
    camel = "label names should be written in 'snake_case' not 'camelCase'"
    assert [p for p in problems if not p.endswith(camel)] == []
    assert {p.split()[0] for p in problems} == {m.name for m in GPU_GAUGES}


def _one_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuidle: error: "), err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("addr", "needle"), [
    ("no-such-host.invalid", "'no-such-host.invalid' is not a known address"),
    ("192.0.2.1", "192.0.2.1 is not an address of this machine"),  # TEST-NET-1: never local
])
@pytest.mark.parametrize("command", [["monitor"], ["run", "--", "true"]])
def test_bad_exporter_address_is_one_line(capsys: pytest.CaptureFixture[str], addr: str, needle: str,
                                          command: list[str]) -> None:
    err = _one_error(capsys, [*command[:1], "--prometheus-port", "9400", "--prometheus-addr", addr,
                              "--no-ledger", *command[1:]])
    assert needle in err
    assert "--prometheus-addr" in err


def test_busy_port_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = tmp_path / "run.jsonl"
        err = _one_error(capsys, ["run", "--prometheus-port", str(port), "--out", str(out), "--no-ledger", "--",
                                  "true"])
    assert f"127.0.0.1:{port}: the port is in use" in err
    assert not out.exists()  # stopped before the command or the log started


def test_job_label_without_an_exporter_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert "add --prometheus-port" in _one_error(capsys, ["monitor", "--job", "train-42", "--no-ledger"])
    assert "is not a rank" in _one_error(capsys, ["monitor", "--prometheus-port", "9400", "--rank", "-1"])
