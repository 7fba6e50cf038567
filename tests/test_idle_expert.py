"""The causes an expert signs: launches bounded by what launching costs, annotations never launch, start-up
apart, communication gains from the bytes and dtypes on the wire, hardware and mode read from the trace.

Each pattern is a hand-built trace with its figures worked out by hand in the comments."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from gpuidle.api import analyze
from gpuidle.model import AnalysisReport, RankReport
from minitrace import Trace

US = 1e-6
ALLREDUCE_BF16 = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ALLREDUCE_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ALLTOALL_I8 = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
BACKWARD = "autograd::engine::evaluate_function: MmBackward0"
"""An autograd op: what makes a hand-built trace a training step (gradient fixes apply only there)."""


def run(t: Trace, tmp_path: Path, props: list[dict[str, Any]] | None = None) -> AnalysisReport:
    doc = t.to_dict()
    if props is not None:
        doc["deviceProperties"] = props
        if not props:
            del doc["deviceProperties"]
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return analyze([path])


def causes_us(rank: RankReport) -> dict[str, float]:
    return {k: round(v / US, 3) for k, v in rank.primary().idle_by_cause_s.items() if v}


def ids(report: AnalysisReport) -> list[str]:
    return [r.id for r in report.recommendations]


def test_a_kernel_behind_a_blocking_copy_waits_on_the_copy_not_its_launch(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 500_000)
    t.launch(at=0, call_dur=5, start=5, dur=95)                     # busy [5, 100)
    t.launch(at=100, call_dur=8, start=463_010, dur=30_000)         # issued at 100, starts at 463,010
    t.launch(at=110, call_dur=462_895, start=462_990, dur=10, name="Memcpy DtoH (Device -> Pinned)",
             kind="gpu_memcpy", call="cudaMemcpyAsync", bytes=256)  # the host blocks in it until 463,005
    r = run(t, tmp_path)
    # [0,5) first launch in flight; [100,108) the second launch call; [108,110) nothing; the copy ends the
    # gap: a blocking call enqueues at once, so its launch is [110,160), call start plus 50 µs of queue; the
    # rest, [160,462,990) and [463,000,463,005), is the host blocked in the 256-byte copy; [463,005,463,010)
    # and [493,010,500,000) nothing recorded. Unbounded, all of [100,462,990) was launch latency.
    assert causes_us(r.ranks[0]) == {"launch_overhead": 5 + 8 + 50, "host_sync": 462_990 - 160 + 5,
                                     "unattributed": 2 + 5 + 6_990}
    assert "cuda_graphs" not in ids(r)
    # one step, one blocking call: the sync is named, but no per-step gain is taken from a single event
    sync = next(x for x in r.recommendations if x.id == "remove_host_sync")
    assert sync.gain.step_s_saved is None
    assert "one step in the window" in (sync.gain.reason or "")


def test_annotations_and_compiled_regions_never_launch(tmp_path: Path) -> None:
    t = Trace()
    t.x("Operator", "ProfilerStep#1", 0, 1000)                      # an old trace files the step as an operator
    t.op("Torch-Compiled Region: 0/0", 0, 1000)
    t.annotation("Optimizer.zero_grad#SGD.zero_grad", 300, 400)
    t.launch(at=0, call_dur=10, start=10, dur=190)                  # busy [10, 200)
    t.launch(at=890, call_dur=10, start=900, dur=100)               # busy [900, 1000)
    r = run(t, tmp_path)
    # [0,10) and [890,900) in flight; [200,890) only annotations and the compiled region cover the
    # host: nothing there launches, so the trace cannot say (this was launch_overhead: the regions
    # "contain" launches)
    assert causes_us(r.ranks[0]) == {"launch_overhead": 20, "unattributed": 690}


def test_zero_grad_fills_get_set_to_none(tmp_path: Path) -> None:
    t = Trace()
    for n, base in enumerate((0, 2000, 4000), start=1):
        t.step(n, base, 2000)
        t.launch(at=base, call_dur=10, start=base + 10, dur=990)   # the step's compute, busy to base + 1000
        t.annotation("Optimizer.zero_grad#AdamW.zero_grad", base + 1000, 1000)
        for i in range(10):                                         # a fill per parameter, 100 µs apart
            at = base + 1000 + 100 * i
            t.op("aten::zero_", at, 60)
            t.launch(at=at + 20, call_dur=10, start=at + 95, dur=5, name="void at::native::fill_kernel")
    r = run(t, tmp_path)
    rank = r.ranks[0]
    # per step: [1000,1020) in the zero_ op, [1020,1080) call + queue, [1080,1095) between ops (nothing), per
    # fill; the op covers [at, at+60), the launch reaches at+20+10+50 = at+80: 80 µs launch, 15 µs not
    for s in rank.steps:
        assert s.zero_grad_launch_s == pytest.approx(10 * 80 * US)
        # and the 15 µs between ops, the host's loop over the parameters: set_to_none removes it too
        assert s.zero_grad_s == pytest.approx({"launch_overhead": 10 * 80 * US, "unattributed": 10 * 15 * US})
    rec = next(x for x in r.recommendations if x.id == "zero_grad_set_to_none")
    assert "zero_grad(set_to_none=True)" in rec.fix
    assert rec.gain.step_s_saved == pytest.approx(10 * 95 * US)
    # the CUDA-graph fix is not credited with the same idle: only 10 µs/step of launching is left
    assert "cuda_graphs" not in ids(r)


def test_first_launch_and_context_creation_are_start_up(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 6_000_000)
    t.runtime("cudaFree", 0, 6_000_000)                             # context creation
    t.step(2, 6_000_000, 10_000)
    t.launch(at=6_000_000, call_dur=6_500, start=6_006_510, dur=990)  # first launch: module loading
    t.launch(at=6_007_500, call_dur=5, start=6_007_510, dur=2_490)
    for n in (3, 4, 5):
        base = 6_010_000 + (n - 3) * 10_000
        t.step(n, base, 10_000)
        t.launch(at=base, call_dur=5, start=base + 10, dur=3_490)
        t.launch(at=base + 3_500, call_dur=5, start=base + 3_510, dur=6_490)
    r = run(t, tmp_path)
    rank = r.ranks[0]
    kinds = {c.kind: c for c in rank.startup}
    assert kinds["context"].name == "cudaFree"
    assert kinds["context"].idle_s == pytest.approx(6.0)
    assert kinds["module_load"].dur_s == pytest.approx(6_500 * US)
    assert kinds["module_load"].idle_s == pytest.approx(6_500 * US)
    # step 1 had no GPU work; step 2 lost its 6.5 ms of module loading: 10 ms - 6.5 ms
    assert rank.steps[0].excluded == "no_gpu_work"
    assert rank.steps[1].dur_s == pytest.approx(3_500 * US)
    assert rank.steps[1].startup_s == pytest.approx(6_500 * US)
    d = rank.primary()
    assert d.busy_s + d.idle_s == pytest.approx(d.window_s)
    assert d.window_s + d.startup_s == pytest.approx(rank.window.dur_s)
    assert not any(x.cause == "launch_overhead" for x in r.recommendations)
    assert "remove_host_sync" not in ids(r)


def _comm_step(t: Trace, base: float, kernel: str, dtype: str, collective: str, nelems: int) -> None:
    t.launch(at=base, call_dur=10, start=base + 10, dur=390)        # compute [10, 400)
    t.op(BACKWARD, base + 100, 10)                                  # a training step, while the device is busy
    t.op("record_param_comms", base + 20, 20, **{
        "Collective name": collective, "Process Group Name": "0", "In msg nelems": nelems,
        "Out msg nelems": nelems, "dtype": dtype, "Group size": 2})
    t.launch(at=base + 25, call_dur=5, start=base + 400, dur=300, stream=20, name=kernel)


def test_bf16_all_reduces_get_no_compression(tmp_path: Path) -> None:
    t = Trace(rank=0, world=2)
    for n in range(4):
        t.step(n + 1, n * 1000, 1000)
        _comm_step(t, n * 1000, ALLREDUCE_BF16, "BFloat16", "allreduce", 1 << 20)  # 2 MiB
    r = run(t, tmp_path)
    rank = r.ranks[0]
    assert rank.communication.collectives[0].dtype == "bfloat16"
    assert rank.steps[1].exposed_comm_s == {"all_reduce:bfloat16": pytest.approx(300 * US)}
    assert "comm_compression" not in ids(r)


def test_int8_all_to_all_is_not_credited_to_a_ddp_hook(tmp_path: Path) -> None:
    t = Trace(rank=0, world=2)
    for n in range(4):
        base = n * 2000
        t.step(n + 1, base, 2000)
        _comm_step(t, base, ALLREDUCE_F32, "Float", "allreduce", 1 << 20)           # 4 MiB fp32, 300 µs
        _comm_step(t, base + 1000, ALLTOALL_I8, "Byte", "all_to_all", 64 << 20)     # 64 MiB int8, 300 µs
    r = run(t, tmp_path)
    rank = r.ranks[0]
    split = rank.steps[1].exposed_comm_s
    assert split == {"all_reduce:float32": pytest.approx(300 * US), "all_to_all:uint8": pytest.approx(300 * US)}
    by = {(c.collective, c.dtype): c for c in rank.communication.collectives}
    assert by[("all_reduce", "float32")].bytes == 4 * (1 << 20) * 4   # 4 steps × 4 MiB on the wire
    assert by[("all_to_all", "uint8")].bytes == 4 * (64 << 20)
    rec = next(x for x in r.recommendations if x.id == "comm_compression")
    # bf16 halves the bytes of the 300 µs exposed fp32 all-reduce only: a quarter to half of it
    assert (rec.gain.step_s_saved_low, rec.gain.step_s_saved_high) == pytest.approx((75 * US, 150 * US))
    gains = [x.gain.step_s_saved for x in r.recommendations if x.cause == "communication"
             and x.gain.step_s_saved is not None]
    assert len(gains) == len({round(g, 9) for g in gains})    # no figure repeated across alternatives


def test_overlapping_collectives_charge_the_one_that_started_first(tmp_path: Path) -> None:
    """An int8 all-to-all from 400 µs and an fp32 all-reduce on another stream from 500 µs: where both run,
    the all-reduce waits behind the all-to-all, which gets the time (not the first name in sort order)."""
    t = Trace(rank=0, world=2)
    for n in range(4):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.launch(at=base, call_dur=10, start=base + 10, dur=390)        # compute [10, 400)
        for at, coll, dtype, nelems, start, stream, kernel in (
                (base + 20, "all_to_all", "Byte", 64 << 20, 400, 21, ALLTOALL_I8),
                (base + 40, "allreduce", "Float", 1 << 20, 500, 20, ALLREDUCE_F32)):
            t.op("record_param_comms", at, 10, **{
                "Collective name": coll, "Process Group Name": "0", "In msg nelems": nelems,
                "Out msg nelems": nelems, "dtype": dtype, "Group size": 2})
            t.launch(at=at + 5, call_dur=3, start=base + start, dur=300, stream=stream, name=kernel)
    split = run(t, tmp_path).ranks[0].steps[1].exposed_comm_s
    assert split == {"all_to_all:uint8": pytest.approx(300 * US), "all_reduce:float32": pytest.approx(100 * US)}


def test_volta_kernels_mean_tensor_cores_without_device_properties(tmp_path: Path) -> None:
    t = Trace()
    for n in range(3):
        t.step(n + 1, n * 1000, 1000)
        t.launch(at=n * 1000, call_dur=5, start=n * 1000 + 5, dur=990, name="volta_sgemm_128x64_nn")
    r = run(t, tmp_path, props=[])
    rec = next(x for x in r.recommendations if x.id == "mixed_precision")
    assert "volta" in rec.evidence["hardware"]
    assert rec.gain.step_s_saved is not None
    assert rec.confidence == "medium"
    assert "no tensor cores" not in json.dumps(rec.evidence)


def test_unknown_hardware_is_said_so(tmp_path: Path) -> None:
    t = Trace()
    for n in range(3):
        t.step(n + 1, n * 1000, 1000)
        t.launch(at=n * 1000, call_dur=5, start=n * 1000 + 5, dur=990, name="gemm_fp32_kernel")
    r = run(t, tmp_path, props=[])
    rec = next(x for x in r.recommendations if x.id == "mixed_precision")
    assert "hardware unknown: precision advice assumes a tensor-core GPU" in rec.evidence["assumption"]
    assert rec.confidence == "low"


def test_device_index_not_among_property_ids_takes_the_only_device(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=5, start=5, dur=990, device=9)
    r = run(t, tmp_path, props=[{"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4}])
    d = r.ranks[0].primary()
    assert (d.device, d.name, d.compute_capability) == (9, "AMD Instinct MI300X", "9.4")


def test_python_stacks_are_used_not_asked_for(tmp_path: Path) -> None:
    t = Trace()
    for n in range(3):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.x("python_function", "demo.py(10): postprocess", base + 300, 600)
        t.launch(at=base, call_dur=5, start=base + 5, dur=295)
        t.launch(at=base + 900, call_dur=5, start=base + 905, dur=95)
    r = run(t, tmp_path)
    rank = r.ranks[0]
    # [300,900) in Python with no operator: host work; [0,5) and [900,905) in flight
    assert causes_us(rank) == {"cpu_compute": 1800, "launch_overhead": 30}
    assert rank.python_hotspots[0].function == "demo.py(10): postprocess"
    assert rank.python_hotspots[0].idle_s == pytest.approx(1800 * US)
    assert all("with_stack=True" not in x.fix for x in r.recommendations)


def test_without_runtime_events_the_launch_bound_is_unknown(tmp_path: Path) -> None:
    t = Trace()
    for n in range(3):
        base = n * 1000
        t.step(n + 1, base, 1000)
        t.op("aten::add", base, 900)
        for k in range(9):
            t.x("kernel", "elementwise_kernel", base + 100 * k + 90, 10, pid=0, tid=7, device=0, stream=7)
    rank = run(t, tmp_path).ranks[0]
    assert rank.host_events is not None
    assert rank.host_events["runtime_calls"] == 0
    assert any("no CUDA runtime events" in n for n in rank.notes)


REAL = Path(__file__).parent / "data"


def _raw(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(gzip.decompress((REAL / name).read_bytes()))["traceEvents"]
    return events


@pytest.mark.parametrize("name", ["negative_queue_length_values_check__rank0.json.gz",
                                  "trace_filter__sampled_rank-0.json.gz", "nccl_parser_config__nccl_data.json.gz",
                                  "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
def test_launch_overhead_within_what_launching_costs_on_real_traces(name: str) -> None:
    """Independently: launching can cost no more than the launch calls themselves, 50 µs of queue for each
    kernel, and 100 µs of dispatch for each launch an operator issues."""
    rank = analyze([REAL / name]).ranks[0]
    lo, hi = rank.window.start_s, rank.window.start_s + rank.window.dur_s
    events = _raw(name)
    t0 = min(e["ts"] for e in events if "ts" in e and e.get("ph") == "X")
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "Runtime", "cuda_driver")
                and ("Launch" in e["name"] or "Memset" in e["name"] or "Memcpy" in e["name"])
                and lo <= (e["ts"] - t0) * 1e-6 < hi]
    bound = sum(e["dur"] for e in launches) * US + len(launches) * (50 + 100) * US
    charged = rank.primary().idle_by_cause_s["launch_overhead"]
    assert charged <= bound


def test_bytes_on_the_wire_on_a_real_trace() -> None:
    """trace_filter rank 0: the fp32 all-reduce bytes are the nccl:all_reduce ranges' Input Dims × 4."""
    name = "trace_filter__sampled_rank-0.json.gz"
    rank = analyze([REAL / name]).ranks[0]
    expected = 0
    for e in _raw(name):
        if e.get("name") == "nccl:all_reduce":
            dims = e["args"]["Input Dims"][0]
            assert e["args"]["Input type"][0] == "float"
            n = 1
            for d in dims:
                n *= d
            expected += n * 4
    got = sum(c.bytes for c in rank.communication.collectives if c.collective == "all_reduce")
    assert got == expected
    assert {c.dtype for c in rank.communication.collectives if c.collective == "all_reduce"} == {"float32"}


def test_a_cuda_graph_capture_is_start_up_not_a_per_step_cause(tmp_path: Path) -> None:
    """A window that is mostly a one-time capture: 300 launches recorded between ``cudaStreamBeginCapture`` and
    ``cudaStreamEndCapture`` (the device runs nothing meanwhile) and an instantiation, then three replays. The
    capture's span and the instantiation are start-up, left out of the steps; no per-step host fix is drawn from
    them."""
    t = Trace()
    t.step(0, 0, 40_000)
    t.runtime("cudaStreamBeginCapture", 100, 20)
    for i in range(300):
        t.op("aten::mm", 200 + i * 100, 90)
        t.runtime("cudaLaunchKernel", 210 + i * 100, 8)   # captured: no kernel runs
    t.runtime("cudaStreamEndCapture", 30_300, 200)
    t.runtime("cudaGraphInstantiateWithFlags", 30_600, 2_000)
    for n in (1, 2, 3):
        base = 40_000.0 + (n - 1) * 5_000
        t.step(n, base, 5_000)
        t.launch(at=base, call_dur=10, start=base + 20, dur=4_900, call="cudaGraphLaunch")
    rank = run(t, tmp_path).ranks[0]
    captures = sorted((round(c.start_s / US), round(c.dur_s / US), c.name) for c in rank.startup
                      if c.kind == "graph_capture")
    assert captures == [(100, 30_400, "CUDA graph capture (cudaStreamBeginCapture .. cudaStreamEndCapture)"),
                        (30_600, 2_000, "cudaGraphInstantiateWithFlags")]
    d = rank.primary()
    assert d.startup_s == pytest.approx((30_400 + 2_000) * US)
    # the rest of step 0 (no GPU work at all) is no steady step; the replays are
    assert rank.steps[0].excluded == "no_gpu_work"
    assert [s.excluded for s in rank.steps[1:]] == [None, None, None]
    assert "move_cpu_work" not in ids(run(t, tmp_path))


def test_a_teardown_free_is_not_start_up(tmp_path: Path) -> None:
    """A long ``cudaFree`` after the device's last work frees memory at teardown; only one that device work follows
    can be context creation."""
    t = Trace()
    for n in range(3):
        base = n * 10_000.0
        t.step(n, base, 10_000)
        t.launch(at=base, call_dur=5, start=base + 10, dur=5_000)
    t.runtime("cudaFree", 26_500, 3_000)
    rank = run(t, tmp_path).ranks[0]
    assert [c.kind for c in rank.startup] == []
    assert rank.primary().startup_s == 0.0


def test_pageable_copies_that_fill_the_step_are_sized_by_their_own_time(tmp_path: Path) -> None:
    """Half of each 6 ms step is a host-to-device copy from pageable memory with no kernel beside it: pinning
    that memory shortens the copy itself (1.5-2x faster), a modelled 1.0-1.5 ms a step, not the host's few
    microseconds of copy idle."""
    from gpuidle.advice.rules import PINNED_SPEEDUP_HIGH, PINNED_SPEEDUP_LOW

    t = Trace()
    for n in range(4):
        base = n * 6_000.0
        t.step(n, base, 6_000)
        t.launch(at=base, call_dur=10, start=base + 100, dur=3_000, kind="gpu_memcpy",
                 name="Memcpy HtoD (Pageable -> Device)", call="cudaMemcpyAsync", bytes=48 << 20)
        t.launch(at=base + 20, call_dur=10, start=base + 3_200, dur=2_000)
    report = run(t, tmp_path)
    assert report.ranks[0].kernels.pageable_copy_s == pytest.approx(4 * 3_000 * US)
    (fix,) = [r for r in report.recommendations if r.id == "pinned_memory_non_blocking"]
    assert fix.evidence["pageable_copy_ms_per_step"] == pytest.approx(3.0)
    assert fix.evidence["pageable_copy_gbps"] == pytest.approx(round((48 << 20) / 3_000_000, 2))  # bytes per ns
    # plus the copy's own launch in flight before it starts, measured: [10, 100) less the launch queue's 50 µs
    idle = fix.evidence["memcpy_ms_per_step"] * 1e-3  # type: ignore[operator]
    assert idle == pytest.approx(60 * US)
    assert fix.gain.step_s_saved_low == pytest.approx(idle + 3_000 * US * (1 - 1 / PINNED_SPEEDUP_LOW))
    assert fix.gain.step_s_saved_high == pytest.approx(idle + 3_000 * US * (1 - 1 / PINNED_SPEEDUP_HIGH))
    assert fix.gain.basis == "modelled"
    assert fix.gain.assumption is not None
    assert "pinned memory" in fix.gain.assumption


def test_host_time_inside_the_models_operators_is_not_pre_processing(tmp_path: Path) -> None:
    """An inference forward whose GPU waits while the host is inside the model's own operator (``aten::to``
    launching nothing for 1.3 ms a step): the fix says so and compiles or graphs the forward; it never tells a
    server to move pre- and post-processing off its thread."""
    t = Trace()
    for n, base in enumerate((0, 2000, 4000, 6000), start=1):
        t.step(n, base, 2000)
        t.launch(at=base, call_dur=10, start=base + 10, dur=490)
        t.op("aten::to", base + 500, 1300)
        t.launch(at=base + 1800, call_dur=10, start=base + 1810, dur=190)
    r = run(t, tmp_path)
    rec = next(x for x in r.recommendations if x.id == "move_cpu_work")
    assert rec.evidence["model_operators_at_idle"] == ["aten::to"]
    assert "inside the model's own operators (aten::to)" in rec.fix
    assert "serving thread" not in rec.fix
