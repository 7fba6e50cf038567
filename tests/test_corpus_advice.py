"""The audited corpus (``../shared/corpus``, its README gives the expert's truth for each trace): what the report
says on each, checked against that truth. Skipped where the corpus is absent."""

from __future__ import annotations

from functools import cache

import pytest

from gpuidle.api import analyze
from gpuidle.model import AnalysisReport
from shared_traces import corpus


@cache
def report_of(name: str) -> AnalysisReport:
    return analyze([str(corpus(name))])


def test_deepep_under_its_own_namespace_is_the_exposed_all_to_all() -> None:
    """DeepSeek's DeepEP kernels (``dpsk::ep::``): 113 ms of expert all-to-all on their own stream, 4.2 ms of it
    exposed; the GPU's compute is the rest."""
    report = report_of("deepseek_dualpipe_h800_rank0.json.gz")
    (rank,) = report.ranks
    comm = rank.communication
    assert {c.collective for c in comm.collectives} == {"all_to_all"}
    assert sum(c.total_s for c in comm.collectives) == pytest.approx(0.1134, abs=0.001)
    assert comm.exposed_s == pytest.approx(0.0042, abs=0.0002)
    assert rank.primary().idle_by_cause_s["communication"] == pytest.approx(0.0042, abs=0.0002)
    assert [m.dim for m in comm.mesh if m.count] == ["ep"]


def test_one_step_per_rank_names_no_straggler() -> None:
    """DLRM on 8 ranks, one step each, starts skewed by up to 7.5 ms: the waits are arrival skew, no straggler,
    no rank the others wait for in the all-to-all."""
    report = report_of("dlrm_8rank_v100")
    assert report.job is not None
    assert report.job.stragglers == []
    assert all(r.primary().idle_by_cause_s["straggler_wait"] == 0.0 for r in report.ranks)
    assert not any("waits least" in n for n in report.job.notes)
    assert "straggler_wait" not in {r.cause for r in report.recommendations}


def offered(report: AnalysisReport) -> set[str]:
    return {r.id for r in report.recommendations}


def test_a_recommenders_all_to_all_is_tuned_as_torchrecs() -> None:
    """TorchRec's embedding all-to-all is never an MoE router's; 57 ``.item()`` a step and data-dependent
    all-to-all sizes rule out a CUDA-graph capture."""
    report = report_of("dlrm_8rank_v100")
    assert all(r.workload is not None and "torchrec" in r.workload.libraries for r in report.ranks)
    assert "embedding_all_to_all" in offered(report)
    assert not offered(report) & {"moe_all_to_all_overlap", "cuda_graphs"}
    declined = {(d.id, d.check.split(" ")[1]) for d in report.declined}
    assert ("moe_all_to_all_overlap", "mixture-of-experts") in declined
    assert ("cuda_graphs", "step") in declined


def test_an_overlapped_expert_all_to_all_is_not_a_fix() -> None:
    """DualPipe hides 96 % of DeepEP's all-to-all under compute: nothing left for an overlap fix to take."""
    report = report_of("deepseek_dualpipe_h800_rank0.json.gz")
    assert "moe_all_to_all_overlap" not in offered(report)
    assert any(d.id == "moe_all_to_all_overlap" and "already hidden" in d.check for d in report.declined)


def test_pageable_copies_of_microseconds_are_no_fix() -> None:
    """vLLM's 0.003 ms of pageable copies a 76 ms step: declined, under 1 % of the step."""
    report = report_of("vllm_v1_gb10_rank0.pt.trace.json.gz")
    assert "pinned_memory_non_blocking" not in offered(report)
    assert any(d.id == "pinned_memory_non_blocking" and "1% of the step" in d.check for d in report.declined)


def test_tf32_before_autocast_for_fp32_gemms_on_sm80() -> None:
    """Switch Transformer, one forward on an A100, 519 of 563 ms of kernels in fp32 SIMT SGEMM: the gain is the
    GEMMs' own time, estimable from one forward; TF32 first, autocast its alternative."""
    report = report_of("switch_moe_a100_fp32.json.gz")
    fixes = [r for r in report.recommendations if r.id != "record_more_steps"]
    assert [r.id for r in fixes[:2]] == ["tf32", "mixed_precision"]
    assert fixes[1].alternative_to == "tf32"
    assert fixes[0].gain.step_s_saved is not None
    assert fixes[0].gain.step_s_saved > 0.2


def test_pageable_copies_every_step_keep_their_gain() -> None:
    """ResNet on a 2080 Ti: 20 ms a step of pageable host-to-device copies on the device. The host's copy idle is
    no per-step cause, but the copies' own time is in every step: the fix keeps that gain (1.5-2x faster copies)."""
    report = report_of("resnet_2080ti.json.gz")
    assert report.recommendations[0].id == "dataloader_workers"
    (pinned,) = [r for r in report.recommendations if r.id == "pinned_memory_non_blocking"]
    assert pinned.evidence["pageable_copy_ms_per_step"] == pytest.approx(20.2, abs=0.5)
    assert pinned.gain.step_s_saved_low == pytest.approx(0.0202 / 3, rel=0.1)
    assert pinned.gain.step_s_saved_high == pytest.approx(0.0202 / 2, rel=0.1)


def test_a_compute_light_step_gets_a_larger_batch_first() -> None:
    """DLRM computes 6-9 % of its step: a larger per-GPU batch is the first fix (its fixed costs per sample halve),
    before the host-work fixes it overlaps; the measuring advice above it is the trace's, not a fix."""
    report = report_of("dlrm_8rank_v100")
    fixes = [r for r in report.recommendations if r.id != "record_more_steps"]
    assert fixes[0].id == "larger_batch"
    assert fixes[0].confidence == "medium"
    assert fixes[0].title.startswith("The GPU computes ")
    assert fixes[0].evidence["compute_share_of_step"] < 0.1


def test_zero_grad_is_credited_with_all_the_idle_inside_it() -> None:
    """The MLP's zero_grad: 2.28 ms a step, the GPU busy 0.23 ms of it. Its fills' launches (1.25 ms a steady step)
    and the host's loop between them (0.51 ms) are all idle that set_to_none removes, not the launches alone."""
    report = report_of("linear_2080ti.json.gz")
    (fix,) = [r for r in report.recommendations if r.id == "zero_grad_set_to_none"]
    assert fix.evidence["zero_grad_idle_ms_per_step"] == pytest.approx(1.76, abs=0.05)
    assert fix.evidence["zero_grad_idle_by_cause_ms"]["launch_overhead"] == pytest.approx(1.25, abs=0.05)
    assert fix.gain.step_s_saved == pytest.approx(0.00176, abs=0.00005)


@pytest.mark.parametrize("name", ["resnet_2080ti.json.gz", "switch_moe_a100_cold.json.gz"])
def test_the_annotated_timeline_labels_only_the_reports_causes(name: str) -> None:
    """Start-up (ResNet's 1.87 s, the cold forward's 138 ms of context and module loading) is in no cause in the
    report, and the timeline the annotated trace and the HTML draw labels none of it: its idle by cause is the
    report's."""
    from gpuidle.api import timeline_for
    from gpuidle.model import CAUSES

    report = report_of(name)
    (device,) = timeline_for(report).devices
    drawn: dict[str, float] = {}
    for s, e, c in zip(device.seg_start.tolist(), device.seg_end.tolist(), device.seg_cause.tolist(), strict=True):
        drawn[CAUSES[c].value] = drawn.get(CAUSES[c].value, 0.0) + (e - s) / 1e9
    said = {k: v for k, v in report.ranks[0].primary().idle_by_cause_s.items() if v}
    assert drawn == pytest.approx(said, abs=1e-6)
    assert report.ranks[0].primary().startup_s > 0.1
