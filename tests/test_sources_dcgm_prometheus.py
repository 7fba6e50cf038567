"""``summarize`` inputs beside nvidia-smi: a saved ``dcgmi dmon`` run and a Prometheus range-query export."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.sources import smi

SMI = Path(__file__).parent / "data" / "smi"
DCGMI = SMI / "dcgmi_dmon.log"
PROM = SMI / "prometheus_query_range.json"
MIB = 1024 * 1024


def _dcgmi_rows() -> dict[int, list[list[str]]]:
    """The GPU rows of the fixture, split by hand."""
    out: dict[int, list[list[str]]] = {}
    for line in DCGMI.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "GPU":
            out.setdefault(int(parts[1]), []).append(parts[2:])
    return out


def _f(cell: str) -> float:
    return math.nan if cell == "N/A" else float(cell)


def test_dcgmi_dmon_columns_and_times() -> None:
    s = smi.read(DCGMI, interval_s=0.5)
    assert s.format == "dcgmi-dmon"
    rows = _dcgmi_rows()
    assert [d.device for d in s.devices] == sorted(rows)
    for d in s.devices:
        r = rows[d.device]
        assert d.t.tolist() == [i * 0.5 for i in range(len(r))]       # -d 500: rows 0.5 s apart
        for j, col in enumerate(("util_pct", "mem_used_mib", "mem_total_mib", "power_w", "temp_c", "sm_active",
                                 "sm_occupancy", "tensor_active", "dram_active")):
            np.testing.assert_array_equal(d.col(col), np.array([_f(x[j]) for x in r]))
    assert math.isnan(s.devices[1].col("util_pct")[2])                # N/A stays not available


def test_dcgmi_dmon_summarized(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summarize", str(DCGMI), "--interval", "0.5", "--json", "--no-ledger"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (d0, d1) = doc["devices"]
    # GPU 0 is above the idle threshold from its first row to its last: all 6 rows in the window
    u0 = [_f(r[0]) for r in _dcgmi_rows()[0]]
    assert d0["mean_util_pct"] == pytest.approx(sum(u0) / len(u0))
    assert d0["sm_active_mean"] == pytest.approx(np.mean([_f(r[5]) for r in _dcgmi_rows()[0]]))
    assert d1["samples"] == 5                                          # one N/A utilization


def _prom() -> dict[tuple[str, int, str], list[tuple[float, float]]]:
    doc = json.loads(PROM.read_text())
    out: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    for r in doc["data"]["result"]:
        m = r["metric"]
        out[(m["Hostname"], int(m["gpu"]), m["__name__"])] = [(float(t), float(v)) for t, v in r["values"]]
    return out


def test_prometheus_range_export() -> None:
    s = smi.read(PROM)
    assert s.format == "prometheus-range"
    ref = _prom()
    keys = sorted({(h, g) for h, g, _ in ref})
    assert len(s.devices) == len(keys) == 4
    t0 = min(t for pts in ref.values() for t, _ in pts)
    assert s.t0 == t0
    for n, (d, (host, gpu)) in enumerate(zip(s.devices, keys, strict=True)):
        assert d.device == n                                   # two hosts: numbered in order
        assert d.name == f"{host} GPU {gpu} · NVIDIA H100 80GB HBM3"
        util = ref[(host, gpu, "DCGM_FI_DEV_GPU_UTIL")]
        assert d.t.tolist() == [t - t0 for t, _ in util]       # the second host keeps its 2 s offset
        np.testing.assert_array_equal(d.col("util_pct"), [v for _, v in util])
        used = [v for _, v in ref[(host, gpu, "DCGM_FI_DEV_FB_USED")]]
        free = [v for _, v in ref[(host, gpu, "DCGM_FI_DEV_FB_FREE")]]
        np.testing.assert_array_equal(d.col("mem_total_mib"), [a + b for a, b in zip(used, free, strict=True)])
        np.testing.assert_array_equal(d.col("sm_active"), [v for _, v in ref[(host, gpu, "DCGM_FI_PROF_SM_ACTIVE")]])
    assert any("2 hosts" in n for n in s.notes)


def test_prometheus_export_summarized(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summarize", str(PROM), "--json", "--no-ledger"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["window"]["interval_s"] == 15.0
    d0 = doc["devices"][0]
    # gpu-node-01 GPU 0: 0 95 96 2 94 97 1 95, window from the first busy sample to the end of the last
    u = [95, 96, 2, 94, 97, 1, 95]
    assert d0["mean_util_pct"] == pytest.approx(sum(u) / len(u))
    assert d0["idle_period_count"] == 2


@pytest.mark.parametrize(("text", "needle"), [
    ('{"status": "error", "errorType": "bad_data", "error": "parse error", "data": {}}', "the query failed"),
    ('{"status": "success", "data": {"resultType": "vector", "result": []}}', "not a range query"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": ['
     '{"metric": {"__name__": "node_load1"}, "values": [[1, "1"]]}]}}', "no GPU series"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [', "not valid JSON"),
])
def test_prometheus_bad_exports_are_one_error(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "q.json"
    p.write_text(text)
    with pytest.raises(GpuidleError, match=needle):
        smi.read(p)


def test_prometheus_points_out_of_range_are_skipped(tmp_path: Path) -> None:
    p = tmp_path / "q.json"
    p.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0"},
         "values": [[0, "50"], ["inf", "60"], [15, "Inf"], [30, "70"], [45, "1e999"], "x"]}]}}))
    s = smi.read(p)
    assert s.devices[0].t.tolist() == [0.0, 15.0, 30.0, 45.0]
    assert np.isnan(s.devices[0].col("util_pct")).tolist() == [False, True, False, True]
    assert any("2 unreadable" in n for n in s.notes)


def test_prometheus_export_of_gpuidle_metrics_reads_back_into_the_columns(tmp_path: Path) -> None:
    """gpuidle's own exporter names (ratios, bytes, hertz) read back into %, MiB and MHz."""
    labels = {"gpu": "1", "UUID": "GPU-b", "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "node-7",
              "job": "train-42", "rank": "3", "instance": "node-7:9400"}
    series = {
        "gpuidle_gpu_utilization_ratio": ["0.25", "0.5"],
        "gpuidle_gpu_memory_used_bytes": [str(3 * 1024 * MIB), str(5 * 1024 * MIB)],
        "gpuidle_gpu_memory_total_bytes": [str(80 * 1024 * MIB)] * 2,
        "gpuidle_gpu_sm_clock_hertz": ["1410000000", "1005000000"],
        "gpuidle_gpu_pcie_rx_bytes_per_second": [str(512 * MIB), "0"],
        "gpuidle_gpu_power_watts": ["301.5", "NaN"],
        "gpuidle_host_memory_used_bytes": ["1e9", "2e9"],  # a host series: no gpu label, not a device
    }
    result = [{"metric": {"__name__": name, **labels}, "values": [[1000, v[0]], [1005, v[1]]]}
              for name, v in series.items()]
    p = tmp_path / "q.json"
    p.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    s = smi.read(p)
    (d,) = s.devices
    assert (d.device, d.name, d.t.tolist()) == (1, "NVIDIA A100-SXM4-80GB", [0.0, 5.0])
    np.testing.assert_allclose(d.col("util_pct"), [25.0, 50.0])
    np.testing.assert_allclose(d.col("mem_used_mib"), [3072.0, 5120.0])
    np.testing.assert_allclose(d.col("mem_total_mib"), [81920.0, 81920.0])
    np.testing.assert_allclose(d.col("sm_clock_mhz"), [1410.0, 1005.0])
    np.testing.assert_allclose(d.col("pcie_rx_mib_s"), [512.0, 0.0])
    assert d.col("power_w")[0] == 301.5
    assert np.isnan(d.col("power_w")[1])
