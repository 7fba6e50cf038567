"""Counter-log readers on files written after nvidia-smi's documented formats (tests/data/smi)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from conftest import DATA
from gpuidle.cli import main
from gpuidle.errors import InputNotFound, NotATrace
from gpuidle.model import (
    MONITOR_FORMAT,
    GpuInfo,
    GpuSample,
    HostSample,
    MonitorEnd,
    MonitorHeader,
    MonitorSample,
)
from gpuidle.sources import smi

SMI = DATA / "smi"
NAN = np.nan


def col(series: smi.UtilSeries, device: int, key: str) -> list[float]:
    d = series.device(device)
    assert d is not None
    return d.col(key).tolist()


def same(a: list[float], b: list[float]) -> bool:
    return np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), equal_nan=True)


def test_csv_with_units_in_headers_and_values() -> None:
    s = smi.read(SMI / "query_gpu_units.csv")
    assert s.format == smi.FORMAT_CSV
    assert [d.device for d in s.devices] == [0, 1]
    assert s.devices[0].name == "NVIDIA A100-SXM4-80GB"
    # one row per GPU per sample; each device keeps its own timestamps (GPU 1 is read 4 ms later)
    assert s.devices[0].t.tolist() == [0.0, 0.5, 1.0]
    assert same(s.devices[1].t.tolist(), [0.004, 0.504, 1.004])
    assert col(s, 0, "util_pct") == [97.0, 0.0, 100.0]
    assert col(s, 0, "power_w") == [312.45, 88.02, 398.71]
    assert col(s, 0, "temp_c") == [62.0, 61.0, 64.0]
    assert col(s, 0, "throttle_reasons") == [0.0, 1.0, 4.0]  # hex bitmask
    # [N/A] and [Not Supported] are explicit gaps, not zeros
    assert same(col(s, 1, "util_pct"), [95.0, NAN, 88.0])
    assert same(col(s, 1, "power_w"), [305.1, NAN, 290.0])
    assert same(col(s, 1, "sm_clock_mhz"), [1410.0, NAN, 1410.0])
    assert same(col(s, 1, "throttle_reasons"), [4.0, NAN, 0.0])
    assert col(s, 1, "mem_used_mib") == [30517.0, 30517.0, 30996.0]
    assert col(s, 1, "mem_total_mib") == [81920.0] * 3
    assert s.t0 is not None
    assert s.notes == []


def test_csv_nounits_new_field_names_and_memory_from_free() -> None:
    s = smi.read(SMI / "query_gpu_nounits.csv")
    assert s.devices[0].t.tolist() == [0.0, 0.1, 0.2, 0.3]  # -lms 100, exact
    assert same(col(s, 0, "util_pct"), [12.0, 100.0, NAN, 64.0])
    assert same(col(s, 0, "power_w"), [71.35, 299.1, NAN, 250.0])  # power.draw.instant
    assert col(s, 0, "power_limit_w") == [300.0] * 4  # enforced.power.limit
    assert same(col(s, 0, "sm_clock_mhz"), [1815.0, 1755.0, NAN, 1800.0])  # clocks.current.sm
    assert same(col(s, 0, "throttle_reasons"), [0.0, 4.0, NAN, 0.0])  # clocks_event_reasons.active
    # memory.used = memory.total - memory.free; [N/A] free gives N/A used
    assert same(col(s, 0, "mem_used_mib"), [24564 - 20468, 24564 - 4084, NAN, 24564 - 4084])


def test_csv_without_header_needs_the_field_list() -> None:
    with pytest.raises(NotATrace, match="no header line"):
        smi.read(SMI / "query_gpu_noheader.csv")
    s = smi.read(SMI / "query_gpu_noheader.csv", fields=["timestamp", "pci.bus_id", "utilization.gpu", "memory.used"])
    # no index column: devices numbered by first appearance of their bus id
    assert [d.device for d in s.devices] == [0, 1]
    assert col(s, 0, "util_pct") == [15.0, 35.0]
    assert col(s, 1, "util_pct") == [25.0, 45.0]
    assert col(s, 1, "mem_used_mib") == [2048.0, 4096.0]
    assert s.devices[1].t.tolist() == [0.0, 1.0]


def test_csv_per_reason_fields_and_a_repeated_header() -> None:
    s = smi.read(SMI / "query_gpu_event_reasons.csv")
    # gpu_idle 0x1, sw_power_cap 0x4, hw_slowdown 0x8, sw_thermal_slowdown 0x20; the repeated header is skipped
    assert col(s, 0, "throttle_reasons") == [0x4, 0x4 | 0x8, 0x1, 0x20]
    assert col(s, 0, "util_pct") == [90.0, 91.0, 0.0, 92.0]
    assert s.devices[0].t.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_dmon_default_output() -> None:
    s = smi.read(SMI / "dmon_default.log")
    assert s.format == smi.FORMAT_DMON
    assert s.t0 is None
    assert s.interval_s == 1.0
    assert "no Date/Time columns" in s.notes[0]
    assert [d.device for d in s.devices] == [0, 1]
    # the k-th row of a device is sample k, 1 s apart (dmon's default -d 1); repeated headers skipped
    assert s.devices[1].t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert col(s, 0, "util_pct") == [0.0, 98.0, 99.0, 80.0]  # dmon's "sm" is utilization.gpu
    assert col(s, 0, "mem_util_pct") == [0.0, 45.0, 47.0, 40.0]
    assert col(s, 0, "sm_clock_mhz") == [210.0, 1410.0, 1410.0, 1410.0]  # pclk
    assert same(col(s, 1, "power_w"), [64.0, 295.0, NAN, 290.0])  # "-" is N/A
    assert same(col(s, 1, "util_pct"), [2.0, 97.0, NAN, 75.0])


def test_dmon_interval_option() -> None:
    s = smi.read(SMI / "dmon_default.log", interval_s=0.5)
    assert s.devices[0].t.tolist() == [0.0, 0.5, 1.0, 1.5]


def test_dmon_date_time_across_midnight() -> None:
    s = smi.read(SMI / "dmon_datetime.log")
    assert s.devices[0].t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert col(s, 0, "util_pct") == [90.0, 85.0, 5.0, 95.0]
    assert col(s, 0, "mem_used_mib") == [30521.0, 30521.0, 30521.0, 31000.0]  # fb
    assert s.t0 is not None


def test_dmon_csv_time_only_across_midnight() -> None:
    s = smi.read(SMI / "dmon_time_csv.log")
    assert s.devices[0].t.tolist() == [0.0, 1.0, 2.0]
    assert same(col(s, 0, "pcie_rx_mib_s"), [1200.0, 1300.0, NAN])
    assert same(col(s, 0, "pcie_tx_mib_s"), [300.0, 310.0, NAN])
    assert s.t0 is None


def _write_log(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def _records() -> list[bytes]:
    enc = msgspec.json.encode
    return [
        enc(MonitorHeader(format=MONITOR_FORMAT, t0=100.0, interval_s=0.5, cores=2,
                          gpus=[GpuInfo(index=0, name="G0"), GpuInfo(index=1, name="G1")])),
        enc(MonitorSample(t=100.0, gpus=[GpuSample(index=0, util_pct=50.0, pids=[7]), GpuSample(index=1)],
                          host=HostSample(cpu_pct=[10.0, 30.0], mem_used_mib=100.0))),
        enc(MonitorSample(t=100.5, gpus=[GpuSample(index=0, util_pct=70.0)],
                          host=HostSample(cpu_pct=[50.0, 70.0]))),
    ]


def test_own_jsonl_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "util.jsonl"
    _write_log(p, [*_records(), msgspec.json.encode(MonitorEnd(t=101.0, samples=2, exit_code=3, devices=[0]))])
    s = smi.read(p)
    assert s.format == MONITOR_FORMAT
    assert s.t0 == 100.0
    assert s.exit_code == 3
    assert s.used_devices == [0]
    assert s.devices[0].t.tolist() == [0.0, 0.5]
    assert col(s, 0, "util_pct") == [50.0, 70.0]
    assert same(col(s, 1, "util_pct"), [NAN, NAN])  # GPU 1 in sample 1 without values, absent from sample 2
    assert s.devices[0].pids == [[7], []]
    assert s.host is not None
    assert s.host.cpu_pct.tolist() == [[10.0, 30.0], [50.0, 70.0]]
    assert same(s.host.col("mem_used_mib").tolist(), [100.0, NAN])


def test_own_jsonl_cut_off_last_line(tmp_path: Path) -> None:
    p = tmp_path / "util.jsonl"
    recs = _records()
    _write_log(p, [*recs, recs[-1][:20]])
    s = smi.read(p)
    assert len(s.devices[0]) == 2
    assert any("cut off" in n for n in s.notes)


def test_gzip_log(tmp_path: Path) -> None:
    p = tmp_path / "util.csv.gz"
    p.write_bytes(gzip.compress((SMI / "query_gpu_units.csv").read_bytes()))
    assert col(smi.read(p), 0, "util_pct") == [97.0, 0.0, 100.0]


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputNotFound):
        smi.read(tmp_path / "missing.csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("\n\n")
    with pytest.raises(NotATrace, match="empty"):
        smi.read(empty)
    other = tmp_path / "trace.json"
    other.write_text('{"traceEvents": []}\n')
    with pytest.raises(NotATrace, match="not a gpuidle monitor log"):
        smi.read(other)


def test_summarize_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summarize", str(SMI / "query_gpu_units.csv"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "gpuidle.utilization/1"
    assert out["source"]["format"] == "nvidia-smi-csv"
    assert [d["device"] for d in out["devices"]] == [0, 1]


def test_summarize_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summarize", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuidle: error: ")
    assert err.count("\n") == 1
    assert main(["summarize", str(SMI / "query_gpu_noheader.csv")]) == 2
    assert "--fields" in capsys.readouterr().err
    assert main(["summarize", str(SMI / "query_gpu_noheader.csv"), "--json",
                 "--fields", "timestamp,pci.bus_id,utilization.gpu,memory.used"]) == 0
