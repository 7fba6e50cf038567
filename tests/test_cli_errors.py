"""Bad input through the real command line: one line on stderr, exit code 2, input untouched."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from minitrace import Trace


def gpuidle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuidle", *args], capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuidle: error: ")
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_missing_path() -> None:
    assert_one_line_error(gpuidle("analyze", "/nonexistent/trace.json.gz"), "no such file")


def test_folder_without_traces(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert_one_line_error(gpuidle("analyze", str(tmp_path)), "no trace files")


def test_truncated_gzip(tmp_path: Path) -> None:
    src = DATA / "trace_filter__sampled_rank-0.json.gz"
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    before = digest(bad)
    assert_one_line_error(gpuidle("analyze", str(bad)), "truncated")
    assert digest(bad) == before


def test_damaged_gzip(tmp_path: Path) -> None:
    raw = bytearray((DATA / "trace_compare__base__base.json.gz").read_bytes())
    raw[40:60] = b"\xff" * 20
    bad = tmp_path / "damaged.json.gz"
    bad.write_bytes(bytes(raw))
    assert_one_line_error(gpuidle("analyze", str(bad)), "damaged.json.gz")


def test_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "trace.json"
    bad.write_text("this is not json\n")
    assert_one_line_error(gpuidle("analyze", str(bad)), "not JSON")


def test_truncated_plain_json(tmp_path: Path) -> None:
    text = gzip.decompress((DATA / "trace_compare__base__base.json.gz").read_bytes())
    bad = tmp_path / "trace.json"
    bad.write_bytes(text[: len(text) * 2 // 3])
    assert_one_line_error(gpuidle("analyze", str(bad)))


def test_json_without_trace_events(tmp_path: Path) -> None:
    bad = tmp_path / "trace.json"
    bad.write_text(json.dumps({"schemaVersion": 1, "events": []}))
    assert_one_line_error(gpuidle("analyze", str(bad)), "traceEvents")


def test_cpu_only_traces() -> None:
    for name in ("cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", "rank_non_gpu__rank_non_gpu.json.gz"):
        assert_one_line_error(gpuidle("analyze", str(DATA / name)), "no GPU activity")


def test_execution_trace() -> None:
    assert_one_line_error(gpuidle("analyze", str(DATA / "execution_trace__benchmark_simple_add_et.json.gz")),
                          "execution trace")


def test_non_gpu_accelerator() -> None:
    assert_one_line_error(gpuidle("analyze", str(DATA / "mtia_inference_trace__mtia_inference_rank_0.json.gz")),
                          "non-GPU accelerator")


def test_empty_file(tmp_path: Path) -> None:
    bad = tmp_path / "empty.json"
    bad.write_bytes(b"")
    assert_one_line_error(gpuidle("analyze", str(bad)))


def test_usage_error() -> None:
    proc = gpuidle("analyze", "--top", "zero", str(DATA / "trace_compare__base__base.json.gz"))
    assert_one_line_error(proc, "--top")


def test_folder_with_one_bad_rank(tmp_path: Path) -> None:
    shutil.copy(DATA / "trace_filter__sampled_rank-0.json.gz", tmp_path / "rank0.json.gz")
    shutil.copy(DATA / "trace_filter__sampled_rank-1.json.gz", tmp_path / "rank1.json.gz")
    (tmp_path / "rank2.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    (tmp_path / "readme.json").write_text('{"hello": "world"}')
    proc = gpuidle("analyze", str(tmp_path), "--json", "--workers", "2")
    assert proc.returncode == 1, proc.stderr  # the report is complete but for the files it names
    report = json.loads(proc.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    skipped = "\n".join(report["source"]["skipped"])
    assert "rank2.json.gz" in skipped
    assert "readme.json" in skipped
    assert "rank2.json.gz" in proc.stderr
    assert "warning" in proc.stderr


def test_mismatched_world_sizes(tmp_path: Path) -> None:
    for rank, world in ((0, 2), (1, 4)):
        t = Trace(rank=rank, world=world)
        t.step(1, 0, 100)
        t.launch(at=0, call_dur=5, start=10, dur=50)
        t.write(tmp_path / f"rank{rank}.json.gz")
    proc = gpuidle("analyze", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)["job"]
    assert any("world size" in n for n in job["notes"])


@pytest.mark.parametrize("fmt", ["terminal", "json", "md"])
def test_formats_render(fmt: str, tmp_path: Path) -> None:
    out = tmp_path / "report.out"
    proc = gpuidle("analyze", str(DATA / "nccl_parser_config__nccl_data.json.gz"), "--format", fmt, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "utilization" in text.lower()
    if fmt == "json":
        doc = json.loads(text)
        assert doc["schema"] == "gpuidle.analysis/1"
        gains = [r["gain"]["step_s_saved"] for r in doc["recommendations"] if r["alternative_to"] is None]
        known = [g for g in gains if g is not None]
        assert gains[: len(known)] == sorted(known, reverse=True)


def test_a_file_named_as_an_nsight_export_that_is_not_one(tmp_path: Path) -> None:
    """Told what it was named as, and how to make a real one, not that it is not JSON."""
    bad = tmp_path / "report.sqlite"
    bad.write_bytes(bytes(range(256)) * 4)
    proc = gpuidle("analyze", str(bad))
    assert_one_line_error(proc, "not an Nsight Systems export")
    assert "JSON" not in proc.stderr
    assert "nsys export --type sqlite" in proc.stderr


@pytest.mark.parametrize("name", ["query_gpu_units.csv", "dmon_default.log", "dcgmi_dmon.log"])
def test_a_counter_log_given_to_analyze_points_to_summarize(name: str) -> None:
    log = DATA / "smi" / name
    assert_one_line_error(gpuidle("analyze", str(log), "--no-ledger"), "a GPU counter log",
                          f"gpuidle summarize {log} reads it")


def test_a_text_file_that_is_no_counter_log_is_not_sent_to_summarize() -> None:
    proc = gpuidle("analyze", str(DATA / "smi" / "README.md"), "--no-ledger")
    assert proc.returncode == 2
    assert "summarize" not in proc.stderr
