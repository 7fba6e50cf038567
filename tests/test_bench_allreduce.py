"""``bench allreduce`` for real: 2 gloo ranks on the CPU, small sizes; the bus factors by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch
import torch.distributed as dist

from gpuidle import api
from gpuidle.analysis.comm import bus_factor
from gpuidle.bench import allreduce as ar
from gpuidle.bench.ranks import RankContext, resolve_device, run_on_ranks
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.model import CollectiveStat
from gpuidle.report.bench import render

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


def test_compare_interpolates_over_log_size() -> None:
    rows = [ar.SizeRow("all_reduce", 1 << 20, 1 << 18, 5, 1.0, 2.0, 2.0),
            ar.SizeRow("all_reduce", 4 << 20, 1 << 20, 5, 1.0, 4.0, 4.0)]
    result = ar.AllReduceResult(backend="gloo", device="cpu", device_name=None, torch_version="x", world_size=2,
                                nodes=1, local_world_size=2, dtype="float32", warmup=1, iters=1, max_bytes=4 << 20,
                                rows=rows, summaries=[], checks=[])
    stats = [
        _stat("all_reduce", 10, 10 * (2 << 20), 1.2),   # mean 2 MiB: halfway between 1 and 4 MiB in log2
        _stat("all_reduce", 1, 64 << 20, 5.5),          # above the range: clamped to the 4 MiB figure
        _stat("broadcast", 3, 3000, 1.0),
        _stat("all_gather", 3, 0, None),                # no size recorded: skipped
    ]
    cmp = ar.compare_with_training(result, stats)
    assert [c.collective for c in cmp] == ["all_reduce", "all_reduce", "broadcast"]
    assert cmp[0].mean_bytes == 2 << 20
    assert cmp[0].bench_busbw_gbps == pytest.approx(3.0)
    assert cmp[0].ratio == pytest.approx(0.4)
    assert "well below" in cmp[0].note
    assert cmp[1].bench_busbw_gbps == pytest.approx(4.0)
    assert "outside the sizes measured" in cmp[1].note
    assert cmp[2].bench_busbw_gbps is None
    assert "not measured" in cmp[2].note


def test_compare_with_a_trace_report(result: ar.AllReduceResult) -> None:
    report = api.analyze([str(EXAMPLE)])
    out = ar.with_comparison(result, report)
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
