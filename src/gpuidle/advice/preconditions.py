"""Each fix's preconditions as checks on the trace: the library or framework it acts on present, the dimension it
acts on in the mesh, its cause large enough a share of the step. A fix is offered only where every check holds;
where one fails, the fix is declined with the check that failed (``gpuidle analyze --explain`` lists them).

The checks are records beside the rules (:data:`REQUIRES`, by rule id), read once by :func:`offered`; a rule
function measures, these say where it fits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gpuidle.advice.mesh_rules import model_parallel
from gpuidle.advice.ruleinput import RuleInput
from gpuidle.advice.whatif import Proposal
from gpuidle.model import Declined


class Check(NamedTuple):
    """A precondition on the trace's facts."""

    says: str
    """What must hold, in words (``--explain`` prints it for a fix not offered)."""
    holds: Callable[[RuleInput], bool]


def _libraries(x: RuleInput) -> list[str]:
    return x.report.workload.libraries if x.report.workload is not None else []


def _all_to_all_hidden(x: RuleInput) -> float:
    """The share of the all-to-all's device time per step that runs beside compute."""
    total = x.per_window_step(sum(c.total_s for c in x.report.communication.collectives
                                  if c.collective == "all_to_all"))
    return 1.0 - x.exposed(("all_to_all",)) / total if total > 0 else 0.0


HIDDEN_ENOUGH = 0.9
"""An all-to-all already this much overlapped with compute (DualPipe, DeepEP's overlapped dispatch) has nothing
left for an overlap fix to hide."""
MAX_READBACKS = 2
"""Host reads of device values (``.item()``, ``if tensor:``) a step may hold and still be captured whole as a CUDA
graph: the loss read once at its end. A bare synchronize (a timing call, the profiler's) is removable and does not
count."""

MOE = Check("a mixture-of-experts model in the trace (a router, experts, DeepEP, grouped GEMMs, an expert group)",
            lambda x: "moe" in _libraries(x) or any(m.dim == "ep" for m in x.report.communication.mesh))
NOT_RECOMMENDER = Check("no recommender's sharded embeddings (TorchRec): their all-to-all moves embeddings, not tokens",
                        lambda x: "torchrec" not in _libraries(x))
RECOMMENDER = Check("TorchRec's sharded embeddings in the trace", lambda x: "torchrec" in _libraries(x))
NOT_HIDDEN = Check(f"the all-to-all is not already hidden: under {HIDDEN_ENOUGH:.0%} of it beside compute",
                   lambda x: _all_to_all_hidden(x) < HIDDEN_ENOUGH)
NO_READBACK = Check(
    f"the step reads no device value on the host (at most {MAX_READBACKS} .item() calls a step): a CUDA graph "
    "cannot hold one, nor the host control flow that depends on it",
    lambda x: x.report.kernels.item_calls_per_step <= MAX_READBACKS)
STATIC_SIZES = Check(
    "no all-to-all whose sizes are exchanged at run time (TorchRec's KJT splits, an MoE's token counts): a CUDA "
    "graph replays fixed sizes",
    lambda x: not ({"torchrec", "moe"} & set(_libraries(x))
                   and any(c.collective == "all_to_all" for c in x.report.communication.collectives)))
DATA_PARALLEL = Check(
    "DDP's gradient all-reduce on a data-parallel dimension (not a tensor-parallel job's all-reduces)",
    lambda x: x.report.communication.parallelism == "ddp"
    and (not model_parallel(x) or any(m.dim == "dp" and (m.size or 2) > 1 for m in x.report.communication.mesh)))

REQUIRES: dict[str, tuple[Check, ...]] = {
    "moe_all_to_all_overlap": (MOE, NOT_RECOMMENDER, NOT_HIDDEN),
    "embedding_all_to_all": (RECOMMENDER, NOT_HIDDEN),
    "cuda_graphs": (NO_READBACK, STATIC_SIZES),
    "ddp_bucket_cap": (DATA_PARALLEL,),
    "ddp_no_sync": (DATA_PARALLEL,),
    "comm_bound_batch": (DATA_PARALLEL,),
    "comm_compression": (DATA_PARALLEL,),
}
"""Per rule id, the checks beyond its own threshold; a rule absent here needs only :data:`MIN_STEP_SHARE`."""

MIN_STEP_SHARE = 0.01
"""A fix whose measured effect is under this share of the step is not offered: a cause of 0.003 ms in a 76 ms
step is no fix, however certain."""


def _share(x: RuleInput, p: Proposal) -> float | None:
    """The share of the step the fix's effect claims on this rank; None where it has none to tell (its gain not
    estimable, or a fix of the recording)."""
    effect = p.effects.get(x.report.rank)
    if effect is None or effect.reason is not None or not x.state.step_s:
        return None
    return (sum(effect.idle.values()) + effect.busy) / x.state.step_s


def offered(x: RuleInput, proposals: list[Proposal]) -> tuple[list[Proposal], list[Declined]]:
    """The proposals whose preconditions hold on this rank (each saying them in its evidence), and the rest with
    the check that failed."""
    kept: list[Proposal] = []
    declined: list[Declined] = []
    for p in proposals:
        failed = next((c.says for c in REQUIRES.get(p.rec.id, ()) if not c.holds(x)), None)
        share = _share(x, p)
        if failed is None and share is not None and 0 < share < MIN_STEP_SHARE:
            failed = f"its effect at least {MIN_STEP_SHARE:.0%} of the step (here {share:.2%})"
        if failed is None:
            if REQUIRES.get(p.rec.id):  # what held, in the evidence beside the numbers
                p.rec.evidence["preconditions"] = [c.says for c in REQUIRES[p.rec.id]]
            kept.append(p)
        else:
            declined.append(Declined(id=p.rec.id, rank=x.report.rank, check=failed))
    return kept, declined
