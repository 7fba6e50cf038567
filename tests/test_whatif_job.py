"""The job-level what-if: certain savings rank above assumed ones, ranges, and jobs whose ranks cannot be matched."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuidle
from gpuidle.advice.whatif import job_problem
from gpuidle.model import AnalysisReport
from gpuidle.report.common import RenderOptions
from gpuidle.report.terminal import TerminalRenderer
from test_whatif import DeviceTrace, hidden_data_wait

US = 1e-6
NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
DATA = Path(__file__).parent / "data"
V100 = {"id": 0, "name": "Tesla V100-SXM2-16GB", "computeMajor": 7, "computeMinor": 0}


def data_wait_and_fp32_gemms(tmp_path: Path) -> Path:
    """Per step: 355 µs waiting for data, then an 820 µs fp32 GEMM (the ResNet-50 on V100 shape)."""
    t = DeviceTrace(V100)
    for n in range(5):
        base = n * 1200
        t.step(n + 1, base, 1200)
        t.annotation(NEXT, base, 355)
        t.launch(at=base + 355, call_dur=10, start=base + 370, dur=820, name="volta_sgemm_128x64_nn")
    return t.write(tmp_path / "resnet_like.json.gz")


def test_a_measured_saving_ranks_above_a_larger_assumed_one(tmp_path: Path) -> None:
    report = gpuidle.analyze(str(data_wait_and_fp32_gemms(tmp_path)))
    ids = [r.id for r in report.recommendations if r.alternative_to is None]
    assert ids.index("dataloader_workers") < ids.index("mixed_precision")
    data = next(r for r in report.recommendations if r.id == "dataloader_workers")
    amp = next(r for r in report.recommendations if r.id == "mixed_precision")
    assert data.gain.basis == "measured"
    assert data.gain.step_s_saved_low == data.gain.step_s_saved == data.gain.step_s_saved_high == pytest.approx(
        355 * US)
    # the assumed saving's high end (820 µs halved: 410 µs) is above the measured 355 µs; its low end
    # (a third: 273 µs) is below it, so the certain fix comes first
    assert amp.gain.basis == "modelled"
    assert (amp.gain.step_s_saved_low, amp.gain.step_s_saved_high) == pytest.approx((820 / 3 * US, 410 * US))
    text = TerminalRenderer().render(report)
    assert "saves 355.0 µs/step, measured" in text
    assert "saves 273.3–410.0 µs/step, modelled" in text
    assert "assumes fp32 GEMM/conv time shrinks 1.5–2× on the tensor cores" in text  # a V100


def test_one_path_is_one_input(tmp_path: Path) -> None:
    path = data_wait_and_fp32_gemms(tmp_path)
    as_str, as_path, as_list = gpuidle.analyze(str(path)), gpuidle.analyze(path), gpuidle.analyze([path])
    assert as_str.to_json() == as_path.to_json() == as_list.to_json()


def _job_notes(report: AnalysisReport) -> list[str]:
    assert report.job is not None
    return [n for n in report.job.notes if n.startswith("what-if:")]


def test_ranks_with_different_steps_get_per_rank_figures(tmp_path: Path) -> None:
    for name in ("six", "five"):
        (tmp_path / name).mkdir()
    hidden_data_wait(tmp_path / "six", steps=6)
    hidden_data_wait(tmp_path / "five", steps=5)
    (tmp_path / "five" / "rank0.json.gz").unlink()
    (tmp_path / "six" / "rank0.json.gz").rename(tmp_path / "five" / "rank0.json.gz")
    report = gpuidle.analyze(tmp_path / "five", workers=1)
    (note,) = _job_notes(report)
    assert "the ranks cover different steps (rank 1: 5 steps, others 6)" in note
    assert report.combined is None
    loader = next(r for r in report.recommendations if r.id == "dataloader_workers")
    # rank 1's own step loses its 500 µs data wait; no job figure hides it behind rank 0
    assert loader.gain.scope == "rank"
    assert loader.gain.step_s_saved == pytest.approx(500 * US)
    assert loader.gain.reason is not None
    assert "rank 1's own step" in loader.gain.reason
    assert "rank 1's own step" in TerminalRenderer().render(report, RenderOptions(width=400))


def test_missing_ranks_give_no_job_figure() -> None:
    report = gpuidle.analyze([DATA / "trace_filter__sampled_rank-0.json.gz",
                              DATA / "trace_filter__sampled_rank-1.json.gz"], workers=1)
    assert report.job is not None
    assert len(report.job.missing_ranks) == 126
    (note,) = _job_notes(report)
    assert "126 rank(s) missing from the input (2, 3, 4, 5, 6, 7, 8, 9 …): any of them may set the pace" in note
    assert report.combined is None
    assert all(r.gain.scope == "rank" for r in report.recommendations)


def test_a_rank_without_steps_is_named() -> None:
    report = gpuidle.analyze(DATA / "nccl_parser_config__nccl_data.json.gz")
    rank = report.ranks[0]
    empty = type(rank)(**{f: getattr(rank, f) for f in rank.__struct_fields__ if f not in ("rank", "steps")},
                       rank=1, steps=[])
    assert report.job is None
    job = gpuidle.analyze([DATA / "trace_filter__sampled_rank-0.json.gz",
                           DATA / "trace_filter__sampled_rank-1.json.gz"], workers=1).job
    assert job is not None
    assert job_problem([rank, empty], job) == "rank 1 has no steps"
    assert job_problem([rank], job) is None  # one rank is its own job


def test_hand_built_two_rank_job_chain(tmp_path: Path) -> None:
    # rank 0's 1000 µs host op sets the pace; rank 1's 500 µs data wait shows only after it is fixed
    report = gpuidle.analyze(hidden_data_wait(tmp_path), workers=1)
    c = report.combined
    assert c is not None
    first, second = [r for r in report.recommendations if r.alternative_to is None and not r.gain.minor][:2]
    assert (first.rank, second.id, second.rank) == (0, "dataloader_workers", 1)
    assert second.gain.step_s_saved_after == pytest.approx(500 * US)
    assert c.fixes[:2] == [first.id, second.id]
    # every "after" figure comes from the same model: the chain's savings add up to the combined one
    chain = [r.gain.step_s_saved_after for r in report.recommendations
             if r.alternative_to is None and r.gain.step_s_saved_after is not None]
    assert sum(chain) == pytest.approx(c.step_s_saved)
