"""``analyze --scale-to N`` on hand-built jobs with known α and bandwidth: the fit recovers them, the step predicted
at 4 and 8 GPUs from 2 matches the hand-built 4- and 8-GPU jobs, a data-bound job says data loading stops it, a
one-GPU trace names what it lacks, and bad sizes are one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuidle.advice.scaleout import expected_max
from gpuidle.analysis.steps import counted
from gpuidle.api import analyze, with_scale_out
from gpuidle.cli import main
from gpuidle.model import AnalysisReport
from minitrace import Trace

ALPHA_US = 20.0
"""Latency per ring step."""
BUSBW = 10e3
"""Bus bandwidth: 10 GB/s is 10,000 bytes per µs."""
SIZES = (1 << 18, 1 << 22)
"""Two fp32 all-reduces per step: 1 MiB and 16 MiB."""
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
STEP_US = 10_000.0


def allreduce_us(nelems: int, n: int) -> float:
    """nccl-tests' model: 2(N−1) ring steps of α and 2(N−1)/N of the bytes at the bus bandwidth."""
    return ALPHA_US * 2 * (n - 1) + nelems * 4 * 2 * (n - 1) / n / BUSBW


def job(folder: Path, n: int, compute_us: float = 3_000.0, data_us: float = 0.0, steps: int = 6,
        sized: bool = True) -> Path:
    """``n`` identical ranks: data wait, compute, then both all-reduces exposed, back to back (``sized``: with their
    ``record_param_comms`` calls and message sizes)."""
    folder.mkdir(parents=True)
    for rank in range(n):
        t = Trace(rank=rank, world=n)
        for s in range(steps):
            base = s * STEP_US
            t.step(s + 1, base, STEP_US)
            if data_us:
                t.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, data_us)
            at = base + data_us
            t.launch(at=at, call_dur=5, start=at + 10, dur=compute_us)
            start = at + 10 + compute_us
            for i, nelems in enumerate(SIZES):
                if sized:
                    t.op("record_param_comms", at + 20 + 20 * i, 10, **{
                        "Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": nelems,
                        "Out msg nelems": nelems, "dtype": "Float", "Group size": n})
                dur = allreduce_us(nelems, n)
                t.launch(at=at + 25 + 20 * i, call_dur=3, start=start, dur=dur, stream=20, name=ALLREDUCE)
                start += dur
            assert start < base + STEP_US
        t.write(folder / f"rank{rank}.pt.trace.json.gz")
    return folder


def measured(report: AnalysisReport) -> float:
    return max(sum(s.dur_s for s in counted(r.steps)) / len(counted(r.steps)) for r in report.ranks)


def busy_until(report: AnalysisReport) -> float:
    """The slowest rank's step up to the end of its last collective (the step less its trailing idle)."""
    return max(sum(s.busy_s + s.idle_s - s.idle_by_cause_s.get("unattributed", 0.0) for s in counted(r.steps))
               / len(counted(r.steps)) for r in report.ranks)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, AnalysisReport]:
    root = tmp_path_factory.mktemp("scale-out")
    return {n: analyze(job(root / f"n{n}", n)) for n in (2, 4, 8)}


def test_the_fit_recovers_alpha_and_bandwidth(jobs: dict[int, AnalysisReport]) -> None:
    so = with_scale_out(jobs[2], 4).scale_out
    assert so is not None
    assert so.comm is not None
    assert so.comm.source == "trace"
    assert so.comm.sizes == 2
    assert so.comm.alpha_s == pytest.approx(ALPHA_US * 1e-6, rel=0.02)
    assert so.comm.busbw_gbps == pytest.approx(BUSBW / 1e3, rel=0.02)


@pytest.mark.parametrize("n", [4, 8])
def test_predicted_step_matches_the_hand_built_job(jobs: dict[int, AnalysisReport], n: int) -> None:
    """The hand-built steps are fixed at 10 ms, so the figure compared is the work up to the last collective's end:
    compute plus the exposed all-reduces, which the prediction carries to N GPUs."""
    so = with_scale_out(jobs[2], n).scale_out
    assert so is not None
    comm = so.parts_s["communication"]
    expected = sum(allreduce_us(e, n) for e in SIZES) * 1e-6
    assert comm.low == pytest.approx(expected, rel=0.01)
    assert comm.high == pytest.approx(expected, rel=0.01)
    grown = so.step_s.low - so.step_s.now
    assert busy_until(jobs[2]) + grown == pytest.approx(busy_until(jobs[n]), rel=0.10)
    assert so.limit == "communication"
    assert so.answer.startswith("Communication grows with the ring: exposed ")


def test_data_bound_job_will_not_scale(tmp_path: Path) -> None:
    report = analyze(job(tmp_path / "data", 2, compute_us=2_000.0, data_us=6_000.0))
    so = with_scale_out(report, 8).scale_out
    assert so is not None
    assert so.limit == "data_loading"
    assert so.answer.startswith("More GPUs will not raise utilization: data loading takes 6.0")
    assert "8 loaders share a host's cores instead of 2" in so.answer
    data = so.parts_s["data_loading"]
    assert data.low == pytest.approx(data.now)
    assert data.high == pytest.approx(data.now * 4)
    assert so.utilization.high <= so.utilization.now + 1e-9


def one_gpu(folder: Path) -> Path:
    t = Trace(rank=None)
    for s in range(5):
        t.step(s + 1, s * 1000.0, 1000.0)
        t.launch(at=s * 1000.0, call_dur=5, start=s * 1000.0 + 10, dur=900)
    folder.mkdir()
    return t.write(folder / "one.pt.trace.json.gz")


def test_one_gpu_names_what_is_missing(tmp_path: Path) -> None:
    report = analyze(one_gpu(tmp_path / "one"))
    so = with_scale_out(report, 8).scale_out
    assert so is not None
    assert so.comm is None
    assert so.missing[0].startswith("the gradient size: the trace has no collective")
    assert "--params N" in so.missing[0]
    so = with_scale_out(report, 8, params=1_000_000).scale_out
    assert so is not None
    assert so.missing[0].startswith("the link's latency and bandwidth: pass --allreduce-results")


def test_collectives_without_sizes_name_what_is_missing(tmp_path: Path) -> None:
    report = analyze(job(tmp_path / "unsized", 2, sized=False))
    so = with_scale_out(report, 4).scale_out
    assert so is not None
    assert so.comm is None
    assert so.missing == ["the gradient size: its collectives carry no message size (PyTorch records one in "
                          "record_param_comms' In msg nelems); pass --params N (the model's parameter count)"]
    assert so.parts_s["communication"].high == pytest.approx(so.parts_s["communication"].now)


def test_one_gpu_with_params_and_bench_results(tmp_path: Path) -> None:
    bench = {"schema": "gpuidle.bench.allreduce/1", "backend": "nccl", "device": "cuda", "device_name": None,
             "torch_version": "2", "world_size": 2, "nodes": 1, "local_world_size": 2, "dtype": "float32",
             "warmup": 1, "iters": 1, "max_bytes": 1 << 24, "summaries": [], "checks": [],
             "rows": [{"op": "all_reduce", "bytes": b, "count": b // 4, "iters": 1,
                       "time_us": 2 * ALPHA_US + b / BUSBW, "algbw_gbps": None, "busbw_gbps": None}
                      for b in (1 << 16, 1 << 20, 1 << 24)]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    report = analyze(one_gpu(tmp_path / "one"))
    so = with_scale_out(report, 4, params=25 << 18, allreduce_results=path).scale_out  # one 25 MiB fp32 bucket
    assert so is not None
    assert so.comm is not None
    assert not so.missing
    assert so.comm.alpha_s == pytest.approx(ALPHA_US * 1e-6, rel=0.01)
    assert so.comm.busbw_gbps == pytest.approx(BUSBW / 1e3, rel=0.01)
    fp32 = (ALPHA_US * 6 + (25 << 20) * 1.5 / BUSBW) * 1e-6
    assert so.parts_s["communication"].high == pytest.approx(fp32, rel=0.01)


def test_expected_maximum_of_normals() -> None:
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(0.5642, abs=1e-3)
    assert expected_max(4) == pytest.approx(1.0294, abs=1e-3)
    assert expected_max(8) == pytest.approx(1.4236, abs=1e-3)


@pytest.mark.parametrize(("value", "says"), [
    ("1", "--scale-to 1 is smaller than the job's 2 GPUs"),
    ("0", "argument --scale-to: 0 must be at least 1"),
    ("many", "argument --scale-to: 'many' is not an integer"),
])
def test_bad_sizes_are_one_line(jobs: dict[int, AnalysisReport], tmp_path: Path, value: str, says: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    folder = job(tmp_path / "j", 2, steps=4)
    assert main(["analyze", str(folder), "--no-ledger", "--scale-to", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuidle: error: {says}")
    assert err.count("\n") == 1


def test_other_dimensions_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = job(tmp_path / "j", 2, steps=4)
    assert main(["analyze", str(folder), "--no-ledger", "--scale-to", "4", "--scale-dim", "tp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuidle: error: --scale-dim tp: only data-parallel scale-out (dp) is modelled")


def test_the_cli_prints_and_serialises_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = job(tmp_path / "j", 2, steps=4)
    assert main(["analyze", str(folder), "--no-ledger", "--scale-to", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_minor"] >= 11
    assert doc["scale_out"]["gpus"] == 4
    assert doc["scale_out"]["limit"] == "communication"
    assert main(["analyze", str(folder), "--no-ledger", "--scale-to", "4", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "At 4 GPUs" in out
    assert "2 → 4 GPUs (dp, the per-GPU batch kept)" in out


def test_strong_scaling_shrinks_compute_and_keeps_the_global_batch(jobs: dict[int, AnalysisReport]) -> None:
    weak = with_scale_out(jobs[2], 4).scale_out
    strong = with_scale_out(jobs[2], 4, strong=True, batch_size=64).scale_out
    assert weak is not None
    assert strong is not None
    assert strong.scaling == "strong"
    compute = strong.parts_s["compute"]
    assert compute.low == pytest.approx(compute.now / 2)
    assert strong.parts_s["communication"].low == pytest.approx(weak.parts_s["communication"].low)
    # the same samples per step on twice the GPUs: samples/s is the step's speed-up alone
    assert strong.throughput_x.high == pytest.approx(strong.step_s.now / strong.step_s.low)
    assert strong.samples_per_s is not None
    assert strong.samples_per_s.now == pytest.approx(2 * 64 / strong.step_s.now)


def test_a_folder_of_jobs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job(tmp_path / "jobs" / "a", 2, steps=4)
    job(tmp_path / "jobs" / "b", 2, steps=4)
    assert main(["analyze", str(tmp_path / "jobs"), "--no-ledger", "--scale-to", "4"]) == 2
    assert capsys.readouterr().err.startswith("gpuidle: error: --scale-to is for one job")
