"""Sharded data parallel in traces: the style, exposed communication by role, and the fixes that fit.

The hand-built traces use the names the frameworks record:

- FSDP2: ``record_function`` labels of torch 2.13 (``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``:
  ``FSDP::root_pre_forward``; ``_fsdp_param_group.py``: ``FSDP::pre_forward (<fqn>)``, ``FSDP::all_gather
  (<fqn>)``, ``FSDP::pre_backward (<fqn>)``, ``FSDP::post_backward_reduce (<fqn>)``, ``FSDP::forward_prefetch
  for <fqn>``), seen as such in the real CPU profile ``data/fsdp2_cpu_gloo__rank0.pt.trace.json.gz``;
  the collectives as NCCL records them (``record_param_comms`` with ``_allgather_base``,
  ``_reduce_scatter_base``, ``allreduce``; kernels ``ncclDevKernel_AllGather_RING_LL``,
  ``ncclDevKernel_ReduceScatter_Sum_f32_RING_LL``, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``).
- DeepSpeed: the NVTX ranges of ``instrument_w_nvtx`` (``deepspeed/utils/nvtx.py``, the function's
  ``__qualname__``): ``DeepSpeedEngine.forward``/``.backward``, ``PartitionedParameterCoordinator.fetch_sub_module``
  (``deepspeed/runtime/zero/partitioned_param_coordinator.py``), ``DeepSpeedZeroOptimizer_Stage3.
  __reduce_and_partition_ipg_grads`` (``deepspeed/runtime/zero/stage3.py``). Nsight Systems records them;
  here they stand in a Kineto trace as ``user_annotation`` ranges, which the analysis reads the same way.

Every step has the same known layout (µs), so each role's exposed time is known by hand.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuidle.analysis.sharded import BACKWARD_MARKS, FORWARD_MARKS, parallelism_of
from gpuidle.api import analyze
from gpuidle.model import AnalysisReport, RankReport
from gpuidle.report.markdown import MarkdownRenderer
from minitrace import BWD, MAIN, Trace

DATA = Path(__file__).parent / "data"
US = 1e-6
STEPS = 4
STEP_US = 2000
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
RS = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
MIB_FLOATS = 262144
DDP_ONLY = ("ddp_no_sync", "ddp_bucket_cap", "comm_compression", "comm_bound_batch")
DDP_WORDS = ("bucket_cap_mb", "register_comm_hook", "ddp_comm_hooks", "no_sync")

# exposed per step, by role, from the layout in _step
EXPOSED_US = {"param_all_gather_forward": 200, "param_all_gather_backward": 70, "grad_reduce_scatter": 150,
              "replicate_all_reduce": 60}


def _collective(t: Trace, at: float, name: str, kernel: str, start: float, dur: float, tid: int,
                stream: int = 20, mib: int = 4) -> None:
    t.op("record_param_comms", at, 8, tid=tid, **{
        "Collective name": name, "Process Group Name": "0", "In msg nelems": mib * MIB_FLOATS // 2,
        "Out msg nelems": mib * MIB_FLOATS, "dtype": "Float", "Group size": 2})
    t.launch(at=at + 2, call_dur=4, start=start, dur=dur, stream=stream, name=kernel, tid=tid)


def _step(t: Trace, base: float, labels: dict[str, str]) -> None:
    """One step: forward all-gather 200 µs exposed, a prefetched one hidden, a backward all-gather 100 µs
    of which 70 exposed, a reduce-scatter 150 µs and an all-reduce 60 µs exposed at the end of backward."""
    t.annotation(labels["root"], base, 5)
    t.annotation(labels["pre_forward"], base + 10, 30)
    t.annotation(labels["gather"], base + 12, 18)
    _collective(t, base + 14, "_allgather_base", AG, base + 20, 200, MAIN)
    t.launch(at=base + 45, call_dur=5, start=base + 220, dur=400)
    t.annotation(labels["prefetch"], base + 50, 20)
    _collective(t, base + 52, "_allgather_base", AG, base + 300, 100, MAIN)
    # backward on autograd's thread
    t.annotation(labels["backward"], base + 650, 350, tid=BWD)
    t.annotation(labels["pre_backward"], base + 655, 25, tid=BWD)
    _collective(t, base + 658, "_allgather_base", AG, base + 670, 100, BWD)
    t.launch(at=base + 690, call_dur=5, start=base + 740, dur=180, tid=BWD)
    t.annotation(labels["reduce"], base + 930, 30, tid=BWD)
    _collective(t, base + 932, "_reduce_scatter_base", RS, base + 950, 150, BWD)
    _collective(t, base + 945, labels["replicate"], AR, base + 1100, 60, BWD, stream=21)
    t.annotation(labels["optimizer"], base + 1200, 50)
    t.launch(at=base + 1205, call_dur=5, start=base + 1200 + 10, dur=90)


FSDP2 = {"root": "FSDP::root_pre_forward", "pre_forward": "FSDP::pre_forward (layers.0)",
         "gather": "FSDP::all_gather (layers.0)", "prefetch": "FSDP::forward_prefetch for layers.1",
         "backward": "autograd::engine::evaluate_function: AddmmBackward0",
         "pre_backward": "FSDP::pre_backward (layers.0)", "reduce": "FSDP::post_backward_reduce (layers.0)",
         "replicate": "allreduce", "optimizer": "Optimizer.step#AdamW.step"}
ZERO3 = {"root": "DeepSpeedEngine.forward", "pre_forward": "PartitionedParameterCoordinator.fetch_sub_module",
         "gather": "PartitionedParameterCoordinator.__all_gather_params",
         "prefetch": "PartitionedParameterCoordinator.__all_gather_params",
         "backward": "DeepSpeedEngine.backward",
         "pre_backward": "PartitionedParameterCoordinator.fetch_sub_module",
         "reduce": "DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads",
         "replicate": "allreduce", "optimizer": "DeepSpeedZeroOptimizer_Stage3.step"}


def _trace(tmp_path: Path, labels: dict[str, str]) -> AnalysisReport:
    t = Trace(rank=0, world=2)
    for s in range(STEPS):
        base = s * STEP_US
        t.step(s + 1, base, STEP_US - 10)
        _step(t, base, labels)
    return analyze([t.write(tmp_path / "rank0.json.gz")])


def _rank(report: AnalysisReport) -> RankReport:
    (r,) = report.ranks
    return r


def _per_step(r: RankReport, role: str) -> float:
    (c,) = [c for c in r.communication.roles if c.role == role]
    return c.exposed_s / len(r.steps)


def _no_ddp_advice(report: AnalysisReport) -> None:
    for rec in report.recommendations:
        assert rec.id not in DDP_ONLY
        assert not any(w in rec.fix for w in DDP_WORDS), rec.id


def test_fsdp2_roles_split_exposed_communication(tmp_path: Path) -> None:
    report = _trace(tmp_path, FSDP2)
    r = _rank(report)
    c = r.communication
    assert c.parallelism == "fsdp2"
    for role, us in EXPOSED_US.items():
        assert _per_step(r, role) == pytest.approx(us * US, rel=1e-9), role
    # the roles split the exposed communication exactly, and it is the idle charged to communication
    assert sum(x.exposed_s for x in c.roles) == pytest.approx(c.exposed_s, rel=1e-9)
    assert c.exposed_s / STEPS == pytest.approx(sum(EXPOSED_US.values()) * US, rel=1e-9)
    counts = {x.role: x.count for x in c.roles}
    assert counts["param_all_gather_forward"] == 2 * STEPS  # one exposed, one prefetched and hidden
    text = MarkdownRenderer().render(report)
    assert "data parallel: FSDP2 (fully_shard)" in text
    assert "parameter all-gather before a module's forward (prefetch too late): 800.0 µs exposed" in text


def test_fsdp2_advice_fits_and_gains_come_from_the_roles(tmp_path: Path) -> None:
    report = _trace(tmp_path, FSDP2)
    recs = {r.id: r for r in report.recommendations}
    _no_ddp_advice(report)
    # one rank, no straggler: prefetching hides half to all of the exposed time of its role per step
    def span(rec_id: str) -> tuple[float | None, float | None, float | None]:
        g = recs[rec_id].gain
        return g.step_s_saved_low, g.step_s_saved, g.step_s_saved_high

    assert span("fsdp_forward_prefetch") == pytest.approx((100 * US, 150 * US, 200 * US), rel=1e-6)
    assert "set_modules_to_forward_prefetch" in recs["fsdp_forward_prefetch"].fix
    # keeping parameters from forward to backward removes the backward all-gathers for certain (a point);
    # prefetching them is an alternative on the same role, half to all of it
    assert span("fsdp_reshard_after_forward") == pytest.approx((70 * US, 70 * US, 70 * US), rel=1e-6)
    assert "reshard_after_forward" in recs["fsdp_reshard_after_forward"].fix
    assert recs["fsdp_backward_prefetch"].alternative_to == "fsdp_reshard_after_forward"
    assert span("fsdp_backward_prefetch") == pytest.approx((35 * US, 52.5 * US, 70 * US), rel=1e-6)
    assert "set_modules_to_backward_prefetch" in recs["fsdp_backward_prefetch"].fix
    # bf16 reduction halves the bytes of the 4 MiB reduce-scatter and all-reduce at the end of backward:
    # a quarter to half of their 150 + 60 µs
    mp = recs["fsdp_reduce_dtype"]
    assert span("fsdp_reduce_dtype") == pytest.approx((52.5 * US, 78.75 * US, 105 * US), rel=1e-6)
    assert "MixedPrecisionPolicy(param_dtype=torch.bfloat16" in mp.fix
    assert mp.alternative_to is None
    # together: the three parts (within the communication idle) and the fp32 GEMMs' own fix (sgemm kernels)
    assert report.combined is not None
    amp = recs["mixed_precision"].gain.step_s_saved
    assert amp is not None
    assert report.combined.step_s_saved == pytest.approx((150 + 70 + 78.75) * US + amp, rel=1e-6)


def test_deepspeed_zero3_roles_and_advice(tmp_path: Path) -> None:
    report = _trace(tmp_path, ZERO3)
    r = _rank(report)
    assert r.communication.parallelism == "deepspeed_zero3"
    # the backward fetch runs on autograd's thread with no backward label of its own: the thread tells
    assert _per_step(r, "param_all_gather_backward") == pytest.approx(70 * US, rel=1e-9)
    assert _per_step(r, "grad_all_reduce") == pytest.approx(60 * US, rel=1e-9)
    recs = {x.id: x for x in report.recommendations}
    _no_ddp_advice(report)
    g = recs["deepspeed_stage3_prefetch"].gain
    assert (g.step_s_saved_low, g.step_s_saved_high) == pytest.approx((135 * US, 270 * US), rel=1e-6)
    assert "stage3_prefetch_bucket_size" in recs["deepspeed_stage3_prefetch"].fix
    assert recs["deepspeed_zero_stage"].alternative_to == "deepspeed_stage3_prefetch"
    overlap = recs["deepspeed_overlap_comm"]
    assert overlap.gain.step_s_saved_high == pytest.approx((150 + 60) * US, rel=1e-6)
    assert overlap.gain.step_s_saved_low == pytest.approx((150 + 60) / 2 * US, rel=1e-6)
    assert all(k in overlap.fix for k in ("overlap_comm", "reduce_bucket_size", "allgather_bucket_size",
                                          "contiguous_gradients"))
    assert not [x for x in report.recommendations if x.id.startswith("fsdp_")]


def test_ddp_keeps_its_own_advice(tmp_path: Path) -> None:
    t = Trace(rank=0, world=2)
    for s in range(STEPS):
        base = s * STEP_US
        t.step(s + 1, base, STEP_US - 10)
        t.annotation("DistributedDataParallel.forward", base, 100)
        t.launch(at=base + 5, call_dur=5, start=base + 20, dur=600)
        t.annotation("autograd::engine::evaluate_function: AddmmBackward0", base + 650, 300, tid=BWD)
        _collective(t, base + 660, "allreduce", AR, base + 700, 500, BWD)
    report = analyze([t.write(tmp_path / "rank0.json.gz")])
    r = _rank(report)
    assert r.communication.parallelism == "ddp"
    assert [x.role for x in r.communication.roles] == ["grad_all_reduce"]
    assert _per_step(r, "grad_all_reduce") == pytest.approx(500 * US, rel=1e-9)
    ids = [x.id for x in report.recommendations]
    assert "comm_compression" in ids
    assert not [i for i in ids if i.startswith(("fsdp_", "deepspeed_"))]


def test_the_real_fsdp2_profile_has_the_names_recognised() -> None:
    """The CPU profile of a real FSDP2 job: its labels name the style and mark the phases."""
    doc = json.loads(gzip.decompress((DATA / "fsdp2_cpu_gloo__rank0.pt.trace.json.gz").read_bytes()))
    names = {e.get("name", "") for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert parallelism_of(names) == "fsdp2"
    fsdp = {n.split(" (")[0].split(" for ")[0] for n in names if n.startswith("FSDP::")}
    assert {"FSDP::root_pre_forward", "FSDP::pre_forward", "FSDP::all_gather", "FSDP::pre_backward",
            "FSDP::backward_prefetch", "FSDP::post_backward_reduce"} <= fsdp
    assert all(any(n.startswith(m) for n in names) for m in ("FSDP::pre_backward", "FSDP::post_backward"))
    assert {m for m in BACKWARD_MARKS if m.startswith("FSDP::")} <= {m for m in BACKWARD_MARKS
                                                                       if any(n.startswith(m) for n in names)}
    assert any(n.startswith(FORWARD_MARKS) for n in names)
    assert {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "gloo:all_gather"} <= names


def test_the_fixes_name_the_installed_fsdp2_api() -> None:
    """Every FSDP2 call the fixes write exists in the installed torch, with those parameters."""
    import inspect

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    from gpuidle.advice import sharded

    assert {"set_modules_to_forward_prefetch", "set_modules_to_backward_prefetch"} <= set(dir(FSDPModule))
    assert {"mesh", "reshard_after_forward", "mp_policy"} <= set(inspect.signature(fully_shard).parameters)
    assert {"param_dtype", "reduce_dtype"} <= set(inspect.signature(MixedPrecisionPolicy).parameters)
    assert "mesh_dim_names" in inspect.signature(init_device_mesh).parameters
    for text in (sharded.FORWARD_PREFETCH, sharded.BACKWARD_PREFETCH, sharded.RESHARD, sharded.MIXED, sharded.HSDP,
                 sharded.UNITS):
        compile(text, "fix", "exec")


def test_the_reduce_bucket_config_doubles_the_engines_own() -> None:
    """Where the tracker read a DeepSpeed engine with ``overlap_comm`` on, its fix is twice the buckets in use."""
    from gpuidle.advice.sharded import reduce_buckets

    read = reduce_buckets({"reduce_bucket_size": "200000000", "contiguous_gradients": "true"})
    assert '"reduce_bucket_size": 4e8 ' in read
    assert "twice the 2e8 in use" in read
    assert "contiguous_gradients" not in read  # on already
    default = reduce_buckets({})  # not read: DeepSpeed's default, and contiguous gradients with it
    assert '"reduce_bucket_size": 1e9,' in default
    assert '"contiguous_gradients": true' in default


def test_the_sharded_page_shows_what_the_report_prints(tmp_path: Path) -> None:
    """docs/sharded.md's example is this trace's collectives lines, as the terminal report prints them."""
    from gpuidle.report.common import RenderOptions
    from gpuidle.report.terminal import TerminalRenderer

    page = (Path(__file__).parent.parent / "docs" / "sharded.md").read_text()
    shown = page.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    printed = TerminalRenderer().render(_trace(tmp_path, FSDP2), RenderOptions(width=200)).splitlines()
    at = printed.index(shown[0])
    assert printed[at:at + len(shown)] == shown


A2A = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.mark.parametrize(("model", "words"), [
    ("MoELayer.forward", "async_finish=True"),
    ("megatron/core/transformer/moe/moe_layer.py(200): forward", "overlap_moe_expert_parallel_comm"),
])
def test_an_exposed_all_to_all_is_a_cause_with_a_fix_never_no_cause(tmp_path: Path, model: str, words: str) -> None:
    """An expert-parallel step whose largest idle is all-to-all dispatch and combine with no compute beside them:
    named as such with its share and the overlap fix, its gain a range with its assumption, never 'no fix stands
    out'. The fix in the stack's idiom: Megatron-Core's setting where the trace names Megatron, else the overlap
    in PyTorch and DeepEP terms."""
    from gpuidle.report.common import RenderOptions
    from gpuidle.report.terminal import TerminalRenderer

    t = Trace(rank=0, world=8)
    for s in range(STEPS):
        base = s * STEP_US
        t.step(s + 1, base, STEP_US - 10)
        t.launch(at=base + 5, call_dur=5, start=base + 10, dur=600)             # attention
        _collective(t, base + 612, "all_to_all", A2A, base + 620, 250, MAIN)    # dispatch, exposed
        t.launch(at=base + 880, call_dur=5, start=base + 880, dur=500)          # experts
        _collective(t, base + 1382, "all_to_all", A2A, base + 1390, 250, MAIN)  # combine, exposed
        t.launch(at=base + 1645, call_dur=5, start=base + 1650, dur=300)
    t.op(model, 1, 1)  # a mixture-of-experts model: the all-to-alls are expert parallel's
    report = analyze([t.write(tmp_path / "rank0.json.gz")])
    rec = next(r for r in report.recommendations if r.id == "moe_all_to_all_overlap")
    share = rec.evidence["share_of_step"]
    assert isinstance(share, float)
    assert share == pytest.approx(500 / STEP_US, rel=0.05)
    exposed = 2 * 250e-6  # dispatch and combine, per step
    assert rec.gain.basis == "modelled"
    assert rec.gain.step_s_saved_low == pytest.approx(0.3 * exposed, rel=0.05)
    assert rec.gain.step_s_saved_high == pytest.approx(0.8 * exposed, rel=0.05)
    assert words in rec.fix
    assert ("overlap_moe_expert_parallel_comm" in rec.fix) == ("megatron" in model)
    assert "Nothing to fix" not in TerminalRenderer().render(report, RenderOptions(width=200))


@pytest.mark.parametrize(("world", "words"), [(8, "peer links"), (16, "NCCL transport")])
def test_transport_advice_fits_the_size_of_the_job(tmp_path: Path, world: int, words: str) -> None:
    """Slow large all-reduces: in a job one node holds, the GPUs' peer links (NVLink, PCIe); only in a bigger
    one the network transport (InfiniBand, sockets)."""
    t = Trace(rank=0, world=world)
    for s in range(STEPS):
        base = s * 40_000
        t.step(s + 1, base, 40_000 - 10)
        t.launch(at=base + 5, call_dur=5, start=base + 10, dur=5_000)
        _collective(t, base + 5_020, "allreduce", AR, base + 5_030, 20_000, MAIN, mib=64)
        t.launch(at=base + 25_040, call_dur=5, start=base + 25_050, dur=5_000)
    report = analyze([t.write(tmp_path / "rank0.json.gz")])
    rec = next(r for r in report.recommendations if r.id == "nccl_transport")
    assert words in rec.title
    assert ("NCCL_IB_DISABLE" in rec.fix) == (world > 8)
    assert ("nvidia-smi topo -m" in rec.fix) == (world <= 8)
