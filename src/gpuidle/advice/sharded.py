"""Rules for sharded data parallel: FSDP2 (``fully_shard``) and DeepSpeed ZeRO.

They fire on the job's style (``communication.parallelism``) and on exposed communication split by
role (``communication.roles``, :mod:`gpuidle.analysis.sharded`): a fix removes the exposed time of
the roles it acts on, per steady step, and the gain comes from the what-if model
(:mod:`gpuidle.advice.whatif`). Fixes acting on the same role are alternatives; fixes on different
roles add up, never beyond the communication idle they share. The step tracker does not split
communication by role: there a rule claims the exposed communication as a whole, at low confidence.
DDP's own fixes stay in :func:`gpuidle.advice.rules.exposed_communication`, for DDP only.
"""

from __future__ import annotations

from gpuidle.advice.comm_rules import COMPRESSIBLE_MESSAGE, LOW_BUSBW_GBPS
from gpuidle.advice.ruleinput import MIB, MIN_SHARE, Rule, RuleInput, _ms, removes_between
from gpuidle.advice.whatif import Effect, Proposal
from gpuidle.model import Cause, CommRole

FWD, BWD, OPT = "param_all_gather_forward", "param_all_gather_backward", "param_all_gather_optimizer"
RS, REPLICATE, GRAD_AR = "grad_reduce_scatter", "replicate_all_reduce", "grad_all_reduce"
NODE_GPUS = 8
"""A group larger than this spans nodes (8 GPUs per node is the common large-node size)."""
MANY_GATHERS = 32
"""All-gathers per step above which, when small, their launches and latency dominate."""
COMM = Cause.COMMUNICATION.value


class Roles:
    """One rank's communication roles, per steady step."""

    def __init__(self, x: RuleInput) -> None:
        self.x = x
        self.by_role: dict[str, CommRole] = {r.role: r for r in x.report.communication.roles}
        self.exposed = x.idle(Cause.COMMUNICATION)

    def exposed_of(self, *roles: str) -> float:
        """Exposed seconds per steady step of these roles, at most the rank's communication idle."""
        return min(self.exposed, sum(self.x.per_window_step(self.by_role[r].exposed_s)
                                     for r in roles if r in self.by_role))

    def count(self, *roles: str) -> float:
        return self.x.per_window_step(sum(self.by_role[r].count for r in roles if r in self.by_role))

    def mean_mib(self, *roles: str) -> float | None:
        rs = [self.by_role[r] for r in roles if r in self.by_role and self.by_role[r].bytes > 0]
        n = sum(r.count for r in rs)
        return sum(r.bytes for r in rs) / n / MIB if n else None

    def worth(self, seconds: float) -> bool:
        return seconds > 0 and seconds >= MIN_SHARE * self.x.state.step_s

    def evidence(self, *roles: str) -> dict[str, object]:
        mib = self.mean_mib(*roles)
        return {"roles": list(roles), "exposed_ms_per_step": _ms(self.exposed_of(*roles)),
                "collectives_per_step": round(self.count(*roles), 1),
                "mean_message_mib": None if mib is None else round(mib, 3)}


def _effect(seconds: float, low: float, high: float, part: str | None, *more: str) -> Effect:
    """``low``..``high`` of ``seconds`` of exposed communication in ``part`` go; ``more``: further roles it draws on."""
    return removes_between(low, high, {Cause.COMMUNICATION: seconds}, part=part,
                           pools=tuple(f"{COMM}:{p}" for p in more))


FORWARD_PREFETCH = (
    "from torch.distributed.fsdp import fully_shard\n"
    "blocks = list(model.layers)                 # the modules you called fully_shard on, in forward order\n"
    "for i, block in enumerate(blocks[:-1]):\n"
    "    block.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])   # all-gather the next two early\n"
)
BACKWARD_PREFETCH = (
    "blocks = list(model.layers)\n"
    "for i in range(len(blocks) - 1, 0, -1):\n"
    "    blocks[i].set_modules_to_backward_prefetch(blocks[max(0, i - 2):i][::-1])   # backward order\n"
)
RESHARD = (
    "from torch.distributed.fsdp import fully_shard\n"
    "for block in model.layers:\n"
    "    fully_shard(block, reshard_after_forward=False)   # keep the gathered parameters until backward: more memory\n"
    "# or reshard to a node-sized group, gathered again inside the node only (an int dividing the mesh size):\n"
    "#   fully_shard(block, mesh=mesh, reshard_after_forward=8)\n"
    "fully_shard(model)   # the root keeps its parameters by default (reshard_after_forward=None: False for the root)"
)
MIXED = (
    "import torch\n"
    "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n"
    "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,    # all-gather bf16 parameters: half the bytes\n"
    "                          reduce_dtype=torch.bfloat16)   # reduce-scatter bf16 gradients: half the bytes\n"
    "for block in model.layers:\n"
    "    fully_shard(block, mp_policy=mp)\n"
    "fully_shard(model, mp_policy=mp)\n"
    "# reduce_dtype=torch.float32 keeps the gradient sum exact, at full bytes"
)
HSDP = (
    "from torch.distributed.device_mesh import init_device_mesh\n"
    "from torch.distributed.fsdp import fully_shard\n"
    "nodes, gpus = world_size // 8, 8\n"
    "mesh = init_device_mesh(\"cuda\", (nodes, gpus), mesh_dim_names=(\"replicate\", \"shard\"))\n"
    "for block in model.layers:\n"
    "    fully_shard(block, mesh=mesh)   # 2-D mesh: shard inside the node, replicate across nodes (HSDP)\n"
    "fully_shard(model, mesh=mesh)"
)
UNITS = (
    "from torch.distributed.fsdp import fully_shard\n"
    "# one fully_shard unit per transformer block (or per two), not per Linear: fewer, larger all-gathers\n"
    "for block in model.layers:\n"
    "    fully_shard(block)\n"
    "fully_shard(model)"
)


def fsdp2(x: RuleInput) -> list[Proposal]:
    """FSDP2: prefetch, resharding, bf16 collectives, HSDP, larger units, by the role that is exposed."""
    if x.report.communication.parallelism != "fsdp2" or x.share(Cause.COMMUNICATION) < MIN_SHARE:
        return []
    r = Roles(x)
    if not r.by_role:
        return [x.rec(
            "fsdp_prefetch", Cause.COMMUNICATION,
            "FSDP communication is exposed: prefetch the all-gathers of the next modules",
            {"exposed_comm_ms_per_step": _ms(r.exposed),
             "assumption": "prefetching overlaps the all-gathers with compute: half to all of the exposed "
                           "communication goes; step timing does not split it by role (tracker.profile(steps=...) "
                           "does)"},
            FORWARD_PREFETCH + BACKWARD_PREFETCH, _effect(r.exposed, 0.5, 1.0, FWD, BWD), confidence="low")]
    out: list[Proposal] = []
    fwd, bwd = r.exposed_of(FWD), r.exposed_of(BWD)
    if r.worth(fwd):
        out.append(x.rec(
            "fsdp_forward_prefetch", Cause.COMMUNICATION,
            "Parameter all-gathers are exposed before modules' forward: prefetch them earlier",
            {**r.evidence(FWD), "assumption": "issued one or two modules ahead, the all-gather runs beside the "
                                              "previous module's compute: half to all of its exposed time goes"},
            FORWARD_PREFETCH, _effect(fwd, 0.5, 1.0, FWD), confidence="medium"))
    if r.worth(bwd):
        out.append(x.rec(
            "fsdp_backward_prefetch", Cause.COMMUNICATION,
            "Parameter all-gathers are exposed in backward: prefetch more modules ahead",
            {**r.evidence(BWD), "assumption": "prefetched further ahead, the all-gather runs beside the next "
                                              "module's gradient compute: half to all of its exposed time goes"},
            BACKWARD_PREFETCH, _effect(bwd, 0.5, 1.0, BWD), confidence="medium"))
        out.append(x.rec(
            "fsdp_reshard_after_forward", Cause.COMMUNICATION,
            "Keep parameters gathered from forward to backward (reshard_after_forward=False or an int)",
            {**r.evidence(BWD), "assumption": "the backward all-gathers are not issued at all; "
                                              "the unsharded parameters stay in memory from forward to backward"},
            RESHARD, _effect(bwd, 1.0, 1.0, BWD), confidence="medium"))
    tail = r.exposed_of(RS, REPLICATE)
    mib = r.mean_mib(RS, REPLICATE)
    if r.worth(tail) and (mib is None or mib * MIB >= COMPRESSIBLE_MESSAGE):
        out.append(x.rec(
            "fsdp_reduce_dtype", Cause.COMMUNICATION,
            "Gradient reduce-scatter is exposed at the end of backward: reduce in bf16 (MixedPrecisionPolicy)",
            {**r.evidence(RS, REPLICATE), "assumption": "gradients reduced in fp32 now; bf16 halves the bytes "
                                                        "on the wire: a quarter (half the time is latency) to half "
                                                        "of the exposed time"},
            MIXED, _effect(tail, 0.25, 0.5, RS), confidence="medium" if mib is not None else "low"))
    gathers = [c for c in x.report.communication.collectives if c.collective in ("all_gather", "reduce_scatter")
               and c.busbw_gbps is not None]
    cross = [c for c in gathers if (c.busbw_gbps or 0.0) < LOW_BUSBW_GBPS]
    size = x.report.world_size or 0
    if r.worth(fwd + bwd) and cross and size > NODE_GPUS:
        slow = min(cross, key=lambda c: c.busbw_gbps or 0.0)
        out.append(x.rec(
            "fsdp_hsdp", Cause.COMMUNICATION,
            f"All-gathers across {size} ranks reach only {slow.busbw_gbps or 0.0:.1f} GB/s: shard inside the node "
            "(HSDP)",
            {**r.evidence(FWD, BWD), "busbw_gbps": round(slow.busbw_gbps or 0.0, 2), "group_size": size,
             "assumption": "parameter all-gathers stay on the node's links (NVLink): half to all of their exposed "
                           "time goes; the gradient all-reduce across nodes remains"},
            HSDP, _effect(fwd + bwd, 0.5, 1.0, FWD, BWD), confidence="low"))
    count, small = r.count(FWD, BWD), r.mean_mib(FWD, BWD)
    if r.worth(fwd + bwd) and count >= MANY_GATHERS and small is not None and small * MIB < COMPRESSIBLE_MESSAGE:
        out.append(x.rec(
            "fsdp_larger_units", Cause.COMMUNICATION,
            f"{count:.0f} small all-gathers per step: shard larger units (one fully_shard per block)",
            {**r.evidence(FWD, BWD), "assumption": "half as many all-gathers of twice the size: small messages "
                                                   "cost their latency, so a quarter to half the exposed time goes"},
            UNITS, _effect(fwd + bwd, 0.25, 0.5, FWD, BWD), confidence="low"))
    return out


OVERLAP = (
    "# ds_config.json, \"zero_optimization\":\n"
    "{\n"
    "  \"overlap_comm\": true,            # reduce gradients while backward still computes\n"
    "  \"contiguous_gradients\": true,    # copy gradients into one buffer as they are made\n"
    "  \"reduce_bucket_size\": 5e8,       # elements per gradient reduction: fewer, larger collectives\n"
    "  \"allgather_bucket_size\": 5e8     # ZeRO-1/2: elements per parameter all-gather after the step\n"
    "}"
)
PREFETCH = (
    "# ds_config.json, \"zero_optimization\" (stage 3):\n"
    "{\n"
    "  \"stage3_prefetch_bucket_size\": 5e8,           # parameters all-gathered ahead of the module that needs them\n"
    "  \"stage3_max_live_parameters\": 1e9,\n"
    "  \"stage3_param_persistence_threshold\": 1e6,    # small parameters stay gathered: fewer tiny all-gathers\n"
    "  \"overlap_comm\": true\n"
    "}"
)
STAGE2 = (
    "# ds_config.json: ZeRO-2 keeps parameters whole on every rank (no all-gather in forward or backward),\n"
    "# sharding only gradients and optimizer states; it needs memory for one full copy of the parameters\n"
    "{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": true, \"contiguous_gradients\": true}}"
)


def deepspeed(x: RuleInput) -> list[Proposal]:
    """DeepSpeed ZeRO: overlap and buckets of the gradient reduction, stage-3 prefetch, the stage trade-off."""
    style = x.report.communication.parallelism
    if not style.startswith("deepspeed") or x.share(Cause.COMMUNICATION) < MIN_SHARE:
        return []
    r = Roles(x)
    out: list[Proposal] = []
    grads = r.exposed_of(RS, GRAD_AR) if r.by_role else r.exposed
    overlapped = x.report.communication.settings.get("overlap_comm") == "true"
    if r.worth(grads) and overlapped:  # the tracker read the engine's settings: the overlap is on already
        out.append(x.rec(
            "deepspeed_reduce_bucket", Cause.COMMUNICATION,
            "Gradient reduction is exposed although overlap_comm is on: larger reduce buckets",
            {**r.evidence(RS, GRAD_AR), "exposed_ms_per_step": _ms(grads), **_settings(x),
             "assumption": "half as many gradient reductions of twice the size: a quarter to half of their exposed "
                           "time" + ("" if r.by_role else "; step timing does not split by role")},
            reduce_buckets(x.report.communication.settings),
            _effect(grads, 0.25, 0.5, RS, GRAD_AR), confidence="low"))
    elif r.worth(grads):
        out.append(x.rec(
            "deepspeed_overlap_comm", Cause.COMMUNICATION,
            "Gradient reduction is exposed: overlap it with backward (overlap_comm, buckets)",
            {**r.evidence(RS, GRAD_AR), "exposed_ms_per_step": _ms(grads),
             "assumption": "reduced in buckets while backward computes, the reduction hides behind it: half to all "
                           "of its exposed time goes" + ("" if r.by_role else "; step timing does not split by role")},
            OVERLAP, _effect(grads, 0.5, 1.0, RS, GRAD_AR), confidence="medium" if r.by_role else "low"))
    params = r.exposed_of(FWD, BWD)
    if style == "deepspeed_zero3" and r.worth(params):
        out.append(x.rec(
            "deepspeed_stage3_prefetch", Cause.COMMUNICATION,
            "ZeRO-3 parameter all-gathers are exposed: prefetch more ahead",
            {**r.evidence(FWD, BWD), "assumption": "gathered ahead of the module that needs them, the all-gathers "
                                                   "run beside compute: half to all of their exposed time goes"},
            PREFETCH, _effect(params, 0.5, 1.0, FWD, BWD), confidence="medium"))
        out.append(x.rec(
            "deepspeed_zero_stage", Cause.COMMUNICATION,
            "ZeRO-3 gathers parameters every forward and backward: ZeRO-2 if one copy fits in memory",
            {**r.evidence(FWD, BWD), "assumption": "ZeRO-2 issues no parameter all-gather in forward or backward, "
                                                   "one after the optimizer step instead: half to all of their "
                                                   "exposed time goes; it costs the memory of one full copy of "
                                                   "the parameters"},
            STAGE2, _effect(params, 0.5, 1.0, FWD, BWD), confidence="medium"))
    after = r.exposed_of(OPT)
    if r.worth(after):
        out.append(x.rec(
            "deepspeed_allgather_bucket", Cause.COMMUNICATION,
            "The parameter all-gather after the optimizer step is exposed: larger allgather_bucket_size",
            {**r.evidence(OPT), "assumption": "half as many all-gathers of twice the size: a quarter to half "
                                              "the exposed time"},
            OVERLAP, _effect(after, 0.25, 0.5, OPT), confidence="low"))
    return out


def _settings(x: RuleInput) -> dict[str, str]:
    return {f"deepspeed_{k}": v for k, v in x.report.communication.settings.items()}


def reduce_buckets(settings: dict[str, str]) -> str:
    """The config that doubles the engine's ``reduce_bucket_size`` (DeepSpeed's default 5e8 where it was not read),
    with ``contiguous_gradients`` unless the engine has it on."""
    try:
        size = int(float(settings.get("reduce_bucket_size", DEFAULT_REDUCE_BUCKET)))
    except ValueError:
        size = DEFAULT_REDUCE_BUCKET
    contiguous = settings.get("contiguous_gradients") == "true"
    lines = [f"  \"reduce_bucket_size\": {_sci(2 * size)}{'' if contiguous else ','}   # elements per gradient "
             f"reduction: twice the {_sci(size)} in use, half as many collectives"]
    if not contiguous:
        lines.append("  \"contiguous_gradients\": true   # copy gradients into one buffer as they are made")
    return "# ds_config.json, \"zero_optimization\" (overlap_comm is on already):\n{\n" + "\n".join(lines) + "\n}"


DEFAULT_REDUCE_BUCKET = 500_000_000
"""DeepSpeed's ``reduce_bucket_size`` default (elements)."""


def _sci(n: int) -> str:
    """``500000000`` as ``5e8``, as DeepSpeed's configs write sizes."""
    mantissa, exponent = f"{n:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}" if float(f"{n:.0e}") == n else str(n)


SHARDED_RULES: list[Rule] = [fsdp2, deepspeed]
