"""The sampler, driven by recorded samples and a fake clock; the NVML layer over a fake pynvml; DCGM readers."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fake_pynvml import fake_pynvml
from gpuidle.cli import live as cli_live
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.live import nvml
from gpuidle.live.dcgm import DcgmExporterReader, DcgmiParser, DcgmReader, parse_dcgm_exporter
from gpuidle.live.host import PsutilHost, cpu_busy_pct
from gpuidle.live.monitor import JsonlWriter, Monitor
from gpuidle.model import GpuInfo, GpuSample, HostSample, MonitorEnd, MonitorSample
from gpuidle.sources import smi

MIB = 1 << 20


class FakeClock:
    """Time moves only when the sampler waits (or a slow backend says so)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def time(self) -> float:
        return self.t

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        self.t += max(seconds, 0.0)
        return stop.is_set()


class RecordedBackend:
    """Plays back recorded device samples, one list per tick; ``cost`` seconds pass per sample."""

    def __init__(self, ticks: list[list[GpuSample]], clock: FakeClock | None = None, cost: float = 0.0,
                 infos: list[GpuInfo] | None = None, fail: str | None = None) -> None:
        self.ticks = ticks
        self.clock = clock
        self.cost = cost
        self.infos = infos or [GpuInfo(index=g.index, name=f"GPU{g.index}") for g in ticks[0]]
        self.fail = fail
        self.at: list[float] = []
        self.closed = False

    def open(self) -> list[GpuInfo]:
        if self.fail:
            raise nvml.NvmlUnavailable(self.fail)
        return self.infos

    def sample(self, t: float) -> list[GpuSample]:
        self.at.append(t)
        rec = self.ticks[(len(self.at) - 1) % len(self.ticks)]
        if self.clock is not None:
            self.clock.t += self.cost
        return [msgspec.structs.replace(g) for g in rec]

    def close(self) -> None:
        self.closed = True


class FakeHost:
    def __init__(self) -> None:
        self.full: list[bool] = []

    def cores(self) -> int:
        return 2

    def sample(self, t: float, full: bool) -> HostSample:
        self.full.append(full)
        s = HostSample(cpu_pct=[10.0 * len(self.full), 50.0])
        if full:
            s.mem_used_mib = 100.0
        return s


def full_sample(index: int, util: float) -> GpuSample:
    return GpuSample(index=index, util_pct=util, mem_used_mib=1000.0, mem_total_mib=8000.0, power_w=100.0,
                     sm_clock_mhz=1400.0, temp_c=50.0, throttle_reasons=0, pids=[42])


def test_ticks_on_grid_and_slow_fields_once_a_second() -> None:
    clock = FakeClock()
    gpu = RecordedBackend([[full_sample(0, 50.0)]])
    h = FakeHost()
    m = Monitor(gpu, h, interval_s=0.25, clock=clock)
    header = m.open()
    assert (header.t0, header.interval_s, header.cores, header.gpu_unavailable) == (1000.0, 0.25, 2, None)
    got: list[MonitorSample] = []
    assert m.run([got.append], max_samples=9) == 9
    assert [s.t - 1000.0 for s in got] == [i * 0.25 for i in range(9)]
    full = [i for i, s in enumerate(got) if s.gpus[0].sm_clock_mhz is not None]
    assert full == [0, 4, 8]
    assert h.full == [i in (0, 4, 8) for i in range(9)]
    light = got[1].gpus[0]
    assert (light.util_pct, light.mem_used_mib, light.power_w) == (50.0, 1000.0, 100.0)  # cheap: every tick
    assert (light.temp_c, light.pids, light.throttle_reasons) == (None, None, None)  # N/A until the next full tick
    assert m.late_ticks == 0


def test_late_ticks_are_skipped_not_bunched() -> None:
    clock = FakeClock(0.0)
    m = Monitor(RecordedBackend([[full_sample(0, 1.0)]], clock=clock, cost=0.35), None, interval_s=0.25,
                clock=clock)
    got: list[MonitorSample] = []
    m.run([got.append], max_samples=4)
    assert [round(s.t, 9) for s in got] == [0.0, 0.5, 1.0, 1.5]
    assert m.late_ticks == 3
    assert "3 ticks skipped" in m.notes()[0]


def test_duration_and_stop() -> None:
    clock = FakeClock(0.0)
    m = Monitor(RecordedBackend([[full_sample(0, 1.0)]]), None, interval_s=0.5, clock=clock)
    got: list[MonitorSample] = []
    m.run([got.append], duration_s=2.0)
    assert [s.t for s in got] == [0.0, 0.5, 1.0, 1.5, 2.0]
    stop = threading.Event()

    def sink(s: MonitorSample) -> None:
        got.append(s)
        if len(got) == 7:
            stop.set()

    got.clear()
    m.run([sink], stop)
    assert len(got) == 7


def test_devices_filter_and_failed_backend() -> None:
    clock = FakeClock()
    gpu = RecordedBackend([[full_sample(0, 1.0), full_sample(1, 2.0), full_sample(2, 3.0)]])
    m = Monitor(gpu, None, interval_s=1.0, clock=clock, devices=[1, 5])
    header = m.open()
    assert [g.index for g in header.gpus] == [1]
    assert header.notes == ["devices not found: [5]"]
    assert [g.index for g in m.sample().gpus] == [1]
    m.stop()
    assert gpu.closed

    broken = Monitor(RecordedBackend([[full_sample(0, 1.0)]], fail="NVML is unavailable: no driver"), FakeHost(),
                     interval_s=1.0, clock=clock)
    header = broken.open()
    assert header.gpu_unavailable == "NVML is unavailable: no driver"
    assert header.gpus == []
    s = broken.sample()
    assert s.gpus == []
    assert s.host is not None


def test_interval_floor() -> None:
    with pytest.raises(GpuidleError, match="below the minimum"):
        Monitor(None, None, interval_s=0.05)
    Monitor(None, None, interval_s=0.1)


def test_log_round_trip(tmp_path: Path) -> None:
    clock = FakeClock(50.0)
    ticks = [[full_sample(0, 10.0), GpuSample(index=1)], [full_sample(0, 90.0), full_sample(1, 80.0)]]
    m = Monitor(RecordedBackend(ticks), FakeHost(), interval_s=0.5, clock=clock, slow_every_s=0.5)
    path = tmp_path / "log.jsonl"
    writer = JsonlWriter(path)
    writer.header(m.open())
    m.run([writer], max_samples=4)
    writer.close(MonitorEnd(t=clock.time(), samples=writer.samples, exit_code=0, devices=[0]))
    s = smi.read(path)
    d0, d1 = s.devices
    assert d0.t.tolist() == [0.0, 0.5, 1.0, 1.5]
    assert d0.col("util_pct").tolist() == [10.0, 90.0, 10.0, 90.0]
    assert d1.col("util_pct")[1::2].tolist() == [80.0, 80.0]
    assert d0.pids == [[42]] * 4
    assert s.host is not None
    assert s.host.cpu_pct[:, 0].tolist() == [10.0, 20.0, 30.0, 40.0]
    assert (s.used_devices, s.exit_code) == ([0], 0)


def test_jsonl_writer_refuses_a_folder(tmp_path: Path) -> None:
    with pytest.raises(GpuidleError, match="is a folder"):
        JsonlWriter(tmp_path)


def test_cpu_busy_from_cpu_times() -> None:
    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    before = [T(10, 0, 5, 80, 5, 0, 0, 0, 2, 0), T(0, 0, 0, 100, 0, 0, 0, 0, 0, 0)]
    after = [T(20, 0, 10, 100, 10, 0, 0, 0, 4, 0), T(0, 0, 0, 100, 0, 0, 0, 0, 0, 0)]
    # core 0: total (minus guest) 100 -> 140, idle+iowait 85 -> 110: busy 15 of 40; core 1: no time passed
    assert cpu_busy_pct(before, after) == [37.5, 0.0]


def test_psutil_host_samples_a_real_process_tree() -> None:
    code = ("import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], "
            "stdin=subprocess.PIPE); print('ready', flush=True); sys.stdin.read(); c.stdin.close(); c.wait()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        host = PsutilHost(proc.pid)
        assert host.cores() == os.cpu_count()
        first = host.sample(0.0, full=True)
        second = host.sample(1.0, full=True)
        light = host.sample(1.5, full=False)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    assert len(first.cpu_pct) == os.cpu_count()
    assert (first.procs, second.procs) == (2, 2)  # the child and its own child
    assert first.proc_cpu_pct is None
    assert second.proc_cpu_pct is not None
    assert second.proc_cpu_pct >= 0
    assert second.proc_rss_mib is not None
    assert second.proc_rss_mib > 1
    assert second.mem_total_mib is not None
    assert second.mem_used_mib is not None
    assert light.mem_total_mib is None
    assert light.procs is None
    assert len(light.cpu_pct) == os.cpu_count()
    assert host.tree_pids() >= {proc.pid}


# ----------------------------------------------------------------------------------
# DCGM
# ----------------------------------------------------------------------------------

LABELS = 'UUID="GPU-1b2c",pci_bus_id="00000000:07:00.0",device="nvidia{i}",modelName="NVIDIA A100-SXM4-80GB"'
EXPORTER_TEXT = "\n".join([
    "# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned (in %).",
    "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge",
    f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0",{LABELS.format(i=0)},Hostname="node1"}} 0.512',
    f'DCGM_FI_PROF_SM_ACTIVE{{gpu="1",{LABELS.format(i=1)},Hostname="node1"}} 0.25',
    f'DCGM_FI_PROF_SM_OCCUPANCY{{gpu="0",{LABELS.format(i=0)},Hostname="node1"}} 0.301',
    f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{gpu="0",{LABELS.format(i=0)},Hostname="node1"}} 0.1',
    f'DCGM_FI_PROF_DRAM_ACTIVE{{gpu="0",{LABELS.format(i=0)},Hostname="node1"}} 0.45',
    f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",{LABELS.format(i=0)},Hostname="node1"}} 99',
    "",
])
EXPECTED = {0: {"sm_active": 0.512, "sm_occupancy": 0.301, "tensor_active": 0.1, "dram_active": 0.45},
            1: {"sm_active": 0.25}}


def test_parse_dcgm_exporter() -> None:
    assert parse_dcgm_exporter(EXPORTER_TEXT) == EXPECTED


@pytest.fixture
def exporter_url() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = EXPORTER_TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_dcgm_exporter_scrape_over_http(exporter_url: str) -> None:
    reader = DcgmExporterReader(exporter_url)
    assert reader.scrape() == EXPECTED
    assert reader.error is None
    bad = DcgmExporterReader("http://127.0.0.1:9/metrics")
    assert bad.scrape() == {}
    assert bad.error is not None
    assert "dcgm-exporter" in bad.error


def test_dcgmi_dmon_lines() -> None:
    p = DcgmiParser()
    lines = ["#Entity   SMACT        SMOCC        TENSO        DRAMA",
             "ID",
             "GPU 0     0.512        0.301        0.000        0.450",
             "GPU 1     N/A          N/A          N/A          N/A"]
    got = [p.feed(line) for line in lines]
    assert got[:2] == [None, None]
    assert got[2] == (0, {"sm_active": 0.512, "sm_occupancy": 0.301, "tensor_active": 0.0, "dram_active": 0.45})
    assert got[3] == (1, {})


class QuietDcgm(DcgmReader):
    def _run(self) -> None:
        return


def test_dcgm_values_join_the_next_sample_once() -> None:
    dcgm = QuietDcgm()
    m = Monitor(RecordedBackend([[full_sample(0, 90.0), full_sample(1, 90.0)]]), None, interval_s=1.0,
                clock=FakeClock(), dcgm=dcgm)
    m.open()
    dcgm.put(EXPECTED)
    first, second = m.sample(), m.sample()
    assert (first.gpus[0].sm_active, first.gpus[0].dram_active, first.gpus[1].sm_active) == (0.512, 0.45, 0.25)
    assert second.gpus[0].sm_active is None
    m.stop()


# ----------------------------------------------------------------------------------
# The NVML layer, over a stand-in for pynvml
# ----------------------------------------------------------------------------------


@pytest.fixture
def fresh_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setattr(nvml, "_lib", None)
    monkeypatch.setattr(nvml, "_init_error", None)
    monkeypatch.setattr(nvml, "_reported", set())
    return monkeypatch


def test_nvml_backend_over_fake_pynvml(fresh_nvml: pytest.MonkeyPatch) -> None:
    lib = fake_pynvml()
    fresh_nvml.setitem(sys.modules, "pynvml", lib)
    b = nvml.NvmlBackend()
    infos = b.open()
    assert [(g.index, g.name, g.uuid, g.mem_total_mib) for g in infos] == [(0, "Fake GPU", "GPU-0", 16384.0),
                                                                         (1, "Fake GPU", "GPU-1", 16384.0)]
    first = b.sample(10.0)
    lib.counters[0].update({197: 4 * MIB, 198: 2 * MIB, 138: 2048.0, 139: 1024.0})
    second = b.sample(12.0)
    g0, g1 = second
    assert (g0.util_pct, g0.mem_util_pct, g0.mem_used_mib, g0.mem_total_mib) == (90.0, 40.0, 1024.0, 16384.0)
    assert (g0.sm_clock_mhz, g0.mem_clock_mhz, g0.power_w, g0.power_limit_w, g0.temp_c) == (
        1410.0, 1593.0, 250.0, 400.0, 60.0)
    assert g0.throttle_reasons == 0x4
    assert g0.pids == [3, 7]
    # counters: bytes (PCIe) and KiB (NVLink) over the 2 s between samples; none on the first sample
    assert first[0].pcie_tx_mib_s is None
    assert (g0.pcie_tx_mib_s, g0.pcie_rx_mib_s, g0.nvlink_tx_mib_s, g0.nvlink_rx_mib_s) == (2.0, 1.0, 1.0, 0.5)
    # device 1: no counters, so the legacy PCIe query (KB/s), at most once a second; event reasons
    # unsupported -> the older throttle-reasons call; a failing power read is N/A, not a crash
    assert (g1.pcie_tx_mib_s, g1.pcie_rx_mib_s) == (2.0, 1.0)
    assert g1.throttle_reasons == 0x40
    assert g1.power_w is None
    third = b.sample(12.5)
    assert third[1].pcie_tx_mib_s is None
    # "not supported" is remembered per device: device 0 asked at every sample, device 1 only once
    assert lib.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 3 + 1
    b.sample(13.0)
    assert lib.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 4 + 1
    # a passing error is asked again
    assert lib.calls["nvmlDeviceGetPowerUsage"] == 8
    assert nvml.driver_version() == "550.90.07"
    b.close()


def test_nvml_missing_function_is_na(fresh_nvml: pytest.MonkeyPatch) -> None:
    lib = fake_pynvml()
    del lib.nvmlDeviceGetTemperature
    fresh_nvml.setitem(sys.modules, "pynvml", lib)
    b = nvml.NvmlBackend(processes=False)
    b.open()
    s = b.sample(0.0)[0]
    assert s.temp_c is None
    assert s.util_pct == 90.0
    assert s.pids is None
    assert nvml.query("nvmlDeviceGetTemperature", 0, 0) is nvml.NA
    assert repr(nvml.NA) == "N/A"
    assert not nvml.NA


def test_nvml_init_failure_and_missing_package(fresh_nvml: pytest.MonkeyPatch) -> None:
    fresh_nvml.setitem(sys.modules, "pynvml", fake_pynvml(init_error=12))
    with pytest.raises(nvml.NvmlUnavailable, match="NVML is unavailable: NVML Shared Library Not Found"):
        nvml.NvmlBackend().open()
    with pytest.raises(nvml.NvmlUnavailable):  # the same answer, without trying again
        nvml.init()
    fresh_nvml.setattr(nvml, "_init_error", None)
    fresh_nvml.setitem(sys.modules, "pynvml", None)
    with pytest.raises(nvml.NvmlUnavailable, match=r"nvidia-ml-py is not installed \(pip install"):
        nvml.init()


# ----------------------------------------------------------------------------------
# gpuidle monitor
# ----------------------------------------------------------------------------------


def test_monitor_command_with_a_recorded_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ticks = [[full_sample(0, 95.0), full_sample(1, 40.0)]]
    monkeypatch.setattr(cli_live, "GPU_BACKEND", lambda: RecordedBackend(ticks))
    monkeypatch.setattr(cli_live, "HOST_BACKEND", lambda pid: FakeHost())
    log = tmp_path / "util.jsonl"
    assert main(["monitor", "--count", "3", "--interval", "0.1", "--out", str(log), "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["schema"] == "gpuidle.utilization/1"
    assert [d["mean_util_pct"] for d in report["devices"]] == [95.0, 40.0]
    assert "3 samples written" in captured.err
    lines = log.read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["header", "sample", "sample", "sample", "end"]


def test_monitor_as_an_exporter_only_writes_no_log(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """With no --out, no summary and no ledger, a long-running exporter keeps nothing on disk."""
    backend = RecordedBackend([[full_sample(0, 95.0)]])
    monkeypatch.setattr(cli_live, "GPU_BACKEND", lambda: backend)
    monkeypatch.setattr(cli_live, "HOST_BACKEND", lambda pid: FakeHost())
    opened: list[str] = []
    monkeypatch.setattr(cli_live, "JsonlWriter", lambda path: opened.append(path))
    assert main(["monitor", "--count", "3", "--interval", "0.1", "--no-summary", "--no-ledger", "--quiet"]) == 0
    assert opened == []
    assert len(backend.at) == 3
    assert backend.closed
    assert capsys.readouterr().out == ""


def test_monitor_without_nvml_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    why = "NVML is unavailable: NVML Shared Library Not Found (no NVIDIA driver or GPU on this machine?)"
    monkeypatch.setattr(cli_live, "GPU_BACKEND", lambda: RecordedBackend([[full_sample(0, 1.0)]], fail=why))
    monkeypatch.setattr(cli_live, "HOST_BACKEND", lambda pid: FakeHost())
    assert main(["monitor", "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuidle: error: {why}")
    assert err.count("\n") == 1


def test_monitor_on_this_machine_says_nvml_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        nvml.init()
    except nvml.NvmlUnavailable:
        pass
    else:
        pytest.skip("NVML works here: see tests/gpu")
    assert main(["monitor", "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuidle: error: ")
    assert "NVML" in err
    assert err.count("\n") == 1


class InterruptingBackend(RecordedBackend):
    """Presses Ctrl-C (SIGINT to this process) while taking the third sample."""

    def sample(self, t: float) -> list[GpuSample]:
        out = super().sample(t)
        if len(self.at) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return out


def test_monitor_stops_cleanly_on_ctrl_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_live, "GPU_BACKEND", lambda: InterruptingBackend([[full_sample(0, 80.0)]]))
    monkeypatch.setattr(cli_live, "HOST_BACKEND", lambda pid: FakeHost())
    log = tmp_path / "util.jsonl"
    before = signal.getsignal(signal.SIGINT)
    assert main(["monitor", "--interval", "0.1", "--out", str(log), "--json", "--quiet"]) == 0
    assert signal.getsignal(signal.SIGINT) is before
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["type"] for x in lines] == ["header", "sample", "sample", "sample", "end"]
    assert json.loads(capsys.readouterr().out)["devices"][0]["mean_util_pct"] == 80.0
