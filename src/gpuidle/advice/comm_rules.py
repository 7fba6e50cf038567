"""Communication rules: each fix credited only with the exposed time of the collectives it touches.

A DDP bucket size, ``no_sync`` or a comm hook acts on gradient all-reduces alone, not on the
all-to-all or all-gather of embeddings and sharded parameters beside them; a bf16 hook halves
the bytes of full-precision all-reduces and has nothing to halve in a bf16 one. The exposed
time per collective kind and dtype comes from the analysis (``steps[].exposed_comm_s``).
"""

from __future__ import annotations

import math

from gpuidle.advice.mesh_rules import GPUS_PER_NODE, dimension_idle, model_parallel
from gpuidle.advice.ruleinput import MIB, MIN_SHARE, RuleInput, _ms, removes, removes_between
from gpuidle.advice.whatif import Effect, Proposal
from gpuidle.model import Cause, CollectiveStat

LARGE_MESSAGE = 16 * MIB
COMPRESSIBLE_MESSAGE = 1 * MIB
"""Below this an all-reduce is latency-bound (NCCL's ring: tens of µs of latency against 100+ GB/s, the
crossover near 1-2 MiB): halving its bytes saves little; fewer, larger buckets help instead."""
CALL_LATENCY_S = 10e-6
"""A collective call's latency, at least: NCCL's small-message all-reduce on NVLink or InfiniBand
(nccl-tests, 8 B) takes tens of µs; 10 µs is the low end."""
LOW_BUSBW_GBPS = 10.0
"""Below this, a large all-reduce is not on NVLink or InfiniBand-class bandwidth."""


ALL_REDUCE = ("all_reduce", "unknown")
"""What a DDP bucket, ``no_sync`` or comm hook touches: gradient all-reduces (``unknown``: a report that does not
name its collectives, e.g. step timing, where DDP's all-reduce is what there is)."""
DATA_PARALLEL_GROUPS = ("dp", "world", "unknown")
"""The dimensions whose collectives a DDP fix may touch in a job with model-parallel ones: its gradient
all-reduces are among them (the whole world's or a group the trace does not name), never tensor parallel's."""
FULL_PRECISION = ("float32", "float64")
"""All-reduces a bf16/fp16 compression hook halves; a bf16 or int8 collective has nothing left to compress."""


def data_parallel(x: RuleInput, exposed: float) -> float:
    """``exposed`` as a DDP fix may claim it: in a job with model-parallel dimensions, at most the data-parallel
    groups' idle (tensor-parallel all-reduces are no DDP bucket's and no comm hook's)."""
    return min(exposed, dimension_idle(x, DATA_PARALLEL_GROUPS)) if model_parallel(x) else exposed


def exposed_communication(x: RuleInput) -> list[Proposal]:
    """DDP tuning when collectives run with no compute beside them; each fix is credited only with the exposed
    time of the collectives it touches, from the bytes and dtypes they move. Sharded jobs get their own
    fixes (``advice.sharded``); inference has no gradients (tensor-parallel all-reduces move activations), so
    it gets none of these; the transport check holds for any style."""
    comm = x.report.communication
    if x.share(Cause.COMMUNICATION) < MIN_SHARE:
        return []
    out: list[Proposal] = []
    if comm.parallelism != "ddp" or x.inference:
        return _transport(x, out)
    reduces = [c for c in comm.collectives if c.collective == "all_reduce"]
    count = x.per_window_step(sum(c.count for c in reduces))
    nbytes = x.per_window_step(sum(c.bytes for c in reduces))
    exposed = x.idle(Cause.COMMUNICATION)
    exposed_reduce = data_parallel(x, x.exposed(ALL_REDUCE))
    by_kind = {k: _ms(x.exposed((k,))) for k in sorted({c.collective for c in comm.collectives})}
    if x.accumulation_repeats > 1 and exposed_reduce > 0:
        out.append(x.rec(
            "ddp_no_sync", Cause.COMMUNICATION,
            f"Gradients are all-reduced on each of {x.accumulation_repeats} micro-batches: skip all but the last",
            {"all_reduce_repeats_per_step": x.accumulation_repeats,
             "exposed_all_reduce_ms_per_step": _ms(exposed_reduce), "exposed_comm_ms_per_step": _ms(exposed)},
            "for i, batch in enumerate(micro_batches):\n"
            "    ctx = model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()\n"
            "    with ctx:\n"
            "        model(batch).backward()\n"
            "optimizer.step()",
            removes(Cause.COMMUNICATION, exposed_reduce * (1 - 1 / x.accumulation_repeats)), confidence="medium",
        ))
    if count >= 8 and nbytes > 0 and exposed_reduce > 0:
        cap = max(25, math.ceil(nbytes / 4 / MIB))
        out.append(x.rec(
            "ddp_bucket_cap", Cause.COMMUNICATION,
            f"{count:.0f} all-reduces per step: fewer, larger buckets (bucket_cap_mb={cap})",
            {"all_reduces_per_step": round(count, 1), "all_reduce_mib_per_step": round(nbytes / MIB, 2),
             "exposed_all_reduce_ms_per_step": _ms(exposed_reduce), "exposed_by_collective_ms_per_step": by_kind,
             "assumption": f"about 4 buckets per step: each all-reduce call fewer saves at least "
                           f"{CALL_LATENCY_S * 1e6:.0f} µs of latency, at most the exposed all-reduce time goes"},
            f"model = torch.nn.parallel.DistributedDataParallel(\n"
            f"    model, device_ids=[local_rank],\n"
            f"    bucket_cap_mb={cap},             # default 25\n"
            f"    gradient_as_bucket_view=True,   # no copy between gradients and buckets\n"
            f"    static_graph=True,              # if the used parameters never change between steps\n"
            f")",
            removes_between(min(1.0, (count - 4) * CALL_LATENCY_S / exposed_reduce), 1.0,
                            {Cause.COMMUNICATION: exposed_reduce}), confidence="medium",
        ))
    out += _compression(x, reduces, exposed, by_kind)
    busy = x.device.busy_s
    if x.report.communication.comm_s >= busy > 0:
        out.append(x.rec(
            "comm_bound_batch", Cause.COMMUNICATION,
            "Communication takes as long as compute: more work per all-reduce",
            {"comm_s": round(comm.comm_s, 6), "compute_busy_s": round(busy, 6),
             "exposed_all_reduce_ms_per_step": _ms(exposed_reduce),
             "assumption": "2x the work per step, the same gradients: none to half of the exposed all-reduce "
                           "time per sample goes"},
            "# raise the per-GPU batch (scale lr linearly), or accumulate k micro-batches per optimizer step\n"
            "# under model.no_sync() so gradients are all-reduced once per k",
            removes_between(0.0, 0.5, {Cause.COMMUNICATION: exposed_reduce}), confidence="low",
        ))
    return _transport(x, out)


A2A_OVERLAP = (0.3, 0.8)
"""The share of exposed all-to-all that overlapping dispatch and combine with compute hides: Megatron-Core's
EP overlap and DeepEP hide most of it under another microbatch's or the shared experts' compute; a step with
little compute beside it, or uneven experts (the busiest rank's wait is no transfer), hides less."""


def exposed_all_to_all(x: RuleInput) -> list[Proposal]:
    """Expert parallelism's dispatch and combine (all-to-all) with no compute beside them, any style and phase:
    overlap them with the experts' compute and balance the experts. How much overlap hides depends on the compute
    there is to hide it under: a modelled range (:data:`A2A_OVERLAP`) of the expert-parallel dimension's idle,
    where the mesh has one (its preconditions: a mixture-of-experts model, ``advice.preconditions``)."""
    exposed = x.exposed(("all_to_all",))
    share = exposed / x.state.step_s if x.state.step_s else 0.0
    if share < MIN_SHARE:
        return []
    expert = any(m.dim == "ep" for m in x.report.communication.mesh)
    if expert:  # a context-parallel all-to-all is the cp fix's
        exposed = min(exposed, dimension_idle(x, ("ep",)))
    effect = removes_between(*A2A_OVERLAP, {Cause.COMMUNICATION: exposed}, part="ep") if expert else Effect(
        reason="not estimable from one trace: no expert-parallel dimension in the mesh to size the overlap on")
    calls = x.per_window_step(sum(c.count for c in x.report.communication.collectives
                                  if c.collective == "all_to_all"))
    megatron = x.report.workload is not None and "megatron" in x.report.workload.libraries
    return [x.rec(
        "moe_all_to_all_overlap", Cause.COMMUNICATION,
        "All-to-all (expert dispatch and combine) is exposed: overlap it with the experts' compute",
        {"exposed_all_to_all_ms_per_step": _ms(exposed), "share_of_step": round(share, 3),
         "all_to_alls_per_step": round(calls, 1),
         "assumption": f"overlap hides {A2A_OVERLAP[0]:.0%}–{A2A_OVERLAP[1]:.0%} of the exposed all-to-all"},
        MEGATRON_A2A if megatron else GENERIC_A2A, effect, confidence="medium" if expert else "low",
    )]


MEGATRON_A2A = (
    "# Megatron-Core: overlap dispatch/combine with expert compute (EP > 1, BF16/FP16)\n"
    "config.overlap_moe_expert_parallel_comm = True\n"
    "config.moe_shared_expert_overlap = False     # the two overlaps exclude each other\n"
    "# or the fused dispatcher: config.moe_token_dispatcher_type = \"flex\" with DeepEP\n"
    "# uneven experts make every rank wait for the busiest: check the router's load balancing\n"
    "# (config.moe_router_load_balancing_type, config.moe_aux_loss_coeff); keep EP within one node"
)
GENERIC_A2A = (
    "# dispatch one microbatch's tokens while another's experts compute: issue the all-to-all on its own\n"
    "# stream and wait for it only where its output is used (DeepEP: Buffer.dispatch(..., async_finish=True,\n"
    "# allocate_on_comm_stream=True), then the returned event's current_stream_wait() before the experts)\n"
    "# uneven experts make every rank wait for the busiest: balance the router (an auxiliary load-balancing\n"
    "# loss, a capacity factor); keep the expert-parallel group within one node"
)


def embedding_all_to_all(x: RuleInput) -> list[Proposal]:
    """A recommender's sharded embeddings (TorchRec): the all-to-all of the sparse features and of the pooled
    embeddings exposed. Pipelining the sparse data distribution hides the input all-to-all under the previous
    batch's dense compute; a sharding plan that balances the tables shortens the wait for the busiest rank."""
    exposed = x.exposed(("all_to_all",))
    share = exposed / x.state.step_s if x.state.step_s else 0.0
    if share < MIN_SHARE:
        return []
    return [x.rec(
        "embedding_all_to_all", Cause.COMMUNICATION,
        "The embeddings' all-to-all is exposed: pipeline the sparse data distribution and balance the sharding",
        {"exposed_all_to_all_ms_per_step": _ms(exposed), "share_of_step": round(share, 3)},
        "from torchrec.distributed.train_pipeline import TrainPipelineSparseDist\n"
        "pipeline = TrainPipelineSparseDist(model, optimizer, device)   # next batch's input dist beside this "
        "batch's compute\n"
        "batches = iter(dataloader)\n"
        "while True:\n"
        "    pipeline.progress(batches)     # forward, backward and optimizer step of one batch\n"
        "# balance the tables across ranks: torchrec.distributed.planner.EmbeddingShardingPlanner with the\n"
        "# job's Topology, and its plan passed to DistributedModelParallel(..., plan=plan)",
        Effect(reason="not estimable from one trace: how much of the all-to-all the pipeline hides depends on the "
                      "dense compute of the batch beside it"),
        confidence="medium",
    )]


def _one_node(x: RuleInput) -> bool:
    """The job fits one node: a world of at most :data:`GPUS_PER_NODE` ranks (a larger one spans nodes)."""
    return x.report.world_size is not None and 1 < x.report.world_size <= GPUS_PER_NODE


def _transport(x: RuleInput, out: list[Proposal]) -> list[Proposal]:
    """Any style: large all-reduces far below a fast link's bandwidth point at NCCL's transport."""
    reduces = [c for c in x.report.communication.collectives if c.collective == "all_reduce"]
    sized = [c for c in reduces if c.busbw_gbps is not None]
    large = [c for c in sized if c.count and c.bytes / c.count >= LARGE_MESSAGE
             and (c.busbw_gbps or 0.0) < LOW_BUSBW_GBPS]
    if large and _one_node(x):
        c = large[0]
        out.append(x.rec(
            "nccl_transport", Cause.COMMUNICATION,
            f"Large all-reduces reach only {c.busbw_gbps or 0.0:.1f} GB/s bus bandwidth in a job of "
            f"{x.report.world_size} ranks, one node's worth: check the GPUs' peer links",
            {"all_reduce_busbw_gbps": round(c.busbw_gbps or 0.0, 2),
             "mean_message_mib": round(c.bytes / c.count / MIB, 1), "dtype": c.dtype,
             "world_size": x.report.world_size,
             "caveat": "kernel time includes waiting for other ranks; "
                       "measure the link itself with gpuidle bench allreduce"},
            "# a job this size is usually one node: NCCL goes over NVLink or PCIe peer-to-peer, not the network\n"
            "nvidia-smi topo -m                   # NV#: NVLink; PIX/PXB: one PCIe switch; SYS: across sockets\n"
            "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT torchrun ...   # 'via P2P/IPC' or 'via SHM' (slower)\n"
            "env | grep NCCL_P2P                  # NCCL_P2P_DISABLE=1 or a low NCCL_P2P_LEVEL forbids peer links",
            Effect(reason="not estimable from one trace: the link's attainable bandwidth is not in it "
                          "(gpuidle bench allreduce measures it)"), confidence="low",
        ))
    elif large:
        c = large[0]
        out.append(x.rec(
            "nccl_transport", Cause.COMMUNICATION,
            f"Large all-reduces reach only {c.busbw_gbps or 0.0:.1f} GB/s bus bandwidth: check the NCCL transport",
            {"all_reduce_busbw_gbps": round(c.busbw_gbps or 0.0, 2),
             "mean_message_mib": round(c.bytes / c.count / MIB, 1), "dtype": c.dtype,
             "caveat": "kernel time includes waiting for other ranks; "
                       "measure the link itself with gpuidle bench allreduce"},
            "# which transport does NCCL pick? (debug output: not for production runs)\n"
            "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET torchrun ...   # look for 'via NET/Socket' vs 'NET/IB'\n"
            "# pin NCCL to the fast interface and make sure InfiniBand is not disabled\n"
            "export NCCL_SOCKET_IFNAME=ib0        # or your high-speed Ethernet interface, e.g. ens5\n"
            "export NCCL_IB_DISABLE=0",
            Effect(reason="not estimable from one trace: the link's attainable bandwidth is not in it "
                          "(gpuidle bench allreduce measures it)"), confidence="low",
        ))
    return out


def _compression(x: RuleInput, reduces: list[CollectiveStat], exposed: float,
                 by_kind: dict[str, float]) -> list[Proposal]:
    """A bf16 comm hook halves the bytes of full-precision gradient all-reduces, and touches nothing else."""
    full = [c for c in reduces if c.dtype in FULL_PRECISION]
    unknown = [c for c in reduces if c.dtype == "unknown"]
    target = full or unknown
    exposed_target = data_parallel(x, x.exposed(ALL_REDUCE, FULL_PRECISION) if full
                                   else x.exposed(ALL_REDUCE, ("unknown",)))
    message = sum(c.bytes for c in target) / max(1, sum(c.count for c in target))
    if not target or exposed_target <= 0 or message < COMPRESSIBLE_MESSAGE:
        return []
    sized = [c for c in target if c.busbw_gbps is not None]
    worst = min(sized, key=lambda c: c.busbw_gbps or 0.0) if sized else None
    comm = x.report.communication
    evidence: dict[str, object] = {
        "exposed_comm_ms_per_step": _ms(exposed), "exposed_by_collective_ms_per_step": by_kind,
        "exposed_fp32_all_reduce_ms_per_step": _ms(exposed_target),
        "fp32_all_reduce_mib_per_step": round(x.per_window_step(sum(c.bytes for c in target)) / MIB, 2),
        "mean_message_mib": round(message / MIB, 2),
        "all_reduce_dtypes": sorted({c.dtype for c in reduces}),
        "overlap_ratio": None if comm.overlap_ratio is None else round(comm.overlap_ratio, 3),
        "all_reduce_busbw_gbps": round(worst.busbw_gbps or 0.0, 2) if worst else None,
        "assumption": "bf16 halves the bytes of the fp32 all-reduces on the wire: a quarter (half the time is "
                      "latency) to half of their exposed time",
    }
    if not full:
        evidence["caveat"] = "the trace does not record the all-reduce dtype: fp32 gradients assumed"
    return [x.rec(
        "comm_compression", Cause.COMMUNICATION,
        "fp32 gradient all-reduces are exposed: compress them to bf16 before they go on the wire",
        evidence,
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "model.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)  # or fp16_compress_hook\n"
        "# stronger: from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD\n"
        "#   state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,\n"
        "#                                  start_powerSGD_iter=1_000)\n"
        "#   model.register_comm_hook(state, powerSGD.powerSGD_hook)",
        removes_between(0.25, 0.5, {Cause.COMMUNICATION: exposed_target}), confidence="medium" if full else "low",
    )]
