"""The shared corpus of real traces from other projects (``../shared/corpus``): each trace's figures as its README
gives them, what the report says first, and ``docs/accuracy.md`` as the analysis writes it today."""

from __future__ import annotations

import statistics
from functools import cache
from pathlib import Path

import pytest

from corpus import CORPUS, ROOT, needs_corpus
from corpus_accuracy import EXPERT, page
from gpuidle.api import analyze
from gpuidle.model import AnalysisReport

pytestmark = needs_corpus
RECORDING = {"record_more_steps", "record_cpu_activity"}


@cache
def report(name: str) -> AnalysisReport:
    return analyze([CORPUS / name])


def first(r: AnalysisReport) -> str | None:
    recs = [x for x in r.recommendations if x.alternative_to is None]
    return recs[0].id if recs else None


@pytest.mark.parametrize("name", sorted(EXPERT))
def test_no_report_leads_with_a_recording_advice(name: str) -> None:
    """The first item is a change to the program or nothing to fix: what the trace lacks is said above the fixes."""
    r = report(name)
    assert not RECORDING & {x.id for x in r.recommendations}
    assert all(x.cause != "trace_quality" for x in r.recommendations)


def test_vllm_steps_are_the_engine_s_iterations() -> None:
    """10 iterations annotated by the engine, ~76 ms each, 94.5-98.9 % busy, taken from the GPU annotation track
    (the device's clock; the CPU track's copies run 74 ms ahead); a GPU-bound decode: nothing to fix."""
    r = report("vllm_v1_gb10_rank0.pt.trace.json.gz")
    (rank,) = r.ranks
    assert (len(rank.steps), rank.step_source) == (10, "repeating_device_ranges")
    assert rank.primary().utilization == pytest.approx(0.984, abs=0.001)
    assert 70e-3 <= statistics.median(s.dur_s for s in rank.steps) <= 80e-3
    busy = [s.busy_s / s.dur_s for s in rank.steps]
    assert 0.94 <= min(busy) <= 0.95
    assert 0.985 <= max(busy) <= 0.995
    assert any("execute_context_0(0)_generation_4(4)" in n for n in rank.notes)
    assert first(r) is None
    assert "one_step" not in {q.kind for q in r.quality}


def test_tf_bert_steps_are_each_gpu_s_own() -> None:
    """Each GPU's Steps line apart (GPU 4: 19.9 ms, GPU 6: 21.3 ms, 70-75 % busy inside), never one window across
    bursts 647 ms apart; a fragment (no GEMM, no collective, 6 of 8 GPUs without kernels), its idle no per-step
    gain."""
    r = report("tf_bert_multigpu_v100")
    (rank,) = r.ranks
    devices = {d.device: d for d in rank.devices}
    assert devices[4].window_s == pytest.approx(19.9e-3, abs=0.1e-3)
    assert devices[6].window_s == pytest.approx(21.3e-3, abs=0.1e-3)
    for d in (4, 6):
        assert 0.69 <= devices[d].utilization <= 0.76
    quality = {q.kind: q.says for q in r.quality}
    assert {"fragment", "gpus_without_kernels"} <= set(quality)
    assert "6 of 8 GPUs" in quality["gpus_without_kernels"]
    assert all(x.gain.step_s_saved is None for x in r.recommendations)
    assert {x.confidence for x in r.recommendations} == {"low"}  # idle of a fragment: thin evidence


def test_deepseek_one_step_nothing_to_fix() -> None:
    r = report("deepseek_dualpipe_h800_rank0.json.gz")
    (rank,) = r.ranks
    assert (len(rank.steps), rank.step_source) == (1, "profiler_step")
    # busy is compute (the README's compute union, 96.4 % of the device's span); DeepEP's all-to-all is
    # communication, 4.2 ms of it exposed
    assert rank.primary().utilization == pytest.approx(0.964, abs=0.006)
    assert rank.primary().idle_by_cause_s["communication"] == pytest.approx(4.2e-3, abs=0.1e-3)
    assert first(r) is None
    kinds = {q.kind for q in r.quality}
    assert "one_step" in kinds
    assert "gpus_without_kernels" not in kinds  # a rank's process lists every GPU it sees and drives one


@pytest.mark.parametrize("name", ["switch_moe_a100_cold.json.gz", "switch_moe_a100_fp32.json.gz"])
def test_fp32_gemm_time_is_a_gain_from_one_forward(name: str) -> None:
    """TF32 first: fp32 SGEMM time is a property of the kernels, estimable from one forward."""
    r = report(name)
    assert first(r) == "tf32"
    assert r.recommendations[0].gain.step_s_saved is not None
    assert "one_step" in {q.kind for q in r.quality}


def test_the_cold_forward_s_frees_are_start_up() -> None:
    (rank,) = report("switch_moe_a100_cold.json.gz").ranks
    frees = sorted((c.kind, round(c.dur_s * 1e3, 1)) for c in rank.startup if c.name == "cudaFree")
    assert frees == [("allocation", 10.9), ("context", 1.9)]


def test_the_forward_s_syncs_are_a_measured_gain() -> None:
    """20 syncs at model.py(143) in one forward recur within it: their fix has a measured gain."""
    r = report("switch_moe_a100_syncs.json.gz")
    (sync,) = [x for x in r.recommendations if x.id == "remove_host_sync"]
    assert sync.gain.step_s_saved is not None
    assert sync.gain.basis == "measured"
    assert "model.py(143)" in sync.fix
    # first, as the expert's: the host work beside it is the model's own forward, whose compiling is modelled
    # (50-100 % of its idle), a lower certain saving than the syncs' measured one
    assert first(r) == "remove_host_sync"
    (host,) = [x for x in r.recommendations if x.id == "move_cpu_work"]
    assert host.gain.basis == "modelled"
    assert host.gain.step_s_saved_low == pytest.approx(host.gain.step_s_saved_high / 2)


def test_resnet_and_linear_keep_their_fixes() -> None:
    assert first(report("resnet_2080ti.json.gz")) == "dataloader_workers"
    linear = report("linear_2080ti.json.gz")
    assert first(linear) == "cuda_graphs"
    assert 38 <= len(linear.ranks[0].steps) <= 40


def test_dlrm_one_step_per_rank() -> None:
    r = report("dlrm_8rank_v100")
    assert len(r.ranks) == 8
    assert all(len(x.steps) == 1 for x in r.ranks)
    assert "one_step" in {q.kind for q in r.quality}


def test_the_accuracy_page_is_what_the_analysis_says() -> None:
    assert page() == (Path(ROOT) / "docs" / "accuracy.md").read_text()


def test_a_one_step_runs_idle_prints_as_its_device_line_does() -> None:
    """fp32's one step idles 26.605 ms: its causes' float sum reads 26.604999… ms, which printed 26.60 on the run
    line beside 26.61 on the device line; the run line's idle is the steps' own, so both print the same."""
    from gpuidle.analysis import figures
    from gpuidle.report.common import ms

    r = report("switch_moe_a100_fp32.json.gz")
    (rank,) = r.ranks
    steady = [s for s in rank.steps if s.excluded is None]
    assert len(steady) == 1
    device = rank.primary()
    assert ms(figures.idle_s(r)) == ms(device.idle_s) == ms(steady[0].idle_s)


@pytest.mark.parametrize("name", sorted(EXPERT))
def test_a_high_confidence_fix_saves_a_measured_point(name: str) -> None:
    """High confidence is a measured saving (``docs/numbers.md``); a modelled range is medium at most. Pinned
    memory over resnet's pageable copies read high beside its 6.7-10.1 ms range."""
    for rec in report(name).recommendations:
        if rec.confidence == "high":
            assert rec.gain.basis == "measured", (rec.id, rec.gain)
            assert rec.gain.step_s_saved_low == rec.gain.step_s_saved_high, (rec.id, rec.gain)


def test_the_launch_overhead_evidence_means_one_thing_in_every_fix() -> None:
    """linear's launch idle, 9.64 ms a step, holds 1.25 ms of zero_grad fills: both fixes show the cause's whole
    idle under one name, and the graph fix what it acts on, the rest, under its own."""
    recs = {x.id: x for x in report("linear_2080ti.json.gz").recommendations}
    graphs, zero_grad = recs["cuda_graphs"].evidence, recs["zero_grad_set_to_none"].evidence
    assert graphs["launch_overhead_ms_per_step"] == zero_grad["launch_overhead_ms_per_step"]
    total, fills = graphs["launch_overhead_ms_per_step"], graphs["zero_grad_launch_ms_per_step"]
    assert isinstance(total, float)
    assert isinstance(fills, float)
    assert fills > 0
    assert graphs["graph_replayable_ms_per_step"] == pytest.approx(total - fills, abs=2e-3)
