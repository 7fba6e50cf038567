"""Broken and hostile counter logs: ``summarize`` gives a sane report or one error line, never a traceback."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from conftest import DATA
from gpuidle.analysis.utilization import analyze
from gpuidle.cli import main
from gpuidle.errors import NotATrace
from gpuidle.model import MONITOR_FORMAT, GpuSample, MonitorHeader, MonitorSample
from gpuidle.sources import dcgm, smi

HEADER = "timestamp, index, utilization.gpu [%], clocks_event_reasons.active"


def csv(path: Path, rows: list[tuple[str, str, str, str]]) -> Path:
    """A ``--query-gpu`` CSV, one row per ``(seconds after 12:00:00, index, util, mask)``."""
    lines = [HEADER] + [f"2024/05/02 12:00:{s}, {i}, {u} %, {m}" for s, i, u, m in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def summarize_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["summarize", str(path), "--json", "--no-ledger"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    report: dict[str, Any] = json.loads(out)
    return report


def test_clock_event_mask_beyond_64_bits_is_not_available(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    p = csv(tmp_path / "mask.csv", [("00.000", "0", "90", "0x" + "F" * 400), ("01.000", "0", "95", "0x4"),
                                    ("02.000", "0", "97", "0xFFFFFFFFFFFFFFFF")])
    s = smi.read(p)
    d = s.device(0)
    assert d is not None
    assert np.isnan(d.col("throttle_reasons")[0])
    assert d.col("throttle_reasons")[1:].tolist() == [4.0, float(0xFFFFFFFF)]  # a 64-bit mask: its low bits
    report = summarize_json(p, capsys)  # no numpy warning on stderr for the all-bits mask either
    dev = report["devices"][0]
    assert dev["mean_util_pct"] == pytest.approx((90 + 95 + 97) / 3)
    # the busy samples with a known mask: 0x4 and all bits; sw_power_cap (0x4) in both
    assert dev["throttle_share"]["sw_power_cap"] == 1.0


def test_an_index_that_is_not_a_number_skips_its_row(tmp_path: Path) -> None:
    p = csv(tmp_path / "index.csv", [("00.000", "0", "40", "0x0"), ("00.000", "²", "99", "0x0"),
                                     ("01.000", "0", "60", "0x0"), ("01.000", "1234567", "99", "0x0")])
    s = smi.read(p)
    assert [d.device for d in s.devices] == [0]
    assert s.devices[0].col("util_pct").tolist() == [40.0, 60.0]
    assert "2 row(s) with an unreadable GPU index ignored" in s.notes


def test_dmon_and_dcgmi_rows_with_a_superscript_index_are_skipped(tmp_path: Path) -> None:
    dmon = tmp_path / "dmon.log"
    dmon.write_text("# gpu    pwr  gtemp  sm\n# Idx      W      C   %\n"
                    "    0    60     40  50\n    ²    60     40  70\n")
    s = smi.read(dmon)
    assert [d.device for d in s.devices] == [0]
    assert "1 malformed row(s) ignored" in s.notes
    log = tmp_path / "dcgm.log"
    log.write_text("#Entity   GPUTL  POWER\nID\nGPU 0     87     312.4\nGPU ²     85     305.1\n")
    with open(log) as f:
        d = dcgm.read(f, str(log))
    assert [x.device for x in d.devices] == [0]
    assert "1 malformed row(s) ignored" in d.notes


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_jsonl_is_an_error_line_not_a_recursion(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "deep.jsonl"
    p.write_text('{"type": "header", "format": "gpuidle.monitor/1", "x": ' + _nested(100_000) + "}\n")
    with pytest.raises(NotATrace, match="no header line"):
        smi.read(p)
    assert main(["summarize", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuidle: error: ")
    assert err.count("\n") == 1
    # after a good header, a nested sample line is one unreadable line among good ones
    enc = msgspec.json.encode
    head = enc(MonitorHeader(format=MONITOR_FORMAT, t0=0.0, interval_s=1.0))
    good = [enc(MonitorSample(t=float(i), gpus=[GpuSample(index=0, util_pct=50.0)])) for i in range(3)]
    bad = b'{"type": "sample", "t": 1.5, "gpus": ' + _nested(100_000).encode() + b"}"
    p.write_bytes(b"\n".join([head, good[0], bad, *good[1:]]) + b"\n")
    s = smi.read(p)
    assert len(s.devices[0]) == 3
    assert "1 unreadable line(s) ignored, first at line 3" in s.notes


def test_reversed_timestamps_are_put_in_order(tmp_path: Path) -> None:
    p = csv(tmp_path / "rev.csv", [("03.000", "0", "30", "0x0"), ("02.000", "0", "20", "0x0"),
                                   ("01.000", "0", "10", "0x0"), ("00.500", "0", "50", "0x0")])
    s = smi.read(p)
    d = s.devices[0]
    assert d.t.tolist() == [0.0, 0.5, 1.5, 2.5]  # from the earliest timestamp, 12:00:00.5
    assert d.col("util_pct").tolist() == [50.0, 10.0, 20.0, 30.0]
    assert s.t0 is not None
    assert s.t0 % 60 == pytest.approx(0.5)
    assert smi.UNORDERED_NOTE in s.notes
    a = analyze(s)
    assert a.window.start_s >= 0.0
    assert a.window.start_s + a.window.dur_s <= 3.5
    # the same in gpuidle's own log: samples written out of order
    enc = msgspec.json.encode
    log = tmp_path / "rev.jsonl"
    lines = [enc(MonitorHeader(format=MONITOR_FORMAT, t0=100.0, interval_s=1.0))]
    lines += [enc(MonitorSample(t=100.0 + t, gpus=[GpuSample(index=0, util_pct=u)]))
              for t, u in [(3.0, 30.0), (2.0, 20.0), (1.0, 10.0), (0.0, 50.0)]]
    log.write_bytes(b"\n".join(lines) + b"\n")
    s = smi.read(log)
    assert s.devices[0].t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert s.devices[0].col("util_pct").tolist() == [50.0, 10.0, 20.0, 30.0]
    a = analyze(s)
    assert a.window.start_s == 0.0
    assert a.window.dur_s == 4.0
    assert a.devices[0].mean_util_pct == (50 + 10 + 20 + 30) / 4


def test_impossible_utilization_is_not_averaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one sample a second; -5 and 250 are not readings; 100.00005 is float noise on 100
    util = ["70", "-5", "80", "250", "90", "100.00005"]
    p = csv(tmp_path / "range.csv", [(f"0{i}.000", "0", u, "0x0") for i, u in enumerate(util)])
    report = summarize_json(p, capsys)
    dev = report["devices"][0]
    assert dev["samples"] == 4
    assert dev["mean_util_pct"] == pytest.approx((70 + 80 + 90 + 100) / 4)
    assert dev["median_util_pct"] == pytest.approx((80 + 90) / 2)
    notes = report["notes"]
    assert "device 0: 2 utilization.gpu value(s) outside 0–100 % (-5, 250) treated as not available" in notes
    assert report["window"]["start_s"] == 0.0


def test_impossible_values_of_other_columns(tmp_path: Path) -> None:
    from gpuidle.analysis.counter_range import without_impossible_values
    from gpuidle.model import DeviceSeries

    t = np.arange(4.0)
    d = DeviceSeries(device=3, name=None, t=t, values={
        "sm_active": np.array([0.5, 1.2, -0.1, 1.0000000001]),
        "power_w": np.array([300.0, -1.0, np.inf, np.nan]),
        "temp_c": np.array([60.0, -300.0, -10.0, 50.0]),
    })
    (out,), notes = without_impossible_values([d])
    np.testing.assert_array_equal(out.values["sm_active"], [0.5, np.nan, np.nan, 1.0])
    assert np.isnan(out.values["power_w"][1:]).all()
    assert out.values["power_w"][0] == 300.0
    assert np.isnan(out.values["temp_c"][1])
    assert out.values["temp_c"][2] == -10.0
    assert notes == [
        "device 3: 2 DCGM SM_ACTIVE value(s) outside 0–1 (1.2, -0.1) treated as not available",
        "device 3: 2 power draw value(s) negative or infinite (-1, inf) treated as not available",
        "device 3: 1 GPU temperature value(s) below -273.15 (-300) treated as not available",
    ]


@pytest.mark.parametrize(("bom", "encoding"), [(b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le")])
def test_a_byte_order_mark_is_read(tmp_path: Path, bom: bytes, encoding: str) -> None:
    text = (DATA / "smi" / "query_gpu_units.csv").read_text()
    p = tmp_path / "bom.csv"
    p.write_bytes(bom + text.encode(encoding))
    s = smi.read(p)
    plain = smi.read(DATA / "smi" / "query_gpu_units.csv")
    assert [d.device for d in s.devices] == [0, 1]
    assert s.devices[0].name == "NVIDIA A100-SXM4-80GB"
    for a, b in zip(s.devices, plain.devices, strict=True):
        assert np.allclose(a.col("util_pct"), b.col("util_pct"), equal_nan=True)


def test_sample_times_past_any_date_are_unreadable_lines(tmp_path: Path) -> None:
    """±1e308 seconds in gpuidle's own log, as in a Prometheus one: two such times would span infinity."""
    enc = msgspec.json.encode
    lines = [enc(MonitorHeader(format=MONITOR_FORMAT, t0=100.0, interval_s=1.0))]
    lines += [enc(MonitorSample(t=t, gpus=[GpuSample(index=0, util_pct=50.0)]))
              for t in (100.0, 1e308, -1e308, 101.0, 102.0)]
    log = tmp_path / "far.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow in numpy would warn
        s = smi.read(log)
        a = analyze(s)
    assert s.devices[0].t.tolist() == [0.0, 1.0, 2.0]
    assert "2 unreadable line(s) ignored, first at line 3" in s.notes
    assert a.window.dur_s == 3.0
