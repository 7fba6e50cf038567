"""Fixes for the model-parallel dimensions: tensor-parallel communication with no compute beside it, and a
pipeline's bubble against what its schedule must leave.

Each is credited with its own dimension's share of the ``communication`` idle (``steps[].comm_by_dim_s``), a
part of that cause no data-parallel fix claims."""

from __future__ import annotations

from typing import NamedTuple

from gpuidle.advice.ruleinput import MIN_SHARE, RuleInput, _ms, removes_between
from gpuidle.advice.whatif import Effect, Proposal
from gpuidle.model import Cause, MeshDim

GPUS_PER_NODE = 8
"""The most GPUs one node holds in the common systems (DGX/HGX 8-GPU boards, MI300X platforms)."""
TP_OVERLAP = (0.3, 0.9)
"""The share of exposed tensor-parallel communication that overlapping hides: Megatron-Core's userbuffers
overlap and PyTorch's async TP hide most of it where the GEMMs beside it are large; decode-sized ones hide
less."""


def dimension(x: RuleInput, dim: str) -> MeshDim | None:
    return next((m for m in x.report.communication.mesh if m.dim == dim), None)


def dimension_idle(x: RuleInput, dims: tuple[str, ...]) -> float:
    """Communication idle per steady step of the collectives in ``dims``."""
    return x.mean_step(lambda s: sum(s.comm_by_dim_s.get(d, 0.0) for d in dims))


def model_parallel(x: RuleInput) -> bool:
    """The rank's mesh has a dimension beside data parallelism (tensor, pipeline, expert or context)."""
    return any(m.dim in ("tp", "pp", "ep", "cp") for m in x.report.communication.mesh)


def _spans_nodes(ranks: list[int]) -> bool:
    """The group's ranks fall on more than one node of :data:`GPUS_PER_NODE` consecutive ranks."""
    return len({r // GPUS_PER_NODE for r in ranks}) > 1


class Overlap(NamedTuple):
    """A dimension whose exposed communication overlapping hides: its fix in the trace's terms."""

    dim: str
    rec_id: str
    title: str
    across: str
    """Added to the title where the group spans nodes."""
    fix: str
    node_note: str
    """The fix's last line where the group spans nodes."""
    words: str
    overlap: tuple[float, float]


def _overlap_fix(x: RuleInput, o: Overlap) -> list[Proposal]:
    """``o``'s fix where its dimension's idle is :data:`MIN_SHARE` of the step or more: a modelled range of that
    idle, its own part of the communication pool."""
    m = dimension(x, o.dim)
    idle = dimension_idle(x, (o.dim,))
    if m is None or x.state.step_s <= 0 or idle / x.state.step_s < MIN_SHARE:
        return []
    across = _spans_nodes(m.ranks)
    fix = o.fix + (f"\n# this group's ranks ({m.ranks[0]}..{m.ranks[-1]}) span more than one {GPUS_PER_NODE}-GPU "
                   f"node: {o.node_note}" if across else "")
    low, high = o.overlap
    return [x.rec(
        o.rec_id, Cause.COMMUNICATION, o.title + (o.across if across else ""),
        {f"exposed_{o.dim}_ms_per_step": _ms(idle), "share_of_step": round(idle / x.state.step_s, 3),
         f"{o.dim}_size": m.size, f"{o.dim}_group_ranks": m.ranks, "dimension_source": m.source,
         "assumption": f"overlap hides {low:.0%}–{high:.0%} of the exposed {o.words} communication"},
        fix, removes_between(low, high, {Cause.COMMUNICATION: idle}, part=o.dim),
        confidence="low" if m.inferred else "medium",
    )]


TENSOR_PARALLEL = Overlap(
    "tp", "tp_comm_overlap", "Tensor-parallel communication is exposed: overlap it with the layers' GEMMs",
    " and keep it inside one node",
    "# Megatron-Core: overlap TP communication with the GEMMs (Transformer Engine userbuffers)\n"
    "--sequence-parallel --tp-comm-overlap\n"
    "# PyTorch (torchtitan): async tensor parallel, the collectives split into the matmuls under compile\n"
    "from torch.distributed._symmetric_memory import enable_symm_mem_for_group\n"
    "torch._inductor.config._micro_pipeline_tp = True\n"
    "enable_symm_mem_for_group(tp_mesh.get_group().group_name)\n"
    "model = torch.compile(model)\n"
    "# and SequenceParallel() for the norms in the parallelize_module plan: reduce-scatter/all-gather\n"
    "# in place of the all-reduce",
    "put tp innermost in the mesh so it stays on NVLink", "tensor-parallel", TP_OVERLAP)


def exposed_tensor_parallel(x: RuleInput) -> list[Proposal]:
    """Tensor-parallel all-reduces and all-gathers inside every layer, with no compute beside them: overlap them
    with the layer's GEMMs, and keep the group inside one node's NVLink domain."""
    return _overlap_fix(x, TENSOR_PARALLEL)


def schedule_bubble(stages: int, microbatches: float) -> float:
    """The share of a GPipe/1F1B step its schedule leaves idle: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1) if stages > 1 and microbatches > 0 else 0.0


def microbatches(x: RuleInput, pp: MeshDim) -> float | None:
    """Microbatches per step from the stage's send/recv: each microbatch passes activations forward and
    gradients back, one send or receive per neighbour each way; None where the stage's place is unknown."""
    if pp.size is None or pp.coordinate is None or pp.size < 2:
        return None
    neighbours = 1 if pp.coordinate in (0, pp.size - 1) else 2
    m = pp.p2p / max(len(x.report.steps), 1) / (2 * neighbours)
    return m if m >= 1 else None  # fewer than one: batched send/recv pairs, or a window that cuts the schedule


def pipeline_bubble(x: RuleInput) -> list[Proposal]:
    """The stage's pipeline idle (its waits on send/recv) against its schedule's bubble: more microbatches or
    an interleaved or zero-bubble schedule shrink the schedule's part; what is beyond it is a slower stage."""
    pp = dimension(x, "pp")
    idle = dimension_idle(x, ("pp",))
    if pp is None or x.state.step_s <= 0 or idle / x.state.step_s < MIN_SHARE:
        return []
    share = idle / x.state.step_s
    m = microbatches(x, pp)
    p = pp.size
    evidence: dict[str, object] = {
        "pipeline_idle_ms_per_step": _ms(idle), "share_of_step": round(share, 3), "stages": p,
        "stage": pp.coordinate, "dimension_source": pp.source}
    fix = ("# torch.distributed.pipelining: more microbatches, or interleaved/zero-bubble schedules\n"
           "from torch.distributed.pipelining import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble\n"
           "schedule = ScheduleInterleaved1F1B(stages, n_microbatches=2 * n_microbatches, loss_fn=loss_fn)\n"
           "# (stages: two or more virtual stages per rank)\n"
           "# Megatron-Core: --num-layers-per-virtual-pipeline-stage N, more microbatches per global batch\n"
           "# (global batch / (micro batch × dp)), or a smaller --micro-batch-size")
    if m is None or p is None:
        return [x.rec("pipeline_bubble", Cause.COMMUNICATION,
                      f"The pipeline waits {share:.1%} of the step on its neighbouring stages", evidence, fix,
                      Effect(reason="not estimable from one trace: the stage's place or its microbatches are not "
                                    f"told by it ({pp.p2p} send/recv in the window), so the schedule's bubble "
                                    "cannot be told from a slower stage's"),
                      confidence="low")]
    bound = schedule_bubble(p, m)
    doubled = schedule_bubble(p, 2 * m)
    scheduled = min(idle, bound * x.state.step_s)
    beyond = idle - scheduled
    evidence |= {"microbatches": round(m, 1), "microbatches_from": f"{pp.p2p} send/recv in the window",
                 "schedule_bubble_share": round(bound, 3), "beyond_schedule_ms_per_step": _ms(beyond),
                 "assumption": "twice the microbatches (or two virtual stages) brings the schedule's bubble from "
                               f"(p-1)/(m+p-1) = {bound:.1%} to {doubled:.1%}; smaller microbatches run less "
                               "efficiently: half to all of that"}
    if beyond > scheduled:
        fix += ("\n# most of the wait is beyond what the schedule leaves: a slower stage sets the pace;\n"
                "# move layers off it (Megatron: --decoder-first-pipeline-num-layers / "
                "--decoder-last-pipeline-num-layers)")
    saved = scheduled * (1 - doubled / bound) if bound > 0 else 0.0
    return [x.rec(
        "pipeline_bubble", Cause.COMMUNICATION,
        f"The pipeline bubble is {share:.1%} of the step (its schedule leaves {bound:.1%}): more microbatches or "
        "an interleaved schedule",
        evidence, fix,
        removes_between(0.5, 1.0, {Cause.COMMUNICATION: saved}, part="pp") if saved > 0 else
        Effect(reason="the schedule's bubble is already small: the wait is a slower stage's"),
        confidence="low" if pp.inferred else "medium",
    )]


CP_OVERLAP = TP_OVERLAP
"""As for tensor parallel: the ring's key/value exchange hides under each block's attention where the blocks are
long; short sequences per rank hide less."""


CONTEXT_PARALLEL = Overlap(
    "cp", "cp_comm_overlap", "Context-parallel key/value exchange is exposed: overlap it with attention",
    " and keep the ring inside one node",
    "# PyTorch: context-parallel SDPA; an all-to-all rotation of the KV shards overlaps with attention\n"
    "from torch.distributed.tensor.experimental import context_parallel\n"
    "from torch.distributed.tensor.experimental._attention import set_rotate_method\n"
    "set_rotate_method(\"alltoall\")\n"
    "with context_parallel(cp_mesh, buffers=[inputs, labels], buffer_seq_dims=[1, 1]):\n"
    "    loss = model(inputs, labels)\n"
    "# Megatron-Core: --cp-comm-type p2p overlaps the ring with attention (Transformer Engine);\n"
    "# a2a or a2a+p2p (--hierarchical-context-parallel-sizes) across nodes",
    "a ring across nodes waits on the network at every hop", "context-parallel", CP_OVERLAP)


def exposed_context_parallel(x: RuleInput) -> list[Proposal]:
    """Context parallel's key/value exchange (a ring of send/recv, or all-gather/all-to-all rotations) with no
    attention compute beside it: rotate with all-to-all and overlap, and keep the ring inside a node."""
    return _overlap_fix(x, CONTEXT_PARALLEL)


MESH_RULES = [exposed_tensor_parallel, exposed_context_parallel, pipeline_bubble]
