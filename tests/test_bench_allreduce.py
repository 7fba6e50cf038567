"""``bench allreduce`` for real: 2 gloo ranks on the CPU, small sizes; the bus factors by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
import torch.distributed as dist

from gpuidle import api
from gpuidle.analysis.comm import bus_factor
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.model import CollectiveStat, duration
from gpuidle.probes import allreduce as ar
from gpuidle.probes import training
from gpuidle.probes.ranks import RankContext, resolve_device, run_on_ranks
from gpuidle.report.bench import render
from gpuidle.report.common import ms

EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
SMALL = ar.AllReduceConfig(max_bytes=4096, warmup=1, iters=2)
FACTOR_2 = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0, "all_to_all": 0.5}


@pytest.fixture(scope="module")
def result() -> ar.AllReduceResult:
    r = ar.run_allreduce(SMALL, nproc=2, device="cpu")
    assert r is not None
    return r


@pytest.mark.parametrize(("collective", "n", "expected"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75), ("all_reduce", 16, 1.875),
    ("all_gather", 2, 0.5), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75), ("reduce_scatter", 16, 0.9375),
    ("all_to_all", 8, 0.875), ("broadcast", 8, 1.0), ("broadcast", 1, 1.0),
])
def test_bus_factors_by_hand(collective: str, n: int, expected: float) -> None:
    assert bus_factor(collective, n) == expected


def test_sizes_double_from_min_to_max() -> None:
    assert ar.message_sizes(8, 64) == [8, 16, 32, 64]
    assert ar.message_sizes(8, 100) == [8, 16, 32, 64]
    assert ar.message_sizes(8, 1 << 30)[-1] == 1 << 30
    with pytest.raises(GpuidleError):
        ar.message_sizes(64, 8)


def test_split_operations_get_a_multiple_of_the_ranks() -> None:
    assert ar.element_count("all_reduce", 8, 4, 8) == 2
    assert ar.element_count("all_gather", 8, 4, 8) == 8      # 2 elements rounded up to one per rank
    assert ar.element_count("reduce_scatter", 100, 4, 8) == 24  # 25 rounded down to a multiple of 8
    assert ar.element_count("all_to_all", 4096, 4, 2) == 1024


def test_every_operation_measured_on_two_ranks(result: ar.AllReduceResult) -> None:
    assert result.schema == "gpuidle.bench.allreduce/1"
    assert (result.backend, result.device, result.world_size, result.nodes) == ("gloo", "cpu", 2, 1)
    assert [s.op for s in result.summaries] == list(ar.OPS)
    for op in ar.OPS:
        rows = [r for r in result.rows if r.op == op]
        assert [r.bytes for r in rows] == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
        for r in rows:
            assert r.error is None
            assert r.iters == 2
            assert r.count * 4 == r.bytes
            assert r.time_us is not None
            assert r.time_us > 0


def test_bandwidths_follow_the_definitions(result: ar.AllReduceResult) -> None:
    for r in result.rows:
        assert r.time_us is not None
        assert r.algbw_gbps is not None
        assert r.busbw_gbps is not None
        assert r.algbw_gbps == pytest.approx(r.bytes / (r.time_us * 1e-6) / 1e9, rel=1e-9)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * FACTOR_2[r.op], rel=1e-12)
    for s in result.summaries:
        assert s.bus_factor == FACTOR_2[s.op]
        rows = [r for r in result.rows if r.op == s.op]
        assert s.peak_busbw_gbps == max(r.busbw_gbps or 0.0 for r in rows)
        small = sorted(r.time_us or 0.0 for r in rows if r.bytes <= 1024)
        assert s.latency_us == pytest.approx((small[3] + small[4]) / 2)  # median of 8 sizes, 8 B .. 1 KiB
        assert s.latency_bytes == 1024


def test_runs_median_and_spread(result: ar.AllReduceResult) -> None:
    assert result.runs == SMALL.runs
    for r in result.rows:
        runs = r.runs_us
        first = runs[:SMALL.runs]
        # as many runs again exactly when the first ones disagree
        again = np.percentile(first, 90) / min(first) > ar.DISAGREE
        assert len(runs) == (2 if again else 1) * SMALL.runs
        assert r.time_us == pytest.approx(float(np.median(runs)))
        assert r.time_min_us == pytest.approx(min(runs))
        assert r.time_p90_us == pytest.approx(float(np.percentile(runs, 90)))
    for x in result.summaries:
        pooled = [t for r in result.rows if r.op == x.op and r.bytes <= 1024 for t in r.runs_us]
        assert x.latency_min_us == pytest.approx(min(pooled))
        assert x.latency_p90_us == pytest.approx(float(np.percentile(pooled, 90)))
        unsteady = any(n.startswith(f"{x.op} small-message latency varies") for n in result.notes)
        assert unsteady == (float(np.percentile(pooled, 90)) / min(pooled) > 2.0)


def test_standalone_ranks_get_torchruns_thread_count(result: ar.AllReduceResult) -> None:
    assert result.threads_per_rank == int(os.environ.get("OMP_NUM_THREADS", "1"))


def _scripted(times: list[float]) -> object:
    it = iter(times)

    def timed_run(ctx: RankContext, run: object, iters: int) -> float:
        return next(it)

    return timed_run


def test_runs_that_disagree_are_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    # forked ranks inherit the scripted timer: both see the same times, as after the real agree()
    steady = [1e-3, 1.1e-3, 1.05e-3, 0.98e-3, 1.02e-3]
    bimodal = [40e-6, 35e-6, 1.5e-3, 38e-6, 1.6e-3]
    then = [36e-6, 37e-6, 1.4e-3, 39e-6, 41e-6]
    monkeypatch.setattr(ar, "_timed_run", _scripted(steady + bimodal + then))
    cfg = ar.AllReduceConfig(ops=("all_reduce",), min_bytes=8, max_bytes=16, warmup=1, iters=1, runs=5)
    r = ar.run_allreduce(cfg, nproc=2, device="cpu", start_method="fork")
    assert r is not None
    a, b = r.rows
    assert [t * 1e-6 for t in a.runs_us] == pytest.approx(steady)
    assert [t * 1e-6 for t in b.runs_us] == pytest.approx(bimodal + then)
    assert b.time_us == pytest.approx(float(np.median(bimodal + then)) * 1e6)
    assert b.time_min_us == pytest.approx(35.0)
    (x,) = r.summaries
    assert x.latency_us == pytest.approx(float(np.median([a.time_us or 0.0, b.time_us or 0.0])))
    assert x.latency_min_us == pytest.approx(35.0)
    text = render(r)
    assert "all_reduce small-message latency varies between runs: fastest 35.0 µs" in text
    assert "e+" not in text
    assert ar.spread(bimodal) == pytest.approx(float(np.percentile(bimodal, 90)) / 35e-6)
    assert ar.spread(bimodal) > ar.DISAGREE > ar.spread(steady)


def test_one_duration_format() -> None:
    assert duration(1.52e-3) == "1.52 ms"
    assert duration(35e-6) == "35.0 µs"
    assert duration(0.4489) == "448.9 ms"
    assert duration(4.489) == "4,489.0 ms"
    assert ms is duration


def test_checks_against_the_guide(result: ar.AllReduceResult) -> None:
    lat, bw = result.checks
    assert (lat.name, lat.threshold, lat.unit) == ("small-message latency", 1e-3, "s")
    assert (bw.name, bw.threshold, bw.unit) == ("bus bandwidth", 1.25, "GB/s")
    assert lat.ok == (lat.value is not None and lat.value < 1e-3)
    assert bw.ok == (bw.value is not None and bw.value > 1.25)


def test_json_round_trip_and_table(result: ar.AllReduceResult) -> None:
    text = render(result, fmt="json")
    assert json.loads(text)["schema"] == "gpuidle.bench.allreduce/1"
    assert msgspec.json.decode(text, type=ar.AllReduceResult) == result
    table = render(result)
    for header in ("size (B)", "count", "type", "redop", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        assert header in table
    assert "small-message latency" in table


def test_an_operation_the_backend_lacks_is_a_row_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")

    # the ranks are forked from this process, so they inherit the patch
    monkeypatch.setattr(dist, "reduce_scatter_single", refuse, raising=False)
    monkeypatch.setattr(dist, "reduce_scatter_tensor", refuse)
    cfg = ar.AllReduceConfig(ops=("reduce_scatter", "all_reduce"), max_bytes=64, warmup=1, iters=1)
    r = ar.run_allreduce(cfg, nproc=2, device="cpu", start_method="fork")
    assert r is not None
    rs = [x for x in r.rows if x.op == "reduce_scatter"]
    assert len(rs) == 1
    assert rs[0].error == "not supported by backend gloo"
    assert r.summaries[0].supported is False
    assert all(x.error is None for x in r.rows if x.op == "all_reduce")
    assert "not supported by backend gloo" in render(r)


def _stat(collective: str, count: int, nbytes: int, busbw: float | None) -> CollectiveStat:
    return CollectiveStat(collective=collective, process_group="0", size_bucket="", count=count, total_s=0.1,
                          bytes=nbytes, algbw_gbps=busbw, busbw_gbps=busbw)


def _bench(rows: list[ar.SizeRow], world: int = 2, backend: str = "gloo") -> ar.AllReduceResult:
    return ar.AllReduceResult(backend=backend, device="cpu", device_name=None, torch_version="x", world_size=world,
                              nodes=1, local_world_size=world, dtype="float32", warmup=1, iters=1,
                              max_bytes=max(r.bytes for r in rows), rows=rows, summaries=[], checks=[])


def test_compare_interpolates_over_log_size() -> None:
    rows = [ar.SizeRow("all_reduce", 1 << 20, 1 << 18, 5, 1000.0, 2.0, 2.0),
            ar.SizeRow("all_reduce", 4 << 20, 1 << 20, 5, 1000.0, 4.0, 4.0)]
    stats = [
        _stat("all_reduce", 10, 10 * (2 << 20), 1.2),   # mean 2 MiB: halfway between 1 and 4 MiB in log2
        _stat("all_reduce", 1, 64 << 20, 5.5),          # above, but time does not grow: the nearest figure
        _stat("broadcast", 3, 3000, 1.0),
        _stat("all_gather", 3, 0, None),                # no size recorded: skipped
    ]
    cmp = training.compare_with_training(_bench(rows), stats)
    assert [c.collective for c in cmp] == ["all_reduce", "all_reduce", "broadcast"]
    assert cmp[0].mean_bytes == 2 << 20
    assert cmp[0].bench_busbw_gbps == pytest.approx(3.0)
    assert cmp[0].ratio == pytest.approx(0.4)
    assert cmp[0].basis == "measured"
    assert cmp[0].size_ratio is None
    assert "well below" in cmp[0].note
    assert cmp[1].bench_busbw_gbps == pytest.approx(4.0)
    assert cmp[1].basis == "nearest"
    assert cmp[1].size_ratio == pytest.approx(16.0)
    assert "64 MiB is 16.0× the largest size measured (4 MiB)" in cmp[1].note
    assert "--max-bytes 64M" in cmp[1].note
    assert cmp[2].bench_busbw_gbps is None
    assert cmp[2].basis == "none"
    assert "not measured" in cmp[2].note


def _model_rows(op: str, world: int, latency_s: float, gbps: float, sizes: list[int]) -> list[ar.SizeRow]:
    """Rows timed exactly by ``time = latency + bytes / bandwidth``."""
    out = []
    for n in sizes:
        t = latency_s + n / (gbps * 1e9)
        algbw = n / t / 1e9
        out.append(ar.SizeRow(op, n, n // 4, 5, t * 1e6, algbw, algbw * bus_factor(op, world)))
    return out


def test_compare_extrapolates_with_the_latency_bandwidth_fit() -> None:
    # the largest four sizes follow 200 µs + bytes / 1.5 GB/s; the small ones are noise the fit must ignore
    rows = [ar.SizeRow("all_reduce", 8, 2, 5, 90.0, 8 / 90e-6 / 1e9, 8 / 90e-6 / 1e9)]
    rows += _model_rows("all_reduce", 2, 200e-6, 1.5, [1 << 20, 2 << 20, 4 << 20, 8 << 20])
    mean = int(74.9 * (1 << 20))  # 9.4× the 8 MiB measured
    cmp, = training.compare_with_training(_bench(rows), [_stat("all_reduce", 2, 2 * mean, 0.9)])
    t = 200e-6 + mean / 1.5e9
    expected = mean / t / 1e9 * 1.0  # bus factor 1 for two ranks
    assert cmp.basis == "extrapolated"
    assert cmp.bench_busbw_gbps == pytest.approx(expected, rel=1e-6)
    assert cmp.ratio == pytest.approx(0.9 / expected, rel=1e-6)
    assert cmp.size_ratio == pytest.approx(mean / (8 << 20))
    assert f"{mean / (8 << 20):.1f}× the largest size measured (8 MiB)" in cmp.note
    assert "time = 200.0 µs + bytes / 1.5 GB/s, fitted on the 4 largest sizes" in cmp.note
    assert "--max-bytes 128M" in cmp.note
    fit = training.fit_time(rows, "all_reduce", above=True)
    assert fit is not None
    assert fit.latency_s == pytest.approx(200e-6, rel=1e-6)
    assert fit.bandwidth_gbps == pytest.approx(1.5, rel=1e-6)


def test_compare_below_the_sizes_measured() -> None:
    rows = _model_rows("broadcast", 4, 50e-6, 2.0, [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20])
    cmp, = training.compare_with_training(_bench(rows, world=4), [_stat("broadcast", 3, 3 * 4096, 0.05)])
    t = 50e-6 + 4096 / 2e9
    assert cmp.basis == "extrapolated"
    assert cmp.bench_busbw_gbps == pytest.approx(4096 / t / 1e9, rel=1e-6)
    assert cmp.size_ratio == pytest.approx(16.0)
    assert "16.0× under the smallest size measured (64 KiB)" in cmp.note
    assert "4 smallest sizes" in cmp.note
    assert "--min-bytes 4096" in cmp.note


def test_size_arg_is_the_next_power_of_two() -> None:
    assert training.size_arg(int(74.9 * (1 << 20))) == "128M"
    assert training.size_arg(64 << 20) == "64M"
    assert training.size_arg(3 << 30) == "4G"
    assert training.size_arg(1000) == "1K"
    assert training.size_arg(100) == "128"


def test_a_benchmark_unlike_the_training_is_flagged() -> None:
    rows = _model_rows("all_reduce", 2, 100e-6, 1.0, [1 << 20, 2 << 20])
    sixteen = api.analyze([str(Path(__file__).parent / "data" / "negative_queue_length_values_check__rank0.json.gz")])
    assert sixteen.ranks[0].world_size == 16
    flags = training.setup_mismatches(_bench(rows), sixteen)
    assert any(f.startswith("the training ran 16 ranks, this benchmark 2") for f in flags)
    ddp = api.analyze([str(EXAMPLE)])
    assert ddp.ranks[0].backend == "nccl"  # the trace's distributedInfo
    flags = training.setup_mismatches(_bench(rows), ddp)
    assert not any("ranks, this benchmark" in f for f in flags)  # 2 ranks each
    assert any(f.startswith("the training used nccl, this benchmark gloo on the cpu") for f in flags)
    assert training.setup_mismatches(_bench(rows, backend="nccl"), ddp) == []
    out = training.with_comparison(_bench(rows), ddp)
    assert out.mismatches == flags
    assert "warning: the training used nccl" in render(out)


def test_compare_with_a_trace_report(result: ar.AllReduceResult) -> None:
    report = api.analyze([str(EXAMPLE)])
    out = training.with_comparison(result, report)
    assert {c.collective for c in out.comparison} == {"all_reduce", "broadcast"}
    assert all(c.bench_busbw_gbps is not None for c in out.comparison)
    assert any("rank 0 view" in n for n in out.notes)
    assert "training collectives vs this benchmark" in render(out)


def test_cli_standalone_with_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    assert main(["analyze", str(EXAMPLE), "--json", "--out", str(report)]) == 0
    rc = main(["bench", "allreduce", "--nproc", "2", "--device", "cpu", "--max-bytes", "64", "--warmup", "1",
               "--iters", "2", "--ops", "all_reduce,broadcast", "--compare", str(report), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 2
    assert [r["bytes"] for r in out["rows"] if r["op"] == "all_reduce"] == [8, 16, 32, 64]
    assert out["comparison"]


def test_under_torchrun_rank_zero_prints_once() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "gpuidle",
         "bench", "allreduce", "--device", "cpu", "--max-bytes", "32", "--warmup", "1", "--iters", "2",
         "--ops", "all_reduce", "--json"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # one document: the other rank printed nothing
    assert out["world_size"] == 2
    assert out["local_world_size"] == 2
    assert out["threads_per_rank"] == int(os.environ.get("OMP_NUM_THREADS", "1"))  # torchrun's default is 1
    assert [r["bytes"] for r in out["rows"]] == [8, 16, 32]


def _fails(ctx: RankContext, config: None, progress: object) -> None:
    raise GpuidleError(f"boom on rank {ctx.rank}")


def test_a_failing_rank_is_one_error() -> None:
    with pytest.raises(GpuidleError, match="boom on rank"):
        run_on_ranks(_fails, None, nproc=2, device="cpu")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nproc": 1}, "measures no communication"),
])
def test_usage_errors(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(GpuidleError, match=message):
        ar.run_allreduce(SMALL, device="cpu", **kwargs)


def test_bad_config() -> None:
    with pytest.raises(GpuidleError, match="unknown operation"):
        ar.run_allreduce(ar.AllReduceConfig(ops=("all_reduce", "gossip")), nproc=2, device="cpu")
    with pytest.raises(GpuidleError, match="unknown dtype"):
        ar.run_allreduce(ar.AllReduceConfig(dtype="int7"), nproc=2, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_but_absent() -> None:
    with pytest.raises(GpuidleError, match="no CUDA device"):
        resolve_device("cuda")
