"""Before/after comparisons: a real trace pair, a generated pair with known numbers, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.analysis.compare import RunInfo, compare, summarize
from gpuidle.cli import main
from gpuidle.ledger import Ledger
from gpuidle.model import CAUSES, AnalysisReport, Comparison
from gpuidle.report.compare_text import CompareMarkdownRenderer, load_comparison
from minitrace import Trace

BASE = DATA / "trace_compare__base__base.json.gz"
TEST = DATA / "trace_compare__test__test.json.gz"
US = 1e-6
NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def loader_trace(load_us: float, steps: int = 4, world: int | None = None, gpu: str = "Test GPU") -> Trace:
    """Each step: ``load_us`` in DataLoader ``__next__``, a 100 µs op launching a 500 µs kernel."""
    t = Trace(world=world)
    period = load_us + 600
    for i in range(steps):
        o = i * period
        t.step(i + 1, o, period)
        t.annotation(NEXT, o, load_us)
        t.op("aten::linear", o + load_us, 100)
        t.launch(at=o + load_us + 50, call_dur=10, start=o + load_us + 100, dur=500)
    if gpu != "Test GPU":
        original = t.to_dict

        def renamed() -> dict[str, object]:
            doc = original()
            doc["deviceProperties"] = [{"id": 0, "name": gpu}]
            return doc

        t.to_dict = renamed  # type: ignore[method-assign]
    return t


def analyzed(t: Trace, path: Path) -> AnalysisReport:
    return api.analyze([t.write(path)])


@pytest.fixture(scope="module")
def real_pair() -> tuple[AnalysisReport, AnalysisReport]:
    return api.analyze([BASE]), api.analyze([TEST])


def test_real_pair(real_pair: tuple[AnalysisReport, AnalysisReport]) -> None:
    before, after = real_pair
    c = compare(before, after, RunInfo(ref="base"), RunInfo(ref="test"))
    a, b = before.ranks[0].primary(), after.ranks[0].primary()
    # both traces: 2 profiler steps; windows 274.536 ms and 222.492 ms (integer-µs timestamps)
    assert (c.before.steps, c.after.steps) == (2, 2)
    assert c.before.step_s == pytest.approx(0.274536 / 2, abs=1e-12)
    assert c.after.step_s == pytest.approx(0.222492 / 2, abs=1e-12)
    assert c.step_s_delta == pytest.approx((0.222492 - 0.274536) / 2, abs=1e-12)
    assert c.speedup == pytest.approx(0.274536 / 0.222492)
    assert c.before.utilization == a.utilization
    assert c.after.utilization == b.utilization
    assert c.utilization_delta == b.utilization - a.utilization
    for cause in CAUSES:
        k = cause.value
        assert c.before.idle_by_cause_s[k] == pytest.approx(a.idle_by_cause_s[k] / 2, abs=1e-15)
        assert c.idle_by_cause_delta_s[k] == pytest.approx((b.idle_by_cause_s[k] - a.idle_by_cause_s[k]) / 2,
                                                           abs=1e-15)
    assert c.before.idle_s == pytest.approx(a.idle_s / 2)
    assert c.after.idle_s == pytest.approx(b.idle_s / 2)
    # rank 1 of a job whose traces record neither world size nor device names
    assert (c.before.world_size, c.before.gpu_model, c.comparable, c.differences) == (1, None, True, [])
    assert (c.before.ref, c.after.ref) == ("base", "test")
    # these tiny traces record no CPU operators: that is said above the fixes, and no fix is a recording advice
    assert c.recommendations == []
    assert c.cost is None


def test_generated_pair_exact(tmp_path: Path) -> None:
    before = analyzed(loader_trace(400), tmp_path / "before.json.gz")
    after = analyzed(loader_trace(10), tmp_path / "after.json.gz")
    c = compare(before, after, RunInfo("run 1", "baseline", 64), RunInfo("run 2", "num_workers 0->8", 64),
                price_per_gpu_hour=2.0, steps=5000)
    assert (c.before.utilization, c.after.utilization) == (pytest.approx(0.5), pytest.approx(500 / 610))
    assert (c.before.step_s, c.after.step_s) == (pytest.approx(1000 * US), pytest.approx(610 * US))
    assert c.speedup == pytest.approx(1000 / 610)
    assert c.before.idle_by_cause_s["data_loading"] == pytest.approx(400 * US)
    assert c.after.idle_by_cause_s["data_loading"] == pytest.approx(10 * US)
    assert c.idle_by_cause_delta_s["data_loading"] == pytest.approx(-390 * US)
    # [load, load+50) in an op that launches, [load+50, load+100) the launch in flight: unchanged
    assert c.idle_by_cause_delta_s["launch_overhead"] == pytest.approx(0.0, abs=1e-15)
    assert c.before.idle_by_cause_s["launch_overhead"] == pytest.approx(100 * US)
    status = {x.id: x.status for x in c.recommendations}
    assert status["dataloader_workers"] == "resolved"
    assert "new" not in status.values()
    resolved = next(x for x in c.recommendations if x.id == "dataloader_workers")
    assert resolved.gain_before_s == pytest.approx(400 * US)
    assert resolved.gain_after_s is None
    assert c.recommendations[0].id == "dataloader_workers"  # resolved first
    assert (c.comparable, c.differences, c.notes) == (True, [], [])
    assert (c.before.label, c.after.label, c.before.batch_size) == ("baseline", "num_workers 0->8", 64)
    assert c.before.gpu_model == "Test GPU"
    assert c.cost is not None
    assert c.cost.before == pytest.approx(1000 * US * 5000 * 1 * 2.0 / 3600)
    assert c.cost.after == pytest.approx(610 * US * 5000 * 1 * 2.0 / 3600)
    assert c.cost.saved == pytest.approx(390 * US * 5000 * 2.0 / 3600)
    # the other way round, the fix is new
    back = compare(after, before)
    assert {x.id: x.status for x in back.recommendations}["dataloader_workers"] == "new"
    assert back.step_s_delta == pytest.approx(390 * US)


def test_not_comparable(tmp_path: Path) -> None:
    base = analyzed(loader_trace(400, world=2), tmp_path / "a.json.gz")
    other_gpu = analyzed(loader_trace(10, world=2, gpu="NVIDIA H100 80GB HBM3"), tmp_path / "b.json.gz")
    bigger = analyzed(loader_trace(10, world=4), tmp_path / "c.json.gz")
    c = compare(base, other_gpu)
    assert not c.comparable
    assert c.differences == ["GPU model differs: Test GPU vs NVIDIA H100 80GB HBM3"]
    c = compare(base, bigger)
    assert c.differences == ["world size differs: 2 vs 4 GPUs"]
    c = compare(base, base, RunInfo(batch_size=32), RunInfo(batch_size=64))
    assert c.differences == ["batch size differs: 32 vs 64"]
    c = compare(base, base, RunInfo(batch_size=32), RunInfo())
    assert c.comparable
    assert c.notes == ["the batch size of the after run is not recorded (gpuidle analyze --batch-size)"]
    # the cost prices the GPUs with work in each run (one traced rank of the job each), as cost --from does
    c = compare(base, bigger, price_per_gpu_hour=3.6)
    assert c.cost is not None
    assert c.cost.steps == 1000
    assert (c.before.gpus, c.after.gpus) == (1, 1)
    assert c.cost.before == pytest.approx(1000 * US * 1000 * 1 * 3.6 / 3600)
    assert c.cost.after == pytest.approx(610 * US * 1000 * 1 * 3.6 / 3600)


def test_job_summary_is_per_step_over_ranks() -> None:
    job = api.analyze([DATA / "trace_filter__sampled_rank-0.json.gz", DATA / "trace_filter__sampled_rank-1.json.gz"])
    s = summarize(job)
    prim = [r.primary() for r in job.ranks]
    steady = [[st for st in r.steps if st.excluded is None] for r in job.ranks]
    assert all(steady)
    assert (s.ranks, s.world_size, s.gpus, s.steps) == (2, 128, 2, sum(map(len, steady)))
    # the run's one utilization, as the fleet table and the cost take it: the mean of the ranks' devices
    assert s.utilization == pytest.approx(sum(d.busy_s / d.window_s for d in prim) / len(prim))
    # the steady step as analyze's fixes start from it: the slowest rank's mean over its steady steps
    means = [sum(st.dur_s for st in own) / len(own) for own in steady]
    assert s.step_s == pytest.approx(max(means))
    assert s.step_s != pytest.approx(sum(d.window_s for d in prim) / sum(map(len, steady)))
    waits = [sum(st.idle_by_cause_s["straggler_wait"] for st in own) / len(own) for own in steady]
    assert s.idle_by_cause_s["straggler_wait"] == pytest.approx(sum(waits) / len(waits))
    assert s.recommendations == [r.id for r in job.recommendations]


# -- through the command line -----------------------------------------------------------


def test_cli_compare_by_label_id_and_report_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 private_ledger: Path) -> None:
    before = loader_trace(400).write(tmp_path / "before.json.gz")
    after = loader_trace(10).write(tmp_path / "after.json.gz")
    assert main(["analyze", str(before), "--label", "baseline", "--batch-size", "64"]) == 0
    assert main(["analyze", str(after), "--label", "num_workers 0->8, pin_memory", "--batch-size", "64",
                 "--json", "--out", str(tmp_path / "after.json")]) == 0
    assert main(["analyze", str(before), "--json", "--out", str(tmp_path / "before.json"), "--no-ledger"]) == 0
    capsys.readouterr()

    assert main(["compare", "baseline", "num_workers 0->8, pin_memory", "--json"]) == 0
    by_label = load_comparison(capsys.readouterr().out)
    assert main(["compare", "1", "2", "--json"]) == 0
    by_id = load_comparison(capsys.readouterr().out)
    assert by_label == by_id
    assert (by_id.before.ref, by_id.after.ref) == ("run 1", "run 2")
    assert (by_id.before.batch_size, by_id.after.label) == (64, "num_workers 0->8, pin_memory")
    assert by_id.step_s_delta == pytest.approx(-390 * US)
    assert main(["compare", str(tmp_path / "before.json"), str(tmp_path / "after.json"), "--json"]) == 0
    by_file = load_comparison(capsys.readouterr().out)
    assert by_file.step_s_delta == by_id.step_s_delta
    assert by_file.before.ref == str(tmp_path / "before.json")
    assert by_file.before.batch_size is None
    # mixed: a report file and a ledger label
    assert main(["compare", str(tmp_path / "before.json"), "num_workers 0->8, pin_memory", "--json"]) == 0
    assert load_comparison(capsys.readouterr().out).after.ref == "run 2"

    assert main(["compare", "baseline", "2", "--format", "md", "--price", "2", "--steps", "5000"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("## gpuidle compare: baseline (run 1) → num_workers 0->8, pin_memory (run 2)\n")
    assert "| steady step | 1.00 ms | 610.0 µs | −390.0 µs (1.64×) |" in md
    assert "| utilization | 50.0 % | 82.0 % | +32.0 pts |" in md
    assert "| &nbsp;&nbsp;data_loading | 400.0 µs | 10.0 µs | −390.0 µs |" in md
    assert "**Recommendations resolved**" in md
    assert "(`dataloader_workers`, data_loading;" in md
    # 1 ms and 0.61 ms per step, 5000 steps, 1 GPU at 2 per GPU-hour
    assert "| cost of 5,000 steps at 2/GPU-h | 0.00278 | 0.00169 | saves 0.00108 |" in md

    assert main(["compare", "baseline", "2"]) == 0
    text = capsys.readouterr().out
    assert "baseline (run 1) → num_workers 0->8, pin_memory (run 2)" in text
    assert "resolved:" in text
    assert "dataloader_workers" in text

    assert main(["compare", "baseline", "2", "--out", str(tmp_path / "c.md")]) == 0
    assert (tmp_path / "c.md").read_text() == CompareMarkdownRenderer().render(by_id)


def test_compare_python_api_matches_cli(tmp_path: Path, private_ledger: Path) -> None:
    a = api.analyze([BASE])
    b = api.analyze([TEST])
    ia = api.record_analysis(a, label="base")
    ib = api.record_analysis(b, label="test")
    c, before, after = api.compare_runs("base", "test")
    assert before == a
    assert after == b
    assert (c.before.ref, c.after.ref) == (f"run {ia}", f"run {ib}")
    assert c == compare(a, b, RunInfo(f"run {ia}", "base"), RunInfo(f"run {ib}", "test"))
    assert msgspec.json.decode(msgspec.json.encode(c), type=Comparison) == c
    with Ledger(private_ledger) as book:
        assert [r.label for r in book.runs()] == ["test", "base"]


@pytest.mark.parametrize(("ref", "needle"), [
    ("nope", "no run 'nope'"),
    ("42", "no run '42'"),
])
def test_compare_unknown_run_is_one_error_line(ref: str, needle: str, tmp_path: Path) -> None:
    assert main(["analyze", str(BASE), "--label", "base", "--out", str(tmp_path / "r.txt")]) == 0
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "compare", "base", ref], capture_output=True, text=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpuidle: error: ")
    assert needle in line
    assert "gpuidle history" in line


def test_compare_without_a_ledger(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "compare", "a", "b", "--ledger",
                           str(tmp_path / "none.sqlite")], capture_output=True, text=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "neither a report file nor a recorded run" in line
    assert not (tmp_path / "none.sqlite").exists()


def test_compare_a_file_that_is_not_a_report(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "compare", str(bad), str(bad)], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "not a gpuidle JSON report" in line


def test_compare_on_a_trace_says_to_analyze_it_first(tmp_path: Path) -> None:
    trace = DATA / "trace_compare__base__base.json.gz"
    before = trace.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "compare", str(trace), str(trace)], capture_output=True,
                          text=True, env={**os.environ, "GPUIDLE_LEDGER": str(tmp_path / "l.sqlite")})
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "is a profiler trace, not an analysis" in line
    assert f"gpuidle analyze {trace}" in line
    assert trace.read_bytes() == before
