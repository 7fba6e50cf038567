"""A trace that recorded its launches and lost every device record: reported from its host side, exit code 1.

Real traces made into that case (their kernels, copies, sets and GPU annotations deleted, the launches kept with
their correlation ids), each figure checked against the raw events read with plain Python.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA
from gpuidle.api import analyze, compare_runs, record_analysis, timeline_for
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport
from gpuidle.report.jsonout import JsonRenderer
from gpuidle.report.registry import renderer_class

EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
LOST = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
TRACES = [DATA / "h200_dataloader__before.pt.trace.json.gz", EXAMPLE]
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "hipLaunchKernel")
SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "aten::item",
         "aten::_local_scalar_dense")


def events_of(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as f:
        doc = json.load(f)
    out: list[dict[str, Any]] = doc["traceEvents"] if isinstance(doc, dict) else doc
    return out


def without_device(src: Path, out: Path) -> Path:
    """``src`` with its device records deleted: every kernel, copy, set and GPU annotation."""
    with gzip.open(src) as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in LOST]
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def merged(ranges: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def inside(ranges: list[tuple[float, float]], lo: float, hi: float) -> float:
    """µs of the union of ``ranges`` within ``[lo, hi)``."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merged(ranges))


def expected(src: Path) -> dict[str, Any]:
    """The host side, from the raw events: the kernel launches with a correlation id, the profiler steps, and per
    step the launch calls begun in it and the time the launching threads were inside data loading and syncs."""
    events = [e for e in events_of(src) if e.get("ph") == "X"]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    kernel_launches = [e for e in runtime if e["name"] in KERNEL_LAUNCHES and "correlation" in e.get("args", {})]
    threads = {(e["pid"], e["tid"]) for e in kernel_launches}
    mine = [e for e in events if (e["pid"], e["tid"]) in threads]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#") and e["cat"] == "user_annotation"),
                   key=lambda e: e["ts"])
    launch_calls = [e["ts"] for e in runtime if "Launch" in e["name"] or e["name"].startswith("cudaMemset")]
    loading = [(e["ts"], e["ts"] + e["dur"]) for e in mine
               if e["name"].startswith("enumerate(DataLoader)") and e["cat"] != "cuda_runtime"]
    syncs = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["name"] in SYNCS]
    rows = []
    for s in steps:
        lo, hi = s["ts"], s["ts"] + s["dur"]
        rows.append({"step": int(s["name"].split("#")[1]), "ts": lo, "dur": s["dur"],
                     "launches": sum(1 for t in launch_calls if lo <= t < hi),
                     "data_loading": inside(loading, lo, hi), "sync": inside(syncs, lo, hi)})
    return {"lost": len(kernel_launches), "threads": len(threads), "steps": rows}


@pytest.mark.parametrize("src", TRACES, ids=["dataloader", "ddp"])
def test_a_real_trace_without_its_device_records_is_reported_from_its_host_side(src: Path, tmp_path: Path) -> None:
    trace = without_device(src, tmp_path / "lost.json.gz")
    report = analyze([trace])
    want = expected(src)
    assert report.ranks == []
    assert report.recommendations == []
    assert report.combined is None
    (h,) = report.host_side
    assert h.lost_launches == want["lost"] > 0
    assert h.threads == want["threads"]
    assert h.step_source == "profiler_step"
    assert [s.step for s in h.steps] == [s["step"] for s in want["steps"]]
    first_ts, first_s = want["steps"][0]["ts"], h.steps[0].start_s
    for got, raw in zip(h.steps, want["steps"], strict=True):
        assert got.dur_s == pytest.approx(raw["dur"] / 1e6, abs=1e-9)
        assert got.start_s - first_s == pytest.approx((raw["ts"] - first_ts) / 1e6, abs=2e-9)
        assert got.launches == raw["launches"]
        assert got.activity_s["data_loading"] == pytest.approx(raw["data_loading"] / 1e6, abs=1e-8)
        assert got.activity_s["sync"] == pytest.approx(raw["sync"] / 1e6, abs=1e-8)
    last = want["steps"][-1]
    assert h.dur_s == pytest.approx((last["ts"] + last["dur"] - first_ts) / 1e6, abs=2e-9)  # first to last step
    assert h.activity_s["data_loading"] >= sum(s.activity_s["data_loading"] for s in h.steps) - 1e-9
    (q,) = report.quality
    assert q.kind == "device_records_lost"
    assert q.ranks == [0]
    assert q.says.startswith(f"device records lost: {want['lost']} kernel launches with no kernel record")
    assert q.recording is not None
    assert "CUPTI buffer" in q.recording


def test_the_operators_with_the_most_time_are_their_outermost_calls(tmp_path: Path) -> None:
    """Each top operator's calls and time: its calls on the launching threads, one nested in another of its own
    counted once, as the raw events give them."""
    src = DATA / "h200_dataloader__before.pt.trace.json.gz"
    (h,) = analyze([without_device(src, tmp_path / "lost.json.gz")]).host_side
    events = [e for e in events_of(src) if e.get("ph") == "X"]
    threads = {(e["pid"], e["tid"]) for e in events if e.get("cat") == "cuda_runtime" and "Launch" in e["name"]}
    assert h.top_calls
    for call in h.top_calls:
        mine = sorted(((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "cpu_op"
                       and e["name"] == call.name and (e["pid"], e["tid"]) in threads), key=lambda r: (r[0], -r[1]))
        outer: list[tuple[float, float]] = []
        for a, b in mine:
            if not outer or a >= max(x[1] for x in outer):
                outer.append((a, b))
        assert call.count == len(outer), call.name
        assert call.total_s == pytest.approx(sum(b - a for a, b in outer) / 1e6, abs=1e-8), call.name
        assert call.share == pytest.approx(call.total_s / h.dur_s)
    assert [c.total_s for c in h.top_calls] == sorted((c.total_s for c in h.top_calls), reverse=True)


def test_the_command_prints_the_host_side_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every format says what the host did and that the device's records were lost, offers no fix; the JSON carries
    it; nothing annotated, nothing recorded in the ledger; exit code 1: a report, but an incomplete one."""
    trace = without_device(DATA / "h200_dataloader__before.pt.trace.json.gz", tmp_path / "lost.json.gz")
    ledger = tmp_path / "ledger.sqlite"
    annotated = tmp_path / "annotated.json"
    page = tmp_path / "page.html"
    code = main(["analyze", str(trace), "--ledger", str(ledger), "--annotate", str(annotated), "--html", str(page)])
    out, err = capsys.readouterr()
    assert code == 1
    (h,) = analyze([trace]).host_side
    assert "rank 0 · host side only: 104 kernel launches with no kernel record" in out
    assert "No fixes: each rests on the device's timing, which this trace lost." in out
    assert "device records lost: 104 kernel launches" in out
    assert "utilization" not in out.replace("no utilization", "")
    for step in h.steps:
        assert f"{step.step}  " in out
    assert "54.81 ms" in out
    assert "70.7 %" in out
    assert h.activity_s["data_loading"] == pytest.approx(54.81e-3, abs=5e-6)
    assert "not written: the trace holds no device activity" in err
    assert "not recorded in the ledger" in err
    assert not annotated.exists()
    assert "host side only: 104 kernel launches" in page.read_text()
    assert main(["analyze", str(trace), "--json", "--no-ledger", "--scale-to", "16", "--price-per-gpu-hour", "2"]) == 1
    out, err = capsys.readouterr()
    assert "--price-per-gpu-hour and --scale-to left out: they need the device's figures" in err
    doc = json.loads(out)
    assert doc["ranks"] == []
    assert doc["host_side"][0]["lost_launches"] == 104
    assert doc["schema_minor"] >= 14
    md = renderer_class("md")().render(analyze([trace]))
    assert "host side only: 104 kernel launches" in md
    assert "No fixes" in md
    assert "Top fixes" not in md  # no heading over no fix: the sentence says there is none
    assert AnalysisReport.from_json(JsonRenderer().render(analyze([trace]))).host_side == [h]


def test_the_library_refuses_what_needs_device_figures(tmp_path: Path) -> None:
    """A timeline to draw, a ledger record, a comparison: each needs the device's figures, and says so."""
    trace = without_device(DATA / "h200_dataloader__before.pt.trace.json.gz", tmp_path / "lost.json.gz")
    report = analyze([trace])
    with pytest.raises(GpuidleError, match="device records were lost"):
        timeline_for(report)
    with pytest.raises(GpuidleError, match="without device figures"):
        record_analysis(report, ledger_path=tmp_path / "ledger.sqlite")
    saved = tmp_path / "report.json"
    saved.write_text(JsonRenderer().render(report))
    with pytest.raises(GpuidleError, match="without device figures"):
        compare_runs(str(saved), str(saved))


def test_a_rank_without_device_records_does_not_take_the_job_down(tmp_path: Path) -> None:
    """Two ranks, one with its device records lost: the other is analysed as ever, the lost one reported from its
    host side and named above the fixes; the command exits 1."""
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(DATA / "trace_filter__sampled_rank-0.json.gz", job)
    without_device(DATA / "trace_filter__sampled_rank-1.json.gz", job / "rank1.json.gz")
    report = analyze([job])
    alone = analyze([DATA / "trace_filter__sampled_rank-0.json.gz"])
    assert [r.rank for r in report.ranks] == [0]
    assert report.ranks[0].devices == alone.ranks[0].devices
    assert [h.rank for h in report.host_side] == [1]
    lost = [q for q in report.quality if q.kind == "device_records_lost"]
    assert [q.ranks for q in lost] == [[1]]
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(job), "--no-ledger"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "rank 1: device records lost, in no figure of the job" in proc.stdout
    assert "device records lost: " in proc.stdout
    assert "(rank 1)" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_no_launch_and_no_kernel_stays_an_error(tmp_path: Path) -> None:
    """A CPU-only trace (no kernel, no launch) is no trace to analyse: one line, exit code 2."""
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(DATA / "rank_non_gpu__rank_non_gpu.json.gz"),
                           "--no-ledger"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpuidle: error:")
    assert "CPU-only" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_job_without_device_records_is_a_row_without_figures_in_the_fleet(tmp_path: Path) -> None:
    """A folder of jobs, one of whose traces lost its device records: that job's row says so, without figures,
    the other job's row is as ever; exit code 1."""
    fleet = tmp_path / "fleet"
    (fleet / "lost").mkdir(parents=True)
    (fleet / "kept").mkdir()
    without_device(DATA / "h200_dataloader__before.pt.trace.json.gz", fleet / "lost" / "rank0.json.gz")
    shutil.copy(DATA / "h200_dataloader__after.pt.trace.json.gz", fleet / "kept")
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(fleet), "--json", "--no-ledger"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    rows = {j["name"]: j for j in json.loads(proc.stdout)["jobs"]}
    assert rows["lost"]["error"].startswith("no device figures: rank 0")
    assert "104 kernel launches with no kernel record" in rows["lost"]["error"]
    assert rows["kept"]["error"] is None
    assert rows["kept"]["gpus"] == 1
