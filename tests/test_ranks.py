"""The job view on hand-built multi-rank traces with a known straggler, and on a real rank pair."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA
from gpuidle.analysis.comm import bus_factor
from gpuidle.api import analyze
from gpuidle.model import AnalysisReport
from minitrace import Trace

US = 1e-6
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def two_ranks(tmp_path: Path, late_by: float = 300, steps: int = 2, nelems: int = 262144) -> AnalysisReport:
    """Rank 1 loads data ``late_by`` µs longer each step; the all-reduce moves 1 MiB (``nelems`` floats) in 300 µs."""
    for rank in (0, 1):
        t = Trace(rank=rank, world=2)
        for s in range(steps):
            base = s * 2000
            load = late_by if rank == 1 else 0
            t.step(s + 1, base, 1500)
            if load:
                t.annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", base, load)
            t.launch(at=base + load, call_dur=10, start=base + load + 10, dur=490)
            t.op("autograd::engine::evaluate_function: MmBackward0", base + load + 100, 10)  # training, device busy
            t.op("record_param_comms", base + load + 20, 20, **{
                "Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": nelems,
                "Out msg nelems": nelems, "dtype": "Float", "Group size": 2})
            ar_start = base + load + 500
            ar_end = base + late_by + 800  # ends together on both ranks
            t.launch(at=base + load + 25, call_dur=5, start=ar_start, dur=ar_end - ar_start, stream=20,
                     name=ALLREDUCE)
        t.write(tmp_path / f"rank{rank}.json.gz")
    return analyze([tmp_path], workers=2)


def test_straggler_wait_is_not_communication(tmp_path: Path) -> None:
    report = two_ranks(tmp_path, steps=6)
    r0, r1 = report.ranks
    d0, d1 = r0.primary(), r1.primary()
    # rank 0: all-reduce [500, 1100) per step, alone on the device: 300 µs waiting, 300 µs moving data
    assert d0.idle_by_cause_s["straggler_wait"] == pytest.approx(6 * 300 * US)
    assert d0.idle_by_cause_s["communication"] == pytest.approx(6 * 300 * US)
    # rank 1 arrived last: its all-reduce is pure transfer
    assert d1.idle_by_cause_s["straggler_wait"] == 0
    assert d1.idle_by_cause_s["communication"] == pytest.approx(6 * 300 * US)
    assert d1.idle_by_cause_s["data_loading"] == pytest.approx(6 * 300 * US)
    for r in (r0, r1):
        for s in r.steps:
            assert s.busy_s + sum(s.idle_by_cause_s.values()) == pytest.approx(s.dur_s, abs=1e-12)
    job = report.job
    assert job is not None
    (straggler,) = job.stragglers
    assert straggler.rank == 1
    assert straggler.steps == [1, 2, 3, 4, 5, 6]
    assert straggler.lateness_s == pytest.approx(300 * US)
    assert straggler.cause == "data_loading"
    # per step, rank 1's own time over rank 0's (which waited 300 µs): 2000/1700 in five steps and
    # 1500/1200 in the last (it ends with its host range); the 95 % t-interval for n = 6 uses t = 2.57
    ratios = [2000 / 1700] * 5 + [1500 / 1200]
    mean = sum(ratios) / 6
    half = 2.57 * (sum((x - mean) ** 2 for x in ratios) / 5) ** 0.5 / 6 ** 0.5
    assert straggler.score_low == pytest.approx(mean - half)
    assert straggler.score_high == pytest.approx(mean + half)
    assert mean - half > 1.0
    assert job.communication.straggler_wait_s == pytest.approx(1800 * US)
    assert job.ranks_found == [0, 1]
    assert job.missing_ranks == []
    rec = next(r for r in report.recommendations if r.id == "straggler_rank_1")
    assert rec.cause == "straggler_wait"
    # bringing rank 1 to rank 0's own step time saves the 300 µs rank 0 waited
    assert rec.gain.step_s_saved == pytest.approx(300 * US)
    # it is the same idle as rank 1's data wait: one carries the gain, the other is its alternative
    loader = next(r for r in report.recommendations if r.id == "dataloader_workers")
    assert loader.gain.step_s_saved == pytest.approx(300 * US)
    assert rec.alternative_to == "dataloader_workers"
    # together with fp32 GEMMs 1.5-2x faster (490 µs busy on both ranks: a third to a half of it goes)
    # and a quarter to half of the exposed 300 µs all-reduce compressed away; the nominal is the middle
    c = report.combined
    assert c is not None
    low, high = (300 + 490 / 3 + 300 / 4) * US, (300 + 490 / 2 + 300 / 2) * US
    nominal = (300 + 490 * (1 / 3 + 1 / 2) / 2 + 300 * (1 / 4 + 1 / 2) / 2) * US
    assert (c.step_s_saved_low, c.step_s_saved, c.step_s_saved_high) == pytest.approx((low, nominal, high))


@pytest.mark.parametrize(("nelems", "compress"), [(262144, True), (16384, False)])
def test_compression_only_for_bandwidth_bound_all_reduces(tmp_path: Path, nelems: int, compress: bool) -> None:
    # 1 MiB per all-reduce is past the latency-bound range: halving the bytes halves the exposed time;
    # 64 KiB is latency-bound, and compressing it would save next to nothing
    report = two_ranks(tmp_path, late_by=0, steps=6, nelems=nelems)
    ids = [r.id for r in report.recommendations]
    assert ("comm_compression" in ids) is compress
    if compress:
        rec = next(r for r in report.recommendations if r.id == "comm_compression")
        assert rec.evidence["mean_message_mib"] == pytest.approx(nelems * 4 / 2**20)
        g = rec.gain
        assert (g.step_s_saved_low, g.step_s_saved_high) == pytest.approx((300 / 4 * US, 300 / 2 * US))
        assert g.basis == "modelled"


def test_too_few_steps_to_name_a_straggler(tmp_path: Path) -> None:
    report = two_ranks(tmp_path, steps=2)
    assert report.job is not None
    assert report.job.stragglers == []
    assert any("too few steps to name a straggler" in n for n in report.job.notes)


def test_bandwidth_from_message_size(tmp_path: Path) -> None:
    report = two_ranks(tmp_path)
    (ar,) = [c for c in report.ranks[1].communication.collectives if c.collective == "all_reduce"]
    assert ar.count == 2
    assert ar.bytes == 2 * 262144 * 4
    # rank 1 (no waiting): 1 MiB in 300 µs per collective
    assert ar.algbw_gbps == pytest.approx((1 << 20) / 300e3)
    assert ar.busbw_gbps == pytest.approx(ar.algbw_gbps * 2 * (2 - 1) / 2)


def test_no_straggler_when_ranks_are_even(tmp_path: Path) -> None:
    report = two_ranks(tmp_path, late_by=0)
    assert report.job is not None
    assert report.job.stragglers == []
    assert report.job.communication.straggler_wait_s == 0
    assert not [r for r in report.recommendations if r.cause == "straggler_wait"]


def test_duplicate_rank_is_reported(tmp_path: Path) -> None:
    two_ranks(tmp_path)
    shutil.copy(tmp_path / "rank1.json.gz", tmp_path / "rank1-copy.json.gz")
    report = analyze([tmp_path], workers=1)
    assert report.job is not None
    assert report.job.duplicate_ranks == [1]
    assert [r.rank for r in report.ranks] == [0, 1]


def test_bus_factors_match_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("reduce", 8) == 1.0


def test_real_rank_pair(tmp_path: Path) -> None:
    for r in (0, 1):
        shutil.copy(DATA / f"trace_filter__sampled_rank-{r}.json.gz", tmp_path)
    report = analyze([tmp_path], workers=2)
    job = report.job
    assert job is not None
    assert job.world_size == 128
    assert job.ranks_found == [0, 1]
    assert len(job.missing_ranks) == 126
    assert any("2 of 128" in n for n in job.notes)
    for r in report.ranks:
        d = r.primary()
        assert d.busy_s + sum(d.idle_by_cause_s.values()) == pytest.approx(d.window_s, abs=1e-9)
    # two steps shared by the ranks: their waits are arrival skew, kept as communication, not a straggler's
    assert len(job.steps) < 5
    assert job.communication.straggler_wait_s == 0.0
    assert any("too few steps to name a straggler" in n and "stay communication" in n for n in job.notes)


def test_per_step_job_view(tmp_path: Path) -> None:
    report = two_ranks(tmp_path, steps=3)
    assert report.job is not None
    steps = report.job.steps
    assert [s.step for s in steps] == [1, 2, 3]
    for s in steps:
        assert s.last_rank == 1
        assert s.lateness_s == pytest.approx(300 * US)
        assert s.skew == pytest.approx(1.0)


def test_sixteen_rank_job_rank0_collectives() -> None:
    (rank,) = analyze([DATA / "negative_queue_length_values_check__rank0.json.gz"]).ranks
    assert rank.world_size == 16
    kinds = {c.collective for c in rank.communication.collectives}
    assert {"all_reduce", "all_gather", "all_to_all"} <= kinds  # every kernel here is ncclKernel_SendRecv
    c = rank.communication
    assert 0 <= c.exposed_s <= c.comm_s
    assert c.overlap_ratio is not None
    assert c.overlap_ratio_with_copies is not None
    assert c.exposed_s == pytest.approx(c.comm_s * (1 - c.overlap_ratio_with_copies), abs=1e-9)
    assert c.overlap_ratio <= c.overlap_ratio_with_copies
    for stat in c.collectives:
        if stat.algbw_gbps is not None:
            assert stat.bytes > 0
            assert stat.size_bucket != "unknown"


def test_overlap_ratio_is_htas_kernel_only() -> None:
    import reference as ref

    path = DATA / "nccl_parser_config__nccl_data.json.gz"
    t = ref.parse(path)
    lo, hi = ref.window(t)
    comm_ns = kernel_overlap = 0
    for dev in {o.device for o in t.device_ops}:
        comm = [(o.start, o.end) for o in t.device_ops if o.device == dev and ref.COLLECTIVE.search(o.name)]
        kernels = [(o.start, o.end) for o in t.device_ops
                   if o.device == dev and o.cat.lower() == "kernel" and not ref.COLLECTIVE.search(o.name)]
        c, k = ref.union_length(comm, lo, hi), ref.union_length(kernels, lo, hi)
        comm_ns += c
        kernel_overlap += c + k - ref.union_length(comm + kernels, lo, hi)
    (rank,) = analyze([path]).ranks
    c = rank.communication
    assert c.overlap_ratio == pytest.approx(kernel_overlap / comm_ns)
    # with copies and sets counted as compute it is the complement of the exposed share
    assert c.overlap_ratio_with_copies is not None
    assert c.exposed_s == pytest.approx(c.comm_s * (1 - c.overlap_ratio_with_copies), abs=1e-9)
    assert c.overlap_ratio <= c.overlap_ratio_with_copies


def test_runs_of_the_same_rank_keep_the_newest_with_one_line(tmp_path: Path) -> None:
    """A log folder keeping every run of one worker (tensorboard_trace_handler names them by time): the run
    analysed is the newest by its trace's own clock, whatever the names' order; one warning says so."""
    doc = json.loads(gzip.decompress((DATA / "trace_compare__base__base.json.gz").read_bytes()))
    shifts = {"worker0.b.pt.trace.json": 3_000_000, "worker0.c.pt.trace.json": 1_000_000,
              "worker0.a.pt.trace.json": 9_000_000, "worker0.d.pt.trace.json": 5_000_000}
    for name, shift in shifts.items():
        moved = [dict(e, ts=e["ts"] + shift) if isinstance(e.get("ts"), int | float) else e
                 for e in doc["traceEvents"]]
        (tmp_path / name).write_text(json.dumps(dict(doc, traceEvents=moved)))
    said: list[str] = []
    report = analyze([tmp_path], workers=1, warn=said.append)
    (rank,) = report.ranks
    assert rank.path == str(tmp_path / "worker0.a.pt.trace.json")
    (line,) = said
    assert "is in 4 files" in line
    assert "worker0.a.pt.trace.json" in line
    assert "other 3 left out" in line


def test_the_rows_add_up_to_the_exposed_time_and_gains_start_from_a_printed_step() -> None:
    """The job's exposed collective time is what its role rows add up to, per rank and over the ranks; a rank's
    gain starts from the own step the rank table prints (its step less straggler_wait)."""
    report = analyze([DATA / "trace_filter__sampled_rank-0.json.gz", DATA / "trace_filter__sampled_rank-1.json.gz"])
    assert report.job is not None
    c = report.job.communication
    assert sum(r.exposed_s for r in c.roles) == pytest.approx(c.collective_exposed_s, rel=1e-9)
    assert c.collective_exposed_s == pytest.approx(sum(r.communication.exposed_s for r in report.ranks), rel=1e-9)
    for r in report.ranks:
        assert sum(x.exposed_s for x in r.communication.roles) == pytest.approx(r.communication.exposed_s, rel=1e-6)
    own = {row.rank: row.own_step_s for row in report.job.rank_table}
    for row, r in zip(report.job.rank_table, report.ranks, strict=True):
        steady = [s for s in r.steps if s.excluded is None]
        assert row.own_step_s == pytest.approx(
            sum(s.dur_s - s.idle_by_cause_s["straggler_wait"] for s in steady) / len(steady), rel=1e-9)
    rank_scoped = [x for x in report.recommendations if x.gain.scope == "rank" and x.gain.step_s_before is not None]
    assert rank_scoped
    for x in rank_scoped:
        assert x.rank is not None
        assert x.gain.step_s_before == pytest.approx(own[x.rank], rel=1e-6), x.id


def test_the_geometric_interval_leaves_out_steps_without_a_finite_log_ratio() -> None:
    """A step whose own time is zero (or whose fastest peer's is) has no finite log-ratio: it is left out, with
    no warning, and the interval is that of the other steps."""
    import warnings

    from gpuidle.analysis.ranks import score_interval

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = score_interval(np.array([0.0, 1.2, 1.3, 1.25, np.inf]), geometric=True)
        assert (low, high) == pytest.approx(score_interval(np.array([1.2, 1.3, 1.25]), geometric=True))
        assert score_interval(np.array([0.0]), geometric=True) == (1.0, 1.0)
