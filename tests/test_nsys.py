"""Nsight Systems exports: each idle cause, steps and ranks on hand-built exports, with exact expected ns.

Every scenario runs on both column sets (``nsysexport.OLD`` and ``NEW``), and most mirror a
Kineto scenario of ``test_idle_causes``: the same program, recorded by another profiler,
must give the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuidle.api import analyze
from gpuidle.model import AnalysisReport, RankReport
from nsysexport import CONTEXT_SYNC, DTOH, OTHER, PAGEABLE, PINNED, STREAM_SYNC, Export

US = 1e-6
SCHEMAS = pytest.mark.parametrize("schema", ["new", "old"])
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def run(e: Export, tmp_path: Path, name: str = "report.sqlite") -> AnalysisReport:
    return analyze([e.write(tmp_path / name)])


def causes_us(rank: RankReport) -> dict[str, float]:
    return {k: round(v / US, 3) for k, v in rank.primary().idle_by_cause_s.items() if v}


@SCHEMAS
def test_emit_nvtx_step_dataloader_and_operator(schema: str, tmp_path: Path) -> None:
    e = Export(schema)
    e.nvtx("ProfilerStep#1, op_id = 1", 0, 1000)
    e.nvtx("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__, op_id = 2", 0, 400)
    e.nvtx("aten::linear, seq = 5, op_id = 12, sizes = [[8, 16], [32, 16]]", 400, 100)
    e.launch(at=450, call_dur=10, start=500, dur=500)
    report = run(e, tmp_path)
    assert (report.source.format, report.source.framework) == ("nsys", "pytorch")
    (r,) = report.ranks
    d = r.primary()
    assert r.step_source == "profiler_step"
    assert [s.step for s in r.steps] == [1]
    assert d.window_s == pytest.approx(1000 * US)
    assert d.busy_s == pytest.approx(500 * US)
    assert (d.name, d.compute_capability) == ("NVIDIA A100-SXM4-80GB", "8.0")
    # [0,400) in __next__; [400,450) in an operator that launches; [450,500) the launch in flight
    assert causes_us(r) == {"data_loading": 400, "launch_overhead": 100}
    assert r.host_events is not None
    assert r.host_events["linked_launches"] == 1


@SCHEMAS
def test_stream_synchronize_is_host_sync(schema: str, tmp_path: Path) -> None:
    e = Export(schema)
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.launch(at=0, call_dur=10, start=10, dur=290)
    e.sync("cudaStreamSynchronize_v3020", 20, 330, STREAM_SYNC)  # waits for the kernel, returns at 350
    e.nvtx("aten::add, seq = 1", 350, 30)
    e.launch(at=360, call_dur=10, start=400, dur=600)
    (r,) = run(e, tmp_path).ranks
    # [0,10) first launch in flight; [300,350) blocked in the sync; [350,360) op launching; [360,400) in flight
    assert causes_us(r) == {"host_sync": 50, "launch_overhead": 60}
    assert r.kernels.syncs_per_step == 1


def test_backward_operators_on_their_own_thread(tmp_path: Path) -> None:
    e = Export()
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.launch(at=0, call_dur=10, start=10, dur=190)
    e.nvtx("autograd::engine::evaluate_function: MmBackward0, seq = 7", 200, 400, tid=OTHER)
    e.nvtx("aten::cpu_side_helper, seq = 8, op_id = 3, sizes = [[4, 4]]", 250, 100, tid=OTHER)
    e.launch(at=500, call_dur=10, start=600, dur=400, tid=OTHER)
    (r,) = run(e, tmp_path).ranks
    # as the Kineto trace of the same program: the backward op spends 290 µs of its own host time for one
    # launch, far beyond what launching costs: host work, [200,500) with the nested operator and [560,600)
    # past the launch's bound; launching is [500,510) + 50 µs of queue and [0,10)
    assert causes_us(r) == {"cpu_compute": 340, "launch_overhead": 70}


@pytest.mark.parametrize("recorded", [True, False])
def test_synchronization_table_names_the_wait(recorded: bool, tmp_path: Path) -> None:
    """``cudaThreadSynchronize`` is no sync name the analyses know: CUPTI's record says it blocked."""
    e = Export()
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.launch(at=0, call_dur=10, start=10, dur=290)
    if recorded:
        e.sync("cudaThreadSynchronize_v3020", 20, 580, CONTEXT_SYNC)
    else:
        e.runtime("cudaThreadSynchronize_v3020", 20, 580)
    e.launch(at=610, call_dur=10, start=620, dur=380)
    (r,) = run(e, tmp_path).ranks
    # [300,600) inside the call: a sync where CUPTI recorded it, else host time in a runtime call that
    # launches nothing; [600,610) nothing; [610,620) and [0,10) launches in flight
    waited = {"host_sync": 300, "launch_overhead": 20} if recorded else {"cpu_compute": 300, "launch_overhead": 20}
    assert causes_us(r) == {**waited, "unattributed": 10}


@SCHEMAS
def test_pageable_cudamemcpy_is_memcpy(schema: str, tmp_path: Path) -> None:
    e = Export(schema)
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.launch(at=0, call_dur=10, start=10, dur=90)
    e.memcpy(at=120, call_dur=300, start=380, dur=20, nbytes=1 << 20)  # synchronous, from pageable memory
    e.launch(at=430, call_dur=10, start=450, dur=550)
    (r,) = run(e, tmp_path).ranks
    # [120,380) staging the copy (in flight); [400,420) still in the copy call; [100,120) and [420,430)
    # nothing on the host; [430,450) and [0,10) launches in flight
    assert causes_us(r) == {"memcpy": 280, "launch_overhead": 30, "unattributed": 30}
    assert r.kernels.pageable_htod_copies == 1
    assert r.kernels.pageable_htod_bytes == 1 << 20


def test_synchronous_device_to_host_copy_is_host_sync(tmp_path: Path) -> None:
    e = Export()
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.launch(at=0, call_dur=10, start=10, dur=290)
    e.memcpy(at=20, call_dur=400, start=300, dur=20, nbytes=4, direction=DTOH, src=0, dst=PAGEABLE)
    e.memset(at=425, call_dur=2, start=1000, dur=0, nbytes=0)
    e.launch(at=430, call_dur=10, start=450, dur=550)
    (r,) = run(e, tmp_path).ranks
    # [320,420) the host waits in the copy call for the result; [425,427) the memset call (a launch);
    # [430,450) and [0,10) in flight; [420,425) and [427,430) nothing on the host
    assert causes_us(r) == {"host_sync": 100, "launch_overhead": 32, "unattributed": 8}
    assert r.primary().busy_s == pytest.approx(860 * US)


def test_pinned_async_copy_is_not_pageable(tmp_path: Path) -> None:
    e = Export()
    e.launch(at=0, call_dur=10, start=10, dur=90)
    e.memcpy(at=20, call_dur=5, start=100, dur=50, nbytes=1 << 20, src=PINNED, call="cudaMemcpyAsync_v3020")
    (r,) = run(e, tmp_path).ranks
    assert r.kernels.pageable_htod_copies == 0
    assert r.primary().busy_s == pytest.approx(140 * US)


@SCHEMAS
def test_file_reads_of_a_cuda_program_are_data_loading(schema: str, tmp_path: Path) -> None:
    e = Export(schema)
    e.launch(at=0, call_dur=10, start=10, dur=190)
    e.osrt("read", 200, 500)     # the main thread reads its next input
    e.osrt("ioctl", 700, 50)     # not a read: no cause of its own
    e.osrt("read", 200, 600, tid=9)  # a thread that launches nothing: not the GPU's feeder
    e.launch(at=750, call_dur=10, start=800, dur=200)
    report = run(e, tmp_path)
    (r,) = report.ranks
    assert report.source.framework == "cuda"
    assert r.step_source == "none"
    # window [10,1000): first to last GPU activity; [200,700) reading; [700,750) nothing; [750,800) in flight
    assert causes_us(r) == {"data_loading": 500, "unattributed": 50, "launch_overhead": 50}
    fixes = {rec.id: rec for rec in report.recommendations}
    assert "dataloader_workers" in fixes
    for rec in report.recommendations:
        assert "DataLoader" not in rec.fix, rec.fix
        assert "torch" not in rec.fix, rec.fix
        assert "DataLoader" not in rec.title
    assert "cudaMemcpyAsync" in fixes["dataloader_workers"].fix


def test_pytorch_program_gets_pytorch_fixes(tmp_path: Path) -> None:
    e = Export()
    e.nvtx("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 200, 500)
    e.launch(at=0, call_dur=10, start=10, dur=190)
    e.launch(at=750, call_dur=10, start=800, dur=200)
    report = run(e, tmp_path)
    assert report.source.framework == "pytorch"
    fixes = {rec.id: rec for rec in report.recommendations}
    assert "torch.utils.data.DataLoader(" in fixes["dataloader_workers"].fix


def test_aten_kernels_alone_say_pytorch(tmp_path: Path) -> None:
    e = Export()
    e.launch(at=0, call_dur=10, start=10, dur=190,
             name="void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)")
    assert run(e, tmp_path).source.framework == "pytorch"


@SCHEMAS
def test_user_ranges_named_like_steps(schema: str, tmp_path: Path) -> None:
    e = Export(schema)
    for n, start in ((7, 0), (8, 500)):
        e.nvtx(f"train_step {n}", start, 500)
        e.nvtx("forward", start + 10, 100)  # a range that is no step
        e.launch(at=start + 20, call_dur=10, start=start + 100, dur=300)
    (r,) = run(e, tmp_path).ranks
    assert r.step_source == "named_ranges"
    assert [s.step for s in r.steps] == [7, 8]
    assert [round(s.dur_s / US) for s in r.steps] == [500, 500]
    assert [round(s.busy_s / US) for s in r.steps] == [300, 300]


def test_rank_and_world_from_the_environment(tmp_path: Path) -> None:
    e = Export(env={"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "PATH": "/usr/bin"})
    e.launch(at=0, call_dur=10, start=10, dur=90)
    (r,) = run(e, tmp_path).ranks
    assert (r.rank, r.world_size) == (3, 8)
    assert not any("no rank" in n for n in r.notes)
    plain = Export()
    plain.launch(at=0, call_dur=10, start=10, dur=90)
    (r,) = run(plain, tmp_path, "plain.sqlite").ranks
    assert r.rank == 0
    assert any("records no rank" in n for n in r.notes)


def _ddp_step(e: Export, pid: int, device: int, first: float = 390) -> None:
    e.nvtx("ProfilerStep#1", 0, 1000, pid=pid)
    e.launch(at=0, call_dur=10, start=10, dur=first, pid=pid, device=device)
    e.launch(at=20, call_dur=10, start=400, dur=300, name=NCCL, pid=pid, device=device, stream=20)
    e.launch(at=30, call_dur=10, start=800, dur=200, pid=pid, device=device)


def test_processes_running_nccl_on_their_own_gpus_are_ranks(tmp_path: Path) -> None:
    e = Export()
    e.gpu(1, "NVIDIA H100 80GB HBM3", 9, 0)
    _ddp_step(e, pid=200, device=1)
    _ddp_step(e, pid=100, device=0)
    report = run(e, tmp_path)
    assert [r.rank for r in report.ranks] == [0, 1]
    assert [r.primary().device for r in report.ranks] == [0, 1]
    assert report.ranks[1].primary().compute_capability == "9.0"
    assert report.job is not None
    assert report.job.world_size == 2
    for r in report.ranks:
        assert r.world_size == 2
        assert r.primary().busy_s == pytest.approx(590 * US)
        # [400,700) the all-reduce alone; [700,800) nothing on the host; [0,10) in flight
        assert causes_us(r) == {"communication": 300, "unattributed": 100, "launch_overhead": 10}
        assert r.communication.exposed_s == pytest.approx(300 * US)


def test_nvtx_names_the_ranks(tmp_path: Path) -> None:
    e = Export()
    e.nvtx("rank 1", 0, 1000, pid=100)
    e.launch(at=0, call_dur=10, start=10, dur=100, pid=100)
    e.nvtx("rank 0", 0, 1000, pid=200)
    e.launch(at=0, call_dur=10, start=10, dur=200, pid=200)
    report = run(e, tmp_path)
    assert [(r.rank, round(r.primary().busy_s / US)) for r in report.ranks] == [(0, 200), (1, 100)]


def test_processes_without_rank_are_one_rank(tmp_path: Path) -> None:
    e = Export()
    e.launch(at=0, call_dur=10, start=10, dur=100, pid=100)
    e.launch(at=0, call_dur=10, start=50, dur=150, pid=200)
    (r,) = run(e, tmp_path).ranks
    assert r.primary().busy_s == pytest.approx(190 * US)  # [10,200) is the union of both processes' work
    assert any("2 processes with GPU work (pids 100, 200)" in n for n in r.notes)


def test_a_folder_of_per_rank_exports_is_a_job(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in (0, 1):
        e = Export(env={"RANK": str(rank), "WORLD_SIZE": "2"})
        _ddp_step(e, pid=100 + rank, device=0, first=390 - 50 * rank)
        e.write(folder / f"rank{rank}.sqlite")
    report = analyze([folder])
    assert [r.rank for r in report.ranks] == [0, 1]
    assert report.job is not None
    assert report.job.ranks_found == [0, 1]
    assert [round(r.primary().busy_s / US) for r in report.ranks] == [590, 540]


def test_a_newer_schema_with_known_tables_is_read_as_any(tmp_path: Path) -> None:
    e = Export(version="9.0.0")
    e.launch(at=0, call_dur=10, start=10, dur=90)
    (r,) = run(e, tmp_path).ranks
    assert r.primary().busy_s == pytest.approx(90 * US)
    assert not any("schema" in n for n in r.notes)


def test_fewer_columns_read_as_far_as_they_go(tmp_path: Path) -> None:
    e = Export("minimal")
    e.nvtx("ProfilerStep#1", 0, 1000)
    e.launch(at=0, call_dur=10, start=10, dur=290, name="volta_sgemm_128x64_nn")
    e.launch(at=600, call_dur=10, start=700, dur=300, name="volta_sgemm_128x64_nn")
    (r,) = run(e, tmp_path).ranks
    assert r.primary().busy_s == pytest.approx(590 * US)
    assert r.kernels.count == 2
    assert any("schema 1.0" in n for n in r.notes)
    assert any("no globalPid" in n for n in r.notes)
    assert any("no correlation ids" in n for n in r.notes)
    # unlinked, so no launch is known to be in flight: [0,10) and [600,610) are runtime calls on the
    # host, the rest of [300,700) is unexplained
    assert causes_us(r) == {"launch_overhead": 20, "unattributed": 390}


def test_mpi_ranges_are_communication(tmp_path: Path) -> None:
    """Nsight's MPI trace writes each call as a range (``MPI_Allreduce``, ``MPI_Wait``): the device's idle inside
    one is communication, not unexplained; an ``MPI_Comm_rank`` is no communication."""
    e = Export()
    for n, start in ((1, 0), (2, 1000)):
        e.nvtx(f"iteration {n}", start, 1000)
        e.launch(at=start, call_dur=10, start=start + 10, dur=390)
        e.nvtx("MPI_Allreduce", start + 420, 300)
        e.nvtx("MPI_Comm_rank", start + 730, 20)
        e.launch(at=start + 780, call_dur=10, start=start + 800, dur=200)
    (r,) = run(e, tmp_path).ranks
    causes = causes_us(r)
    assert causes["communication"] == pytest.approx(2 * 300)
    # the rest of each step's idle: [0, 10) and [780, 800) launching, [400, 420) and [720, 780) nothing the trace
    # explains (MPI_Comm_rank included)
    assert causes["unattributed"] + causes.get("launch_overhead", 0.0) == pytest.approx(2 * (10 + 20 + 20 + 60))
    assert sum(causes.values()) == pytest.approx(2 * (10 + 20 + 300 + 60 + 20))


@pytest.mark.parametrize("ranges", [True, False])
def test_unexplained_idle_says_whether_the_program_marks_ranges(tmp_path: Path, ranges: bool) -> None:
    """A CUDA program whose idle no host event explains: with NVTX ranges recorded elsewhere in the step, the
    report says the idle falls outside them, never that the program marks none."""
    e = Export()
    for start in (0, 1000):
        if ranges:
            e.nvtx("halo exchange", start + 10, 100)
        e.launch(at=start, call_dur=10, start=start + 10, dur=200)
        e.launch(at=start + 990, call_dur=5, start=start + 995, dur=5)
    report = run(e, tmp_path)
    assert not [r for r in report.recommendations if r.cause == "unattributed"]
    (q,) = [q for q in report.quality if q.kind == "host_unrecorded"]
    assert ("2 host ranges are recorded, and the idle falls outside them" in q.says) is ranges
    assert (q.recording is not None and "NVTX" in q.recording) is not ranges


@pytest.mark.parametrize("version", ["1.0", "4.0", "unknown"])
def test_an_export_is_known_by_its_tables_not_its_version_string(version: str, tmp_path: Path) -> None:
    """An export whose version string is one the reader predates, or none, but whose tables it knows, gets no note;
    one whose copy table lacks a column the reader reads (its kernels still readable) is said to be unknown once."""
    e = Export("new", version=version)
    e.launch(at=0, call_dur=5, start=10, dur=100)
    (rank,) = run(e, tmp_path).ranks
    assert not any("schema" in n for n in rank.notes)
    memcpy = e.tables["CUPTI_ACTIVITY_KIND_MEMCPY"]
    assert "streamId INTEGER NOT NULL, " in memcpy
    e.tables = {**e.tables, "CUPTI_ACTIVITY_KIND_MEMCPY": memcpy.replace("streamId INTEGER NOT NULL, ", "")}
    (rank,) = run(e, tmp_path, "other.sqlite").ranks
    assert sum("tables are not the ones this reader knows" in n for n in rank.notes) == 1
