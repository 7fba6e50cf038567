"""A real Prometheus scrapes a real ``gpuidle monitor --prometheus-port`` (over the tests' stand-in pynvml).

One Prometheus server runs for the module, on a free port with temporary storage, loading the
shipped scrape config (deploy/prometheus/prometheus.yml, its targets pointed at the monitor and
its interval shortened to 1 s) and the shipped rules. The tests wait for two scrapes by polling the
HTTP API, then check what Prometheus stored against the stand-in's readings, that every rule
evaluates without error, that every dashboard query runs, and that a ``/api/v1/query_range``
export of the exporter's series summarizes back to the same readings.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboard import dashboard_queries, metric_names
from fake_pynvml import FakeNVMLError, fake_pynvml
from gpuidle.cli import main
from gpuidle.model import EXPORTER_METRICS

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus is not installed (apt-get install prometheus)")

TESTS = Path(__file__).parent
DEPLOY = TESTS.parent / "deploy" / "prometheus"
NODE = "node-under-test"
JOB = "train-42"
POLL_S = 0.2
GIVE_UP_S = 120.0
"""Polling stops here only so that a broken server fails the test instead of hanging it."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    exporter_port: int
    started: float

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector"
        return list(data["result"])


def poll(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(POLL_S)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _config(tmp: Path, exporter_port: int) -> Path:
    """The shipped config, scraping the monitor under test every second, with the shipped rules."""
    cfg = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(DEPLOY / name) for name in cfg["rule_files"]]
    (job,) = cfg["scrape_configs"]
    job["scrape_interval"] = "1s"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("prometheus")
    exporter_port, web_port = free_port(), free_port()
    env = {**os.environ, "NODE_NAME": NODE, "GPUIDLE_LEDGER": str(tmp / "ledger.sqlite")}
    monitor = subprocess.Popen(
        [sys.executable, str(TESTS / "fake_pynvml.py"), "monitor", "--prometheus-port", str(exporter_port),
         "--job", JOB, "--interval", "0.2", "--no-dcgm", "--no-summary", "--no-ledger", "--quiet"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={_config(tmp, exporter_port)}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{web_port}", "--log.level=warn"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s = Server(f"http://127.0.0.1:{web_port}", exporter_port, time.time())
    try:
        poll("Prometheus to be ready", lambda: _answers(f"{s.url}/-/ready"))
        # two scrapes that found both GPUs' utilization
        poll("two scrapes of the exporter", lambda: [
            float(r["value"][1]) >= 2 for r in s.query("count_over_time(gpuidle_gpu_utilization_ratio[5m])")
        ] == [True, True])
        yield s
    finally:
        assert _stop(prometheus) == 0
        code = _stop(monitor, signal.SIGINT)
        err = monitor.stderr.read().decode() if monitor.stderr else ""
        assert code == 0, err


def expected_readings() -> dict[int, dict[str, float | None]]:
    """What the stand-in reports per GPU, read from it here, in the exporter's units."""
    lib = fake_pynvml()
    out: dict[int, dict[str, float | None]] = {}
    for h in range(lib.nvmlDeviceGetCount()):
        mem = lib.nvmlDeviceGetMemoryInfo(h)
        try:
            power: float | None = lib.nvmlDeviceGetPowerUsage(h) / 1000.0
        except FakeNVMLError:
            power = None
        out[h] = {
            "gpuidle_gpu_utilization_ratio": lib.nvmlDeviceGetUtilizationRates(h).gpu / 100,
            "gpuidle_gpu_memory_utilization_ratio": lib.nvmlDeviceGetUtilizationRates(h).memory / 100,
            "gpuidle_gpu_memory_used_bytes": float(mem.used),
            "gpuidle_gpu_memory_total_bytes": float(mem.total),
            "gpuidle_gpu_sm_clock_hertz": lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM) * 1e6,
            "gpuidle_gpu_power_watts": power,
            "gpuidle_gpu_power_limit_watts": lib.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "gpuidle_gpu_temperature_celsius": float(lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)),
            "gpuidle_gpu_processes": float(len(lib.nvmlDeviceGetComputeRunningProcesses(h))),
        }
    return out


def test_prometheus_stores_what_the_stand_in_reported(server: Server) -> None:
    lib = fake_pynvml()
    for name in expected_readings()[0]:
        got = {int(r["metric"]["gpu"]): r for r in server.query(name)}
        for h, readings in expected_readings().items():
            want = readings[name]
            if want is None:                              # a failed read is left out, not exported as 0
                assert h not in got, name
                continue
            r = got[h]
            assert float(r["value"][1]) == pytest.approx(want), (name, h)
            assert r["metric"] == {
                "__name__": name, "gpu": str(h), "UUID": lib.nvmlDeviceGetUUID(h),
                "modelName": lib.nvmlDeviceGetName(h).decode(), "Hostname": NODE, "job": JOB,
                "instance": f"127.0.0.1:{server.exporter_port}",
            }


def test_every_series_is_a_catalogued_metric(server: Server) -> None:
    names = set(server.api("label/__name__/values"))
    gpuidle = {n for n in names if n.startswith("gpuidle_")}
    assert gpuidle <= {m.name for m in EXPORTER_METRICS}
    assert {"gpuidle_gpu_utilization_ratio", "gpuidle_host_cpu_busy_ratio",
            "gpuidle_last_sample_timestamp_seconds"} <= gpuidle
    (stamp,) = server.query("gpuidle_last_sample_timestamp_seconds")
    assert float(stamp["value"][1]) >= server.started - 60      # the monitor's own clock, in Unix time


def test_shipped_rules_evaluate_on_the_real_series(server: Server) -> None:
    def rules() -> list[dict[str, Any]]:
        return [r for g in server.api("rules")["groups"] for r in g["rules"]]

    poll("every rule to be evaluated", lambda: all(r["health"] != "unknown" for r in rules()))
    assert [(r["name"], r.get("lastError")) for r in rules() if r["health"] != "ok"] == []
    util = expected_readings()
    mean = sum(float(u["gpuidle_gpu_utilization_ratio"] or 0) for u in util.values()) / len(util)
    (job,) = server.query("gpuidle:job_gpu_utilization:avg1m")
    assert job["metric"] == {"__name__": "gpuidle:job_gpu_utilization:avg1m", "job": JOB}
    assert float(job["value"][1]) == pytest.approx(mean)
    # both GPUs above 80 %, one point apart, steady: nothing to alert about
    assert server.api("alerts")["alerts"] == []


def test_every_dashboard_query_runs(server: Server) -> None:
    exported = {m.name for m in EXPORTER_METRICS}
    # Grafana's intervals, shrunk to the few seconds this server has stored
    for where, query in dashboard_queries({"__rate_interval": "10s", "__interval": "1s", "__range": "5m"}):
        server.api("query", query=query)  # runs
        if metric_names(query) <= exported:  # and finds the exporter's series once a subquery step has them
            poll(f"{where}: {query} to find series", lambda q=query: bool(server.query(q)))


def test_range_query_export_summarizes_to_the_readings(server: Server, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    poll("four scrapes", lambda: all(
        float(r["value"][1]) >= 4 for r in server.query("count_over_time(gpuidle_gpu_utilization_ratio[5m])")))
    end = time.time()
    data = server.api("query_range", query=f'{{__name__=~"gpuidle_gpu_.*", job="{JOB}"}}',
                      start=f"{server.started - 5:.3f}", end=f"{end:.3f}", step="1")
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"status": "success", "data": data}))
    assert main(["summarize", str(export), "--json", "--no-ledger"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["format"] == "prometheus-range"
    util = expected_readings()
    assert [d["device"] for d in doc["devices"]] == sorted(util)
    for d in doc["devices"]:
        want = util[d["device"]]
        assert d["name"] == "Fake GPU"
        (points,) = [len(r["values"]) for r in data["result"]
                     if r["metric"]["__name__"] == "gpuidle_gpu_utilization_ratio"
                     and r["metric"]["gpu"] == str(d["device"])]
        assert 3 <= d["samples"] <= points
        assert d["mean_util_pct"] == pytest.approx(float(want["gpuidle_gpu_utilization_ratio"] or 0) * 100)
        assert d["mem_used_max_mib"] == pytest.approx(float(want["gpuidle_gpu_memory_used_bytes"] or 0) / 2**20)
        assert d["mem_total_mib"] == pytest.approx(float(want["gpuidle_gpu_memory_total_bytes"] or 0) / 2**20)
