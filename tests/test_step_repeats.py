"""Steps from what repeats, on hand-built traces whose names no rule knows, and what a trace cannot tell said above
the fixes (a lost device record, GPUs without kernels), never among them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuidle.api import analyze
from minitrace import Trace

SGEMM = "ampere_sgemm_128x64_nn"


def loop(t: Trace, name: str, n: int, period: float = 1000, kind: str = "user_annotation") -> None:
    """``n`` iterations of ``period`` µs, each a range ``name`` of 600 µs launching two kernels of 300 µs."""
    for i in range(n):
        base = i * period
        t.x(kind, name, base, 600)
        t.launch(at=base + 10, call_dur=5, start=base + 20, dur=300, name=SGEMM)
        t.launch(at=base + 400, call_dur=5, start=base + 420, dur=300, name=SGEMM)


@pytest.mark.parametrize("name", ["decode_iteration[batch=4]", "tick", "execute_context_9(3)_generation_1(1)"])
def test_a_recurring_annotation_with_the_work_under_it_is_the_step(tmp_path: Path, name: str) -> None:
    t = Trace()
    loop(t, name, 6)
    (rank,) = analyze([t.write(tmp_path / "loop.json.gz")]).ranks
    assert (len(rank.steps), rank.step_source) == (6, "repeating_ranges")
    assert [round(s.start_s * 1e6) for s in rank.steps][:3] == [0, 1000, 2000]  # each from its range's start
    assert any(name in n for n in rank.notes)


def engine(t: Trace, n: int, ahead: float, host: bool = True, device: bool = True, name: str = "iteration") -> None:
    """``n`` iterations 1,000 µs apart: the host's range of 300 µs launches two kernels of 300 µs that run ``ahead``
    µs after their launch (an engine scheduling ahead); the device's range over them, as Kineto writes its GPU
    annotation track (pid the device, tid the stream, no args)."""
    for i in range(n):
        base = i * 1000
        if host:
            t.annotation(name, base, 300)
        t.launch(at=base + 10, call_dur=5, start=base + ahead + 20, dur=300, name=SGEMM)
        t.launch(at=base + 100, call_dur=5, start=base + ahead + 330, dur=300, name=SGEMM)
        if device:
            t.x("gpu_user_annotation", name, base + ahead + 20, 610, pid=0, tid=7)


@pytest.mark.parametrize("host", [True, False])
def test_a_recurring_range_on_the_device_s_track_is_the_device_s_step(tmp_path: Path, host: bool) -> None:
    """The host schedules 2.5 iterations ahead: the steps are the device's ranges, on its clock (each from its
    first kernel's start, the last to its own end), with the host's range or without it; the busy time is the
    kernels', never the ranges'."""
    t = Trace()
    engine(t, 6, ahead=2500, host=host)
    (rank,) = analyze([t.write(tmp_path / "engine.json.gz")]).ranks
    assert (len(rank.steps), rank.step_source) == (6, "repeating_device_ranges")
    first = 0 if host else 10  # times are from the trace's first event: the host's range, else the first launch
    assert [round(s.start_s * 1e6) + first for s in rank.steps] == [2520 + 1000 * i for i in range(6)]
    assert round(rank.window.dur_s * 1e6) == 5 * 1000 + 610
    assert [round(s.busy_s * 1e6) for s in rank.steps] == [600] * 6  # two kernels of 300 µs, not the range's 610
    assert rank.primary().busy_s == pytest.approx(6 * 600e-6)
    assert any("'iteration' on the GPU's own timeline" in n for n in rank.notes)


def test_a_device_range_over_little_work_leaves_the_step_to_the_host_s_range(tmp_path: Path) -> None:
    """A range on the device's track over one short kernel a period (a logging region), the host's range over all
    the work: the device's range is no step; the host's is."""
    t = Trace()
    loop(t, "step_body", 6)
    for i in range(6):
        t.launch(at=i * 1000 + 700, call_dur=5, start=i * 1000 + 800, dur=20, name="log_kernel")
        t.x("gpu_user_annotation", "log metrics", i * 1000 + 800, 20, pid=0, tid=7)
    (rank,) = analyze([t.write(tmp_path / "log.json.gz")]).ranks
    assert (len(rank.steps), rank.step_source) == (6, "repeating_ranges")


def test_a_python_function_that_repeats_is_not_a_step(tmp_path: Path) -> None:
    """A model's layers are calls of one function: one forward of six layers is one step."""
    t = Trace()
    t.launch(at=0, call_dur=5, start=10, dur=50, name="embedding_kernel")
    for i in range(6):
        base = 100 + i * 1000
        t.x("python_function", "model.py(40): forward", base, 600)
        t.launch(at=base + 10, call_dur=5, start=base + 20, dur=300, name=SGEMM)
        t.launch(at=base + 400, call_dur=5, start=base + 420, dur=300, name=SGEMM)
    t.launch(at=6200, call_dur=5, start=6210, dur=50, name="lm_head_softmax_kernel")
    (rank,) = analyze([t.write(tmp_path / "layers.json.gz")]).ranks
    assert rank.step_source == "none"   # nor the device's period: the embedding and the head run once


def test_a_range_with_little_work_under_it_is_not_a_step(tmp_path: Path) -> None:
    """A logging range each period, the kernels launched outside it: not the step."""
    t = Trace()
    for i in range(6):
        base = i * 1000
        t.annotation("log metrics", base, 100)
        t.launch(at=base + 200, call_dur=5, start=base + 210, dur=600, name=SGEMM)
    (rank,) = analyze([t.write(tmp_path / "log.json.gz")]).ranks
    assert rank.step_source == "device_period"   # the device's own repetition, not the range


def test_ranges_of_uneven_length_are_not_steps(tmp_path: Path) -> None:
    t = Trace()
    for i, length in enumerate((100, 900, 200, 800, 150, 700)):
        base = i * 1000
        t.annotation("request", base, length)
        t.launch(at=base + 10, call_dur=5, start=base + 20, dur=60, name=SGEMM)
    (rank,) = analyze([t.write(tmp_path / "uneven.json.gz")]).ranks
    assert rank.step_source == "device_period"


@pytest.mark.parametrize(("warmup", "steps"), [(False, 5), (True, 1)])
def test_the_device_s_own_repetition_is_the_step(tmp_path: Path, warmup: bool, steps: int) -> None:
    """Device events alone, five copies of one block of three kernels: five steps; one kernel more, run once, and
    the sequence is no repetition of a block."""
    t = Trace()
    if warmup:
        t.x("kernel", "warmup_kernel", 0, 50, pid=0, tid=7, device=0, stream=7)
    for i in range(5):
        for k, name in enumerate(("gather_kernel", SGEMM, "softmax_kernel")):
            t.x("kernel", name, 100 + i * 1000 + k * 200, 150, pid=0, tid=7, device=0, stream=7)
    (rank,) = analyze([t.write(tmp_path / "device.json.gz")]).ranks
    assert len(rank.steps) == steps
    assert rank.step_source == ("device_period" if steps > 1 else "none")


def test_launches_without_their_kernels_are_said_as_lost_records(tmp_path: Path) -> None:
    """40 launches, 10 of them with a kernel: the device's records were lost, said above the fixes."""
    t = Trace()
    for i in range(4):
        t.step(i + 1, i * 1000, 1000)
        for k in range(10):
            at = i * 1000 + k * 90
            if k == 0:
                t.launch(at=at, call_dur=5, start=at + 10, dur=80, name=SGEMM)
            else:
                t.runtime("cudaLaunchKernel", at, 5)
                t.events[-1]["args"]["correlation"] = 90_000 + i * 10 + k
    report = analyze([t.write(tmp_path / "lost.json.gz")])
    (q,) = [q for q in report.quality if q.kind == "device_records_lost"]
    assert q.says.startswith("36 of 40 kernel launches have no device record")
    assert not [r for r in report.recommendations if r.id.startswith("record_")]


def test_launches_and_no_kernel_at_all_is_not_called_cpu_only(tmp_path: Path) -> None:
    """CUDA was recorded (launches with their correlation ids) and no kernel record came: the host's side is
    reported and the device's records said missing, never "CPU-only: profile with CUDA"; without a launch either,
    an error."""
    from gpuidle.errors import GpuidleError

    t = Trace()
    for i in range(5):
        t.op("aten::mm", i * 100, 20)
        t.runtime("cudaLaunchKernel", i * 100 + 5, 5)
        t.events[-1]["args"]["correlation"] = 100 + i
    report = analyze([t.write(tmp_path / "no_kernels.json.gz")])
    assert report.ranks == []
    assert [h.lost_launches for h in report.host_side] == [5]
    (q,) = report.quality
    assert q.says.startswith("device records lost: 5 kernel launches with no kernel record")
    assert report.host_side[0].top_calls[0].count == 5   # aten::mm, 20 µs each
    t = Trace()
    t.op("aten::mm", 0, 20)
    with pytest.raises(GpuidleError, match="CPU-only"):
        analyze([t.write(tmp_path / "cpu.json.gz")])


def test_one_engine_iteration_is_told_the_engine_s_profiler(tmp_path: Path) -> None:
    """A serving engine owns its loop: a window of one step asks for several of its iterations through the engine,
    never for a training loop's profiler schedule."""
    t = Trace()
    t.op("vllm::unified_attention_with_output", 0, 50)
    t.launch(at=10, call_dur=5, start=20, dur=300, name=SGEMM)
    t.op("vllm::unified_attention_with_output", 400, 300)
    t.launch(at=700, call_dur=5, start=710, dur=300, name=SGEMM)
    report = analyze([t.write(tmp_path / "engine.json.gz")])
    (q,) = [q for q in report.quality if q.kind == "one_step"]
    assert q.recording is not None
    assert "llm.start_profile()" in q.recording
    assert "prof.step()" not in q.recording


def test_a_window_of_graph_capture_is_said_so(tmp_path: Path) -> None:
    """A warm-up kernel, 5 ms of CUDA-graph capture (its 30 launches recorded, not run), one replay: the trace shows
    the graphs prepared, not run; its launches inside the capture are no lost records."""
    t = Trace()
    t.launch(at=0, call_dur=5, start=10, dur=100, name=SGEMM)
    t.runtime("cudaStreamBeginCapture", 300, 5)
    for k in range(30):
        t.runtime("cudaLaunchKernel", 400 + k * 150, 5)
        t.events[-1]["args"]["correlation"] = 50_000 + k
    t.runtime("cudaStreamEndCapture", 5_300, 5)
    t.launch(at=5_350, call_dur=5, start=5_400, dur=100, name=SGEMM, call="cudaGraphLaunch")
    report = analyze([t.write(tmp_path / "capture.json.gz")])
    kinds = {q.kind for q in report.quality}
    assert "capture_only" in kinds
    assert "device_records_lost" not in kinds
