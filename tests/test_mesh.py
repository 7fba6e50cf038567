"""The job's parallel mesh: each collective's dimension from its process group, each rank's place, and the
communication idle of each dimension adding up to the rank's."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuidle.analysis.mesh import dimension_of_group
from gpuidle.api import analyze
from gpuidle.model import AnalysisReport, RankReport
from gpuidle.report.terminal import TerminalRenderer
from minitrace import Trace

US = 1e-6
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
ALLTOALL = "ncclDevKernel_SendRecv_AllToAll(ncclDevComm*, unsigned long, ncclWork*)"
STEP = 10_000.0
# a pp 2 × dp 2 × tp 2 mesh as torch lays it out (tp innermost): rank 1 is pp 0, dp 0, tp 1
GROUPS = [
    {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8, "ranks": list(range(8))},
    {"pg_name": "2", "pg_desc": "mesh_pp", "pg_size": 2, "ranks": [1, 5]},
    {"pg_name": "4", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [1, 3]},
    {"pg_name": "7", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]},
]
# (collective, group, kernel, device start and end in the step (µs), exposed µs: no compute beside it)
COMMS = [("allreduce", "7", ALLREDUCE, 3_000, 3_800, 800),   # tp: nothing beside it
         ("send", "2", SENDRECV, 6_000, 6_500, 500),           # pp: nothing beside it
         ("allreduce", "4", ALLREDUCE, 7_500, 9_000, 1_000)]   # dp: the first 500 µs under compute
COMPUTE = [(10, 3_000), (3_800, 6_000), (6_500, 8_000)]


def mesh_trace(path: Path, groups: list[dict[str, Any]] | None, names: bool = True, rank: int = 1,
               world: int = 8, comms: list[tuple[str, str, str, float, float, float]] = COMMS,
               compute: list[tuple[float, float]] = COMPUTE, steps: int = 4) -> Path:
    """``steps`` steps of 10 ms: compute kernels and the collectives of :data:`COMMS`, each launched inside its
    ``record_param_comms`` (naming its group where ``names``); nothing on the host after the launches."""
    t = Trace(rank=rank, world=world, groups=groups)
    for n in range(steps):
        base = n * STEP
        t.step(n + 1, base, STEP)
        at = base + 5
        for start, end in compute:
            t.launch(at=at, call_dur=5, start=base + start, dur=end - start)
            at += 10
        for collective, group, kernel, start, end, _ in comms:
            args = {"Collective name": collective, "Group size": 2, "In msg nelems": 1 << 20,
                    "Out msg nelems": 1 << 20, "dtype": "Float" if "_f32_" in kernel else "BFloat16"}
            if names:
                args["Process Group Name"] = group
            t.op("record_param_comms", at, 10, **args)
            t.launch(at=at + 2, call_dur=5, start=base + start, dur=end - start, stream=20, name=kernel)
            at += 20
    return t.write(path / f"rank{rank}.json.gz")


def with_op(path: Path, name: str) -> Path:
    """``path`` with one host operator ``name`` added at its start (a label the trace would carry)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 1, "ts": 1.0,
                               "dur": 1.0})
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def flat(text: str) -> str:
    return " ".join(text.split())


def by_dim(rank: RankReport) -> dict[str, Any]:
    return {m.dim: m for m in rank.communication.mesh}


def test_each_dimension_from_its_group_with_its_exposed_time(tmp_path: Path) -> None:
    report = analyze([mesh_trace(tmp_path, GROUPS)])
    (rank,) = report.ranks
    dims = by_dim(rank)
    assert list(dims) == ["pp", "dp", "tp"]
    assert {d: (m.size, m.coordinate, m.groups, m.ranks) for d, m in dims.items()} == {
        "pp": (2, 0, ["2"], [1, 5]), "dp": (2, 0, ["4"], [1, 3]), "tp": (2, 1, ["7"], [0, 1])}
    assert all(not m.inferred for m in dims.values())
    steady = [s for s in rank.steps if s.excluded is None]
    assert steady
    expected = {"tp": 800 * US, "pp": 500 * US, "dp": 1_000 * US}
    for s in steady:
        assert s.comm_by_dim_s == pytest.approx(expected)
        assert sum(s.comm_by_dim_s.values()) == pytest.approx(s.idle_by_cause_s["communication"])
    d = rank.primary()
    assert sum(m.exposed_s for m in dims.values()) == pytest.approx(d.idle_by_cause_s["communication"])
    for (_, _, _, start, end, _), dim in zip(COMMS, ("tp", "pp", "dp"), strict=True):
        assert dims[dim].comm_s == pytest.approx(4 * (end - start) * US)
        assert dims[dim].count == 4
    text = flat(TerminalRenderer().render(report))
    assert ("mesh: 8 ranks: pp 2 × dp 2 × tp 2 · this rank pp 0, dp 0, tp 1 · from group 'mesh_dp', "
            "group 'mesh_pp', group 'mesh_tp'") in text
    doc = (Path(__file__).parent.parent / "docs" / "parallelism.md").read_text()
    for line in ("pipeline parallel (pp): 2.00 ms of communication idle, 2.00 ms on the device, 4 collectives",
                 "data parallel (dp): 4.00 ms of communication idle, 6.00 ms on the device, 4 collectives",
                 "tensor parallel (tp): 3.20 ms of communication idle, 3.20 ms on the device, 4 collectives"):
        assert line in text
        assert line in doc  # the page shows what this trace prints


def test_without_groups_the_dimension_says_it_was_inferred(tmp_path: Path) -> None:
    """No ``pg_config``, no group names: send/recv is a pipeline's (inferred, said so); the all-reduces' group
    is the whole world by its size, never given a confident role beside a pipeline."""
    (rank,) = analyze([mesh_trace(tmp_path, None, names=False, world=2)]).ranks
    dims = by_dim(rank)
    assert dims["pp"].inferred
    assert "send/recv" in dims["pp"].source
    assert "dp" not in dims
    assert "tp" not in dims
    assert dims["world"].source == "inferred: its group is the whole world"
    assert dims["pp"].exposed_s + dims["world"].exposed_s == pytest.approx(
        rank.primary().idle_by_cause_s["communication"])


def test_an_all_to_all_is_expert_parallel_only_in_a_mixture_of_experts(tmp_path: Path) -> None:
    comms = [("all_to_all", "", ALLTOALL, 3_000, 3_800, 800)]
    report = analyze([mesh_trace(tmp_path, None, names=False, comms=comms)])
    (plain,) = report.ranks
    assert by_dim(plain)["unknown"].source.startswith("all-to-all, its group not recorded")
    # not known to be an expert dispatch: not offered, and --explain says which precondition failed
    assert "moe_all_to_all_overlap" not in {r.id for r in report.recommendations}
    (declined,) = [d for d in report.declined if d.id == "moe_all_to_all_overlap"]
    assert declined.check.startswith("a mixture-of-experts model in the trace")
    moe = tmp_path / "moe"
    moe.mkdir()
    report = analyze([with_op(mesh_trace(moe, None, names=False, comms=comms), "MoELayer.forward")])
    (rank,) = report.ranks
    assert by_dim(rank)["ep"].inferred
    assert by_dim(rank)["ep"].exposed_s == pytest.approx(4 * 800 * US)
    (fix,) = [r for r in report.recommendations if r.id == "moe_all_to_all_overlap"]
    assert (fix.gain.step_s_saved_low, fix.gain.step_s_saved_high) == (
        pytest.approx(0.3 * 800 * US), pytest.approx(0.8 * 800 * US))


@pytest.mark.parametrize(("desc", "dim"), [
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"), ("EMBEDDING_GROUP", "pp"),
    ("DATA_PARALLEL_GROUP", "dp"), ("DATA_PARALLEL_GROUP_WITH_CP", "dp"), ("CONTEXT_PARALLEL_GROUP", "cp"),
    ("EXPERT_MODEL_PARALLEL_GROUP", "ep"), ("EXPERT_TENSOR_PARALLEL_GROUP", "tp"),
    ("EXPERT_DATA_PARALLEL_GROUP", "dp"), ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp"),
    ("mesh_tp", "tp"), ("mesh_pp", "pp"), ("mesh_cp", "cp"), ("mesh_ep", "ep"), ("mesh_dp_replicate", "dp"),
    ("mesh_dp_shard", "dp"), ("mesh_dp_shard_cp", "dp"), ("mesh_dp_cp", "dp"), ("default_pg", "world"),
    ("mesh_dim_0", None), ("undefined", None), ("", None),
])
def test_group_descriptions_as_megatron_and_device_mesh_write_them(desc: str, dim: str | None) -> None:
    assert dimension_of_group(desc) == dim


@pytest.fixture(scope="module")
def device_mesh_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real ``init_device_mesh`` job of ``mesh_profile.py`` on four gloo ranks."""
    out = tmp_path_factory.mktemp("mesh")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                    str(Path(__file__).parent / "mesh_profile.py"), str(out)],
                   check=True, capture_output=True, timeout=300, env=env)
    return out


def test_a_real_device_mesh_gives_each_rank_its_place(device_mesh_job: Path, tmp_path: Path) -> None:
    """Each rank's groups exactly as torch recorded them, collectives on them; the place gpuidle gives each
    rank is torch's own ``DeviceMesh.get_coordinate()``."""
    traces = []
    truths = {}
    for rank in range(4):
        truth = json.loads((device_mesh_job / f"rank{rank}.json").read_text())
        truths[rank] = truth
        groups = truth["distributedInfo"]["pg_config"]
        name = {g["pg_desc"]: g["pg_name"] for g in groups}
        comms = [("allreduce", name["mesh_tp"], ALLREDUCE, 3_000, 3_800, 800),
                 ("allreduce", name["mesh_dp"], ALLREDUCE, 7_500, 9_000, 1_000)]
        folder = tmp_path / str(rank)
        folder.mkdir()
        traces.append(mesh_trace(folder, groups, rank=rank, world=4, comms=comms))
    report: AnalysisReport = analyze(traces)
    for r in report.ranks:
        dims = by_dim(r)
        assert {d: dims[d].coordinate for d in ("dp", "tp")} == truths[r.rank]["coordinate"]
        assert {d: dims[d].ranks for d in ("dp", "tp")} == truths[r.rank]["groups"]
    assert report.job is not None
    job = {m.dim: m for m in report.job.communication.mesh}
    assert (job["dp"].size, job["tp"].size) == (2, 2)
    assert sum(m.exposed_s for m in job.values()) == pytest.approx(report.job.communication.exposed_s)
    assert "mesh: 4 ranks: dp 2 × tp 2 · from group 'mesh_dp', group 'mesh_tp'" in flat(
        TerminalRenderer().render(report))


def test_tensor_parallel_overlap_is_credited_with_the_tp_idle_alone(tmp_path: Path) -> None:
    report = analyze([mesh_trace(tmp_path, GROUPS)])
    (fix,) = [r for r in report.recommendations if r.id == "tp_comm_overlap"]
    tp = 800 * US  # per step, from COMMS
    assert fix.evidence["exposed_tp_ms_per_step"] == pytest.approx(tp * 1e3)
    assert (fix.gain.step_s_saved_low, fix.gain.step_s_saved_high) == (pytest.approx(0.3 * tp), pytest.approx(0.9 * tp))
    assert fix.evidence["tp_group_ranks"] == [0, 1]
    assert "span more than one" not in fix.fix


def test_a_tensor_parallel_group_across_nodes_is_flagged(tmp_path: Path) -> None:
    groups = [{**g, "ranks": [1, 9]} if g["pg_desc"] == "mesh_tp" else g for g in GROUPS]
    (fix,) = [r for r in analyze([mesh_trace(tmp_path, groups, world=16)]).recommendations
              if r.id == "tp_comm_overlap"]
    assert fix.title.endswith("and keep it inside one node")
    assert "ranks (1..9) span more than one 8-GPU node" in fix.fix


# stage 0 of 4 with 4 microbatches: per step 4 sends of activations and 4 receives of gradients
P2P = [("send", "2", SENDRECV, 1_000 + j * 1_125, 1_000 + j * 1_125 + 562.5, 562.5) for j in range(8)]
P2P_COMPUTE = [(10, 1_000)] + [(1_000 + j * 1_125 + 562.5, 1_000 + (j + 1) * 1_125) for j in range(8)]
PIPELINE_GROUPS = [
    {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8, "ranks": list(range(8))},
    {"pg_name": "2", "pg_desc": "mesh_pp", "pg_size": 4, "ranks": [0, 2, 4, 6]},
    {"pg_name": "4", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [0, 1]},
]


def test_the_pipeline_bubble_against_its_schedule(tmp_path: Path) -> None:
    report = analyze([mesh_trace(tmp_path, PIPELINE_GROUPS, rank=0, comms=P2P, compute=P2P_COMPUTE)])
    (rank,) = report.ranks
    assert by_dim(rank)["pp"].size == 4
    assert by_dim(rank)["pp"].coordinate == 0
    (fix,) = [r for r in report.recommendations if r.id == "pipeline_bubble"]
    p, m, step, idle = 4, 4, STEP * US, 8 * 562.5 * US
    bound, doubled = (p - 1) / (m + p - 1), (p - 1) / (2 * m + p - 1)
    assert fix.evidence["microbatches"] == m
    assert fix.evidence["schedule_bubble_share"] == pytest.approx(bound, abs=5e-4)
    assert fix.evidence["share_of_step"] == pytest.approx(idle / step, abs=5e-4)
    scheduled = min(idle, bound * step)
    assert fix.evidence["beyond_schedule_ms_per_step"] == pytest.approx((idle - scheduled) * 1e3, abs=1e-3)
    saved = scheduled * (1 - doubled / bound)
    assert fix.gain.step_s_saved_low == pytest.approx(0.5 * saved)
    assert fix.gain.step_s_saved_high == pytest.approx(saved)
    assert "The pipeline bubble is 45.0% of the step (its schedule leaves 42.9%)" in fix.title


def test_a_stage_whose_place_is_not_recorded_gets_no_gain(tmp_path: Path) -> None:
    (fix,) = [r for r in analyze([mesh_trace(tmp_path, None, names=False, rank=0, world=2, comms=P2P,
                                             compute=P2P_COMPUTE)]).recommendations if r.id == "pipeline_bubble"]
    assert fix.gain.step_s_saved is None
    assert "the stage's place or its microbatches are not told by it (32 send/recv in the window)" in fix.gain.reason
    assert fix.confidence == "low"


def test_a_ddp_fix_beside_tensor_parallel_claims_the_data_parallel_idle_alone(tmp_path: Path) -> None:
    """DDP with tensor parallel: eight 100 µs gradient all-reduces on the dp group and one 800 µs all-reduce on
    the tp group per step, all exposed. DDP's bucket fix may claim the 0.8 ms of dp, never the tp's."""
    comms = [("allreduce", "7", ALLREDUCE, 3_000, 3_800, 800)] + [
        ("allreduce", "4", ALLREDUCE, 8_000 + 200 * j, 8_100 + 200 * j, 100) for j in range(8)]
    compute = [(10, 3_000), (3_800, 8_000)]
    trace = with_op(mesh_trace(tmp_path, GROUPS, comms=comms, compute=compute), "DistributedDataParallel.forward")
    report = analyze([with_op(trace, "autograd::engine::evaluate_function: AddmmBackward0")])  # training
    (rank,) = report.ranks
    assert rank.communication.parallelism == "ddp"
    (bucket,) = [r for r in report.recommendations if r.id == "ddp_bucket_cap"]
    assert bucket.evidence["exposed_all_reduce_ms_per_step"] == pytest.approx(0.8)
    assert bucket.gain.step_s_saved_high is not None
    assert bucket.gain.step_s_saved_high <= 0.8e-3 + 1e-9
    (tp,) = [r for r in report.recommendations if r.id == "tp_comm_overlap"]
    assert tp.alternative_to is None


def test_a_mesh_partly_missing_names_the_part(tmp_path: Path) -> None:
    """Ranks 0 and 1 of the pp 2 × dp 2 × tp 2 job: stage 1 of the pipeline (ranks 4 and 5 by their groups) has
    no trace, nor has data-parallel replica 1 (rank 3); every tp place is held."""
    groups0 = [{**g, "ranks": {"mesh_pp": [0, 4], "mesh_dp": [0, 2]}.get(g["pg_desc"], g["ranks"])} for g in GROUPS]
    one, two = tmp_path / "0", tmp_path / "1"
    one.mkdir()
    two.mkdir()
    report = analyze([mesh_trace(one, groups0, rank=0), mesh_trace(two, GROUPS, rank=1)])
    assert report.job is not None
    gaps = [n for n in report.job.notes if n.startswith("no trace of")]
    assert gaps == [
        "no trace of pp 1 (ranks 4, 5): its pipeline parallel part of the job is not in this analysis",
        "no trace of dp 1 (ranks 2, 3): its data parallel part of the job is not in this analysis",
    ]


def test_the_stage_that_computes_longest_sets_the_pace(tmp_path: Path) -> None:
    """Two pipeline stages, traced: stage 1 computes 9.0 ms a step, stage 0 7.2 ms (COMPUTE); stage 1 is named
    as the pace, not as a straggler."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]},
              {"pg_name": "1", "pg_desc": "mesh_pp", "pg_size": 2, "ranks": [0, 1]}]
    p2p = [("send", "1", SENDRECV, 9_200, 9_400, 200)]
    one, two = tmp_path / "0", tmp_path / "1"
    one.mkdir()
    two.mkdir()
    report = analyze([mesh_trace(one, groups, rank=0, world=2, comms=p2p),
                      mesh_trace(two, groups, rank=1, world=2, comms=p2p, compute=[(10, 9_010)])])
    assert report.job is not None
    busy0 = sum(end - start for start, end in COMPUTE) / 1e3
    assert ("pipeline stage 1 (ranks 1) computes the longest, 9.00 ms a step against "
            f"{busy0:.2f} ms on stage 0: it sets the pipeline's pace") in " ".join(report.job.notes)
    assert 1 not in {s.rank for s in report.job.stragglers}


def test_no_straggler_for_the_order_a_pipeline_schedule_imposes(tmp_path: Path) -> None:
    """Two stages that compute alike over eight steps; the world's all-reduce after the flush reaches stage 0 last
    (1F1B ends its backward there): stage 1 waits 1.5 ms in it every step. That is the schedule's order, not a
    late rank: no straggler, the wait stays communication."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]},
              {"pg_name": "1", "pg_desc": "mesh_pp", "pg_size": 2, "ranks": [0, 1]}]
    first = [("send", "1", SENDRECV, 6_000, 6_500, 500), ("allreduce", "0", ALLREDUCE, 8_500, 9_000, 500)]
    last = [("send", "1", SENDRECV, 6_000, 6_500, 500), ("allreduce", "0", ALLREDUCE, 7_000, 9_000, 2_000)]
    one, two = tmp_path / "0", tmp_path / "1"
    one.mkdir()
    two.mkdir()
    report = analyze([mesh_trace(one, groups, rank=0, world=2, comms=first, steps=8),
                      mesh_trace(two, groups, rank=1, world=2, comms=last, steps=8)])
    assert report.job is not None
    assert report.job.stragglers == []
    assert "pipeline stages compute alike" in " ".join(report.job.notes)
    for rank in report.ranks:
        assert rank.primary().idle_by_cause_s["straggler_wait"] == 0.0


def test_one_step_names_no_straggler_and_moves_no_wait(tmp_path: Path) -> None:
    """One step per rank, rank 1 reaching the data-parallel all-reduce 1.5 ms after rank 0: arrival skew, not
    a straggler; the wait is not moved to ``straggler_wait`` while the note says there are too few steps."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]
    early = [("allreduce", "0", ALLREDUCE, 7_000, 9_000, 2_000)]
    late = [("allreduce", "0", ALLREDUCE, 8_500, 9_000, 500)]
    one, two = tmp_path / "0", tmp_path / "1"
    one.mkdir()
    two.mkdir()
    report = analyze([mesh_trace(one, groups, rank=0, world=2, comms=early, steps=1),
                      mesh_trace(two, groups, rank=1, world=2, comms=late, steps=1)])
    assert report.job is not None
    assert report.job.stragglers == []
    assert "too few steps to name a straggler" in " ".join(report.job.notes)
    assert all(r.primary().idle_by_cause_s["straggler_wait"] == 0.0 for r in report.ranks)
    assert "straggler_wait" not in {r.cause for r in report.recommendations}


def test_context_parallel_overlap_from_the_cp_group(tmp_path: Path) -> None:
    """A ring of send/recv on the group ``mesh_cp``: its description, not the send/recv, tells the dimension."""
    groups = [*GROUPS[:1], {"pg_name": "5", "pg_desc": "mesh_cp", "pg_size": 2, "ranks": [1, 9]}]
    comms = [("send", "5", SENDRECV, 3_000, 3_600, 600)]
    report = analyze([mesh_trace(tmp_path, groups, comms=comms, world=16)])
    (rank,) = report.ranks
    assert by_dim(rank)["cp"].source == "group 'mesh_cp'"
    (fix,) = [r for r in report.recommendations if r.id == "cp_comm_overlap"]
    cp = 600 * US
    assert (fix.gain.step_s_saved_low, fix.gain.step_s_saved_high) == (pytest.approx(0.3 * cp), pytest.approx(0.9 * cp))
    assert fix.title.endswith("keep the ring inside one node")
    assert "pipeline_bubble" not in {r.id for r in report.recommendations}


def test_the_rank_others_wait_for_in_all_to_all_is_named(tmp_path: Path) -> None:
    """Two expert-parallel ranks over five steps: rank 1's all-to-all runs 1.0 ms a step, 0.8 ms of it with no
    compute beside it (the next kernel starts at 3.8 ms), rank 0's 0.25 ms: rank 0 is the one the other waits for.
    (With one step it would be arrival skew: :func:`test_one_step_names_no_straggler_and_moves_no_wait`.)"""
    one, two = tmp_path / "0", tmp_path / "1"
    one.mkdir()
    two.mkdir()
    traces = [mesh_trace(folder, None, names=False, rank=rank, world=2,
                         comms=[("all_to_all", "", ALLTOALL, 3_000, 3_000 + wait, wait)], steps=5)
              for folder, rank, wait in ((one, 0, 250), (two, 1, 1_000))]
    report = analyze(traces)
    assert report.job is not None
    assert ("all-to-all: rank 0 waits least in its all-to-alls (250.0 µs a step against 800.0 µs on rank 1): the "
            "others wait for it") in " ".join(report.job.notes)


@pytest.fixture(scope="module")
def pipeline_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real ``torch.distributed.pipelining`` job of ``pipeline_profile.py`` on two gloo ranks."""
    out = tmp_path_factory.mktemp("pipeline")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(Path(__file__).parent / "pipeline_profile.py"), str(out)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return out


def test_a_real_pipeline_and_all_to_all_are_named_as_the_mesh_reads_them(pipeline_job: Path) -> None:
    """Every collective PyTorch records on gloo for a pipeline schedule and an all-to-all is one the analysis
    recognises (its host-call class), and reads as the kind its dimension is inferred from: each stage's
    send/recv (4 microbatches, one neighbour: 4 each way) as ``send_recv``, the all-to-all as ``all_to_all``."""
    from gpuidle.analysis.names import COLLECTIVE_HOST
    from gpuidle.model.comm_kernels import canonical_op

    for rank in range(2):
        doc = json.loads((pipeline_job / f"pipeline_rank{rank}.json").read_text())
        assert doc["distributedInfo"]["pg_config"][0]["pg_desc"] == "default_pg"
        names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
        collective = [n for n in names if n.startswith(("c10d::", "gloo:"))]
        assert collective
        assert all(any(p.search(n) for p in COLLECTIVE_HOST) for n in collective)
        kinds = [canonical_op(n) for n in collective if n.startswith("c10d::")]
        assert kinds.count("send_recv") == 2 * 4
        assert kinds.count("all_to_all") == 1


def test_a_context_parallel_all_to_all_is_the_cp_fixs_alone(tmp_path: Path) -> None:
    """Ulysses-style context parallel: an all-to-all on the ``mesh_cp`` group, in a mixture-of-experts model. The
    cp fix claims it; the expert fix, with no expert-parallel group, promises nothing on it."""
    groups = [*GROUPS[:1], {"pg_name": "5", "pg_desc": "mesh_cp", "pg_size": 2, "ranks": [0, 1]}]
    comms = [("all_to_all", "5", ALLTOALL, 3_000, 3_800, 800)]
    report = analyze([with_op(mesh_trace(tmp_path, groups, comms=comms), "MoELayer.forward")])
    ids = {r.id: r for r in report.recommendations}
    assert ids["cp_comm_overlap"].gain.step_s_saved_high == pytest.approx(0.9 * 800 * US)
    assert ids["moe_all_to_all_overlap"].gain.step_s_saved is None


def test_compression_is_never_credited_with_tensor_parallel_all_reduces(tmp_path: Path) -> None:
    """DDP beside tensor parallel: an exposed 0.8 ms fp32 all-reduce on the tp group, the dp group's all under
    compute. A bf16 hook on DDP's gradients cannot shorten the tp all-reduce: no compression fix."""
    fp32 = ALLREDUCE.replace("bf16", "f32")
    comms = [("allreduce", "7", fp32, 3_000, 3_800, 800), ("allreduce", "4", fp32, 1_000, 1_500, 0)]
    trace = with_op(mesh_trace(tmp_path, GROUPS, comms=comms, compute=[(10, 3_000), (3_800, 9_900)]),
                    "DistributedDataParallel.forward")
    report = analyze([with_op(trace, "autograd::engine::evaluate_function: AddmmBackward0")])
    assert report.ranks[0].communication.parallelism == "ddp"
    ids = {r.id for r in report.recommendations}
    assert "comm_compression" not in ids
    assert "tp_comm_overlap" in ids


def test_flattened_and_hsdp_groups_give_each_dimension_its_own_size(tmp_path: Path) -> None:
    """torchtitan's 8 ranks as dp_replicate 2 × dp_shard 2 × tp 2, with FSDP on the flattened ``dp_shard_cp``-like
    group and the default group written without its ranks (as some PyTorch versions do): dp is replicate × shard,
    the flattened group gives no size, the world's list is never copied into the report."""
    # rank 5: replicate 1, shard 0, tp 1 (tp innermost, then shard, then replicate)
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8, "ranks": []},
              {"pg_name": "1", "pg_desc": "mesh_dp_replicate", "pg_size": 2, "ranks": [1, 5]},
              {"pg_name": "2", "pg_desc": "mesh_dp_shard", "pg_size": 2, "ranks": [5, 7]},
              {"pg_name": "3", "pg_desc": "mesh_dp_shard_cp", "pg_size": 4, "ranks": [1, 3, 5, 7]},
              {"pg_name": "4", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [4, 5]}]
    comms = [("allreduce", "4", ALLREDUCE, 3_000, 3_800, 800), ("allreduce", "3", ALLREDUCE, 6_000, 6_500, 500),
             ("allreduce", "0", ALLREDUCE, 7_500, 7_600, 100)]
    report = analyze([mesh_trace(tmp_path, groups, rank=5, comms=comms)])
    dims = by_dim(report.ranks[0])
    assert (dims["dp"].size, dims["dp"].coordinate, dims["dp"].ranks) == (4, 2, [])
    assert (dims["tp"].size, dims["tp"].coordinate) == (2, 1)
    assert "world" in dims  # the default group's all-reduce, beside the named dimensions
    assert dims["world"].ranks == []
    text = flat(TerminalRenderer().render(report))
    assert "mesh: 8 ranks: dp 4 × tp 2 · this rank dp 2, tp 1" in text
    assert "not recorded" not in text


def test_no_data_parallel_fix_in_a_tensor_parallel_job(tmp_path: Path) -> None:
    """A training job of tensor parallelism alone (its all-reduces on ``mesh_tp``, nine a step, fp32): however
    its all-reduces read, no DDP fix (buckets, compression, more work per all-reduce) is offered, and
    ``--explain`` says the data-parallel dimension is missing."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]},
              {"pg_name": "1", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]}]
    comms = [("allreduce", "1", ALLREDUCE.replace("bf16", "f32"), 1000 + i * 1000, 1400 + i * 1000, 400)
             for i in range(9)]
    trace = with_op(mesh_trace(tmp_path, groups, rank=0, world=2, comms=comms, compute=[(10, 900)], steps=5),
                    "autograd::engine::evaluate_function: MmBackward0")
    report = analyze([trace])
    assert [m.dim for m in report.ranks[0].communication.mesh] == ["tp"]
    offered = {r.id for r in report.recommendations}
    assert "tp_comm_overlap" in offered
    assert not offered & {"ddp_bucket_cap", "ddp_no_sync", "comm_compression", "comm_bound_batch"}
    assert any(d.id == "comm_bound_batch" and "data-parallel dimension" in d.check for d in report.declined)


def test_expert_groups_do_not_multiply_the_dense_dimensions(tmp_path: Path) -> None:
    """Megatron-Core's 8-rank MoE job, tp 1, ep 4: ``DATA_PARALLEL_GROUP`` holds all 8 ranks and
    ``EXPERT_DATA_PARALLEL_GROUP`` 2 of them; data parallel is 8 (the expert groups split the expert layers'
    ranks), not 8 × 2."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8, "ranks": list(range(8))},
              {"pg_name": "1", "pg_desc": "DATA_PARALLEL_GROUP", "pg_size": 8, "ranks": list(range(8))},
              {"pg_name": "2", "pg_desc": "EXPERT_MODEL_PARALLEL_GROUP", "pg_size": 4, "ranks": [0, 1, 2, 3]},
              {"pg_name": "3", "pg_desc": "EXPERT_DATA_PARALLEL_GROUP", "pg_size": 2, "ranks": [1, 5]},
              {"pg_name": "4", "pg_desc": "EXPERT_TENSOR_PARALLEL_GROUP", "pg_size": 1, "ranks": [1]}]
    comms = [("allreduce", "1", ALLREDUCE, 6_000, 6_500, 500), ("allreduce", "3", ALLREDUCE, 7_500, 7_600, 100)]
    report = analyze([mesh_trace(tmp_path, groups, rank=1, comms=comms)])
    dims = by_dim(report.ranks[0])
    assert (dims["dp"].size, dims["dp"].coordinate) == (8, 1)
    assert (dims["ep"].size, dims["ep"].coordinate) == (4, 1)


def test_a_batched_send_recv_counts_its_operations_from_the_host(tmp_path: Path) -> None:
    """1F1B's steady state sends an activation and receives a gradient in one batch: one kernel, two
    ``record_param_comms``. The microbatches come from the host calls: stage 0 of 4, four microbatches."""
    t = Trace(rank=0, world=8, groups=PIPELINE_GROUPS)
    for n in range(4):
        base = n * STEP
        t.step(n + 1, base, STEP)
        at = base + 5
        for start, end in [(10, 1_000)] + [(1_000 + j * 2_250 + 1_125, 1_000 + (j + 1) * 2_250) for j in range(4)]:
            t.launch(at=at, call_dur=5, start=base + start, dur=end - start)
            at += 10
        for j in range(4):
            for op in ("send", "recv"):
                t.op("record_param_comms", at, 10, **{"Collective name": op, "Process Group Name": "2",
                                                        "Group size": 4, "dtype": "BFloat16"})
                at += 10
            t.launch(at=at - 8, call_dur=5, start=base + 1_000 + j * 2_250, dur=1_125, stream=20, name=SENDRECV)
    report = analyze([t.write(tmp_path / "rank0.json.gz")])
    assert by_dim(report.ranks[0])["pp"].p2p == 4 * 8
    assert by_dim(report.ranks[0])["pp"].count == 4 * 4
    (fix,) = [r for r in report.recommendations if r.id == "pipeline_bubble"]
    assert fix.evidence["microbatches"] == 4


def test_the_collective_under_each_idle_piece_is_the_earliest_started_one() -> None:
    """``collective_under`` against the plain way: paint each collective's pieces, latest start first, so the
    earliest-started collective covering a piece is left (3,000 random sets of collectives on two devices)."""
    import numpy as np

    from gpuidle.analysis import intervals as iv
    from gpuidle.analysis.comm import Collectives, collective_under

    rng = np.random.default_rng(7)
    bounds = np.array([0, 600, 1_300], dtype=np.int64)
    for _ in range(3_000):
        n, m = int(rng.integers(0, 30)), int(rng.integers(0, 10))
        start = rng.integers(0, 1_000, n).astype(np.int64)
        coll = Collectives(op=np.arange(n, dtype=np.int64), device=rng.integers(0, 2, n), start=start,
                           end=start + rng.integers(1, 200, n), collective=["all_reduce"] * n, process_group=[""] * n,
                           nbytes=np.full(n, -1, dtype=np.int64), group_size=np.full(n, 2, dtype=np.int32),
                           step=np.zeros(n, dtype=np.int64), dtype=["float32"] * n)
        seg_s = np.sort(rng.integers(0, 1_200, m)).astype(np.int64)
        seg = (seg_s, seg_s + rng.integers(1, 100, m))
        s, e, row = collective_under(coll, 0, seg, bounds)
        on = np.flatnonzero(coll.device == 0)
        on = on[np.argsort(coll.start[on], kind="stable")]
        want_s, want_e, _ = iv.label_segments(iv.union(*seg), [(coll.start[on], coll.end[on])], extra_points=bounds)
        want = np.full(want_s.size, -1, dtype=np.int64)
        for j in on[::-1]:
            want[(want_s >= coll.start[j]) & (want_s < coll.end[j])] = j
        assert np.array_equal(s, want_s)
        assert np.array_equal(e, want_e)
        assert np.array_equal(row, want)
