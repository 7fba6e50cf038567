"""Each fix only where the trace shows its preconditions: walked over every trace the project holds
(``../shared/corpus``, ``../shared/traces``), no offered fix fits a stack or dimension the trace does not have, and
the precondition registry names only rules that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuidle.advice.preconditions import MIN_STEP_SHARE, REQUIRES
from gpuidle.api import analyze
from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport, RankReport
from shared_traces import every_input
from test_frameworks import _rule_ids


def test_the_registry_names_only_real_rules() -> None:
    assert set(REQUIRES) <= _rule_ids()


def _libraries(r: RankReport) -> set[str]:
    return set(r.workload.libraries) if r.workload is not None else set()


def _check(report: AnalysisReport) -> list[str]:
    """What does not fit: each offered fix against the ranks' stack, mesh and step."""
    by_rank = {r.rank: r for r in report.ranks}
    wrong = []
    for rec in report.recommendations:
        if rec.id in REQUIRES and rec.evidence.get("preconditions") != [c.says for c in REQUIRES[rec.id]]:
            wrong.append(f"{rec.id}: its preconditions not in its evidence")
        ranks = [by_rank[rec.rank]] if rec.rank in by_rank else report.ranks
        libs = set().union(*(_libraries(r) for r in ranks))
        dims = {m.dim for r in ranks for m in r.communication.mesh}
        if rec.id == "moe_all_to_all_overlap" and ("torchrec" in libs or not ("moe" in libs or "ep" in dims)):
            wrong.append(f"{rec.id} without a mixture of experts (libraries {sorted(libs)}, mesh {sorted(dims)})")
        if rec.id == "embedding_all_to_all" and "torchrec" not in libs:
            wrong.append(f"{rec.id} without TorchRec")
        ddp_fix = rec.id.startswith("ddp_") or rec.id == "comm_compression"
        if ddp_fix and any(r.communication.parallelism != "ddp" for r in ranks):
            wrong.append(f"{rec.id} without DDP's gradient all-reduce")
        if rec.id == "cuda_graphs" and any(r.kernels.item_calls_per_step > 2 for r in ranks):
            wrong.append(f"{rec.id} with .item() reads in the step")
        framework = report.source.framework or ""
        if framework in ("tensorflow", "jax", "keras") and "torch." in rec.fix:
            wrong.append(f"{rec.id}: PyTorch's API for a {framework} program")
        if any(r.workload is not None and r.workload.engine for r in ranks) and "train_step(" in rec.fix:
            wrong.append(f"{rec.id}: a training loop for a serving engine")
        gain = rec.gain
        if gain.step_s_saved is not None and gain.step_s_before and rec.alternative_to is None \
                and not rec.id.startswith("straggler_") and gain.step_s_saved < MIN_STEP_SHARE * gain.step_s_before \
                and gain.reason is None and rec.confidence == "high":
            wrong.append(f"{rec.id}: high confidence for {gain.step_s_saved / gain.step_s_before:.2%} of the step")
    return wrong


@pytest.mark.parametrize("path", every_input(), ids=lambda p: p.name[:40])
def test_no_fix_is_offered_where_it_does_not_fit(path: Path) -> None:
    try:
        report = analyze([str(path)])
    except GpuidleError:
        pytest.skip("not a GPU trace gpuidle reads")
    assert _check(report) == []


def test_explain_lists_each_fix_not_offered_with_its_failed_check(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An exposed all-to-all in a trace that names no mixture of experts: ``--explain`` says the MoE fix was not
    offered, and why; without ``--explain`` nothing is said."""
    from gpuidle.cli import main
    from test_mesh import ALLTOALL, mesh_trace

    trace = mesh_trace(tmp_path, None, names=False, comms=[("all_to_all", "", ALLTOALL, 3_000, 3_800, 800)])
    assert main(["analyze", str(trace), "--no-ledger", "--explain"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("not offered: moe_all_to_all_overlap (rank 1): needs a mixture-of-experts model in the trace") in out
    assert main(["analyze", str(trace), "--no-ledger"]) == 0
    assert "not offered" not in capsys.readouterr().out
