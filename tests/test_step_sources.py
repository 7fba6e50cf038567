"""Where steps come from: the markers a profile writes itself before anything inferred, in one order for every
format, broken markers named and passed over, and the report's window line saying which source it used."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuidle.api import analyze
from gpuidle.model import Steps
from gpuidle.report.common import STEP_SOURCE_WORDS, window_words
from gpuidle.sources import step_markers
from minitrace import Trace

MS = 1000.0
"""µs per ms: hand-built Kineto traces are in µs."""


def serving_engine(iterations: int = 10, period_ms: float = 76.0) -> Trace:
    """A vLLM-like engine: each iteration schedules (host only), then runs the model (one kernel of half the
    iteration), annotated ``core step: execute_model``; the worker's ``gpu_model_runner: forward`` inside it."""
    t = Trace()
    for i in range(iterations):
        at = i * period_ms * MS
        t.annotation("core step: schedule", at, 10 * MS)
        t.annotation("core step: execute_model", at + 10 * MS, 60 * MS)
        t.annotation("gpu_model_runner: forward", at + 12 * MS, 50 * MS)
        t.launch(at=at + 14 * MS, call_dur=10, start=at + 20 * MS, dur=period_ms / 2 * MS)
    return t


def test_engine_iterations_are_the_steps(tmp_path: Path) -> None:
    """Ten iterations of 76 ms: ten steps of 76 ms each (the last to the end of its range), not one window of
    760 ms; the window line says the steps are the engine's iterations."""
    (rank,) = analyze([serving_engine().write(tmp_path / "engine.json.gz")]).ranks
    assert rank.step_source == "engine_iterations"
    assert len(rank.steps) == 10
    assert [round(s.dur_s * 1e3, 3) for s in rank.steps[:-1]] == [76.0] * 9
    assert round(rank.steps[-1].dur_s * 1e3, 3) == 60.0  # the last: its execute_model range (its kernel ends inside)
    assert all(round(s.busy_s * 1e3, 3) == 38.0 for s in rank.steps)
    assert "steps from the engine's iterations" in window_words(rank)


def test_profiler_steps_come_before_engine_iterations(tmp_path: Path) -> None:
    t = serving_engine(4)
    for i in range(2):
        t.step(i, i * 152 * MS, 152 * MS)
    (rank,) = analyze([t.write(tmp_path / "both.json.gz")]).ranks
    assert rank.step_source == "profiler_step"
    assert [s.step for s in rank.steps] == [0, 1]


@pytest.mark.parametrize(("broken", "why"), [
    ([(0, 50), (40, 50), (90, 50)], "1 overlapping (step 1 starts 10.000 ms before step 0 ends)"),
    ([(0, 50), (50, 0), (100, 50)], "1 of zero length (first: step 1)"),
])
def test_broken_profiler_steps_are_named_and_the_next_source_used(tmp_path: Path, broken: list[tuple[int, int]],
                                                                  why: str) -> None:
    """Overlapping or zero-length ``ProfilerStep`` ranges: one note says which and why, and the steps come whole
    from the next source (here the engine's iterations), none of the broken markers mixed in."""
    t = serving_engine(4)
    for i, (start, dur) in enumerate(broken):
        t.step(i, start * MS, dur * MS)
    (rank,) = analyze([t.write(tmp_path / "broken.json.gz")]).ranks
    assert rank.step_source == "engine_iterations"
    assert len(rank.steps) == 4
    (note,) = [n for n in rank.notes if "not used" in n]
    assert note == f"3 steps from the profiler's step markers not used, broken: {why}"


def test_annotations_named_like_steps(tmp_path: Path) -> None:
    """A user's ``record_function("train_step 3")``: steps numbered as named, after the profiler's and the
    engine's markers; an operator of that name is not one."""
    t = Trace()
    for n in (3, 4, 5):
        at = (n - 3) * 20 * MS
        t.annotation(f"train_step {n}", at, 20 * MS)
        t.op("step", at + 1 * MS, 1 * MS)
        t.launch(at=at + 2 * MS, call_dur=10, start=at + 5 * MS, dur=10 * MS)
    (rank,) = analyze([t.write(tmp_path / "named.json.gz")]).ranks
    assert rank.step_source == "named_ranges"
    assert [s.step for s in rank.steps] == [3, 4, 5]
    assert STEP_SOURCE_WORDS["named_ranges"] in window_words(rank)


def test_inferred_steps_say_there_were_no_markers(tmp_path: Path) -> None:
    t = Trace()
    for i in range(3):
        at = i * 30 * MS
        t.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", at, 10 * MS)
        t.launch(at=at + 11 * MS, call_dur=10, start=at + 12 * MS, dur=15 * MS)
    (rank,) = analyze([t.write(tmp_path / "inferred.json.gz")]).ranks
    assert rank.step_source == "inferred:dataloader_next"
    assert window_words(rank).endswith("steps inferred from DataLoader calls: no step markers in this profile")


def steps(*spans: tuple[int, int]) -> Steps:
    start = np.array([s for s, _ in spans], dtype=np.int64)
    end = np.array([e for _, e in spans], dtype=np.int64)
    return Steps(np.arange(start.size, dtype=np.int64), start, end, step_markers.PROFILER_STEP)


def test_what_makes_markers_broken() -> None:
    assert step_markers.problem(steps((0, 100), (100, 200), (200, 300))) is None
    assert step_markers.problem(steps((0, 100), (99_500, 200_000))) is None  # touching by a rounding
    assert step_markers.problem(steps((0, 100_000), (50_000, 200_000))) == \
        "1 overlapping (step 1 starts 0.050 ms before step 0 ends)"
    assert step_markers.problem(steps((0, 100), (100, 100))) == "1 of zero length (first: step 1)"
    assert step_markers.problem(steps((0, 100), (100, 50))) == "1 unterminated (step 1 has no end)"


def test_first_sound_skips_empty_and_broken_sources_with_one_note_each() -> None:
    notes: list[str] = []
    broken = steps((0, 100_000), (50_000, 200_000))
    good = Steps(np.array([7]), np.array([0]), np.array([10]), step_markers.ENGINE_ITERATIONS)
    assert step_markers.first_sound([step_markers.none(), broken, good], notes) is good
    assert notes == ["2 steps from the profiler's step markers not used, broken: 1 overlapping (step 1 starts "
                     "0.050 ms before step 0 ends)"]
    assert len(step_markers.first_sound([broken], [])) == 0


def test_a_step_over_several_devices_spans_all_its_pieces() -> None:
    """The ``Steps`` line of each GPU: step n runs from its first piece's start to its last piece's end."""
    merged = step_markers.merged_spans(np.array([2, 1, 2, 1]), np.array([30, 0, 25, 5]), np.array([40, 20, 45, 22]),
                                       step_markers.DEVICE_STEPS)
    assert merged.number.tolist() == [1, 2]
    assert merged.start.tolist() == [0, 25]
    assert merged.end.tolist() == [22, 45]


def tf_mirrored_profile(path: Path, steps_line: list[list[tuple[int, int, int]]]) -> Path:
    """A TensorFlow-like XSpace of two GPUs, in ms: each GPU runs a 15 ms kernel burst per 20 ms step, GPU 1
    2 ms after GPU 0; ``steps_line[g]`` is GPU g's ``Steps`` line as (step number, start, end); the host reads
    its input with ``IteratorGetNext`` every 0.2 ms (what steps would otherwise be inferred from)."""
    pytest.importorskip("google.protobuf")
    from gpuidle.sources.xplane import xplane_pb2

    ms = 1_000_000
    space = xplane_pb2.XSpace(hostnames=["worker-0"])
    for g, line_steps in enumerate(steps_line):
        gpu = space.planes.add(id=10 + g, name=f"/device:GPU:{g}")
        gpu.event_metadata[1].id, gpu.event_metadata[1].name = 1, "volta_sgemm_128x64_nn"
        stream = gpu.lines.add(id=7, name="Stream #7(Kernel)", timestamp_ns=0)
        for i in range(5):
            at = (i * 20 + 2 * g) * ms
            stream.events.add(metadata_id=1, offset_ps=at * 1000, duration_ps=15 * ms * 1000)
        steps = gpu.lines.add(id=8, name="Steps", timestamp_ns=0)
        for n, start, end in line_steps:
            meta_id = 100 + n
            gpu.event_metadata[meta_id].id, gpu.event_metadata[meta_id].name = meta_id, str(n)
            steps.events.add(metadata_id=meta_id, offset_ps=start * ms * 1000, duration_ps=(end - start) * ms * 1000)
    host = space.planes.add(id=2, name="/host:CPU")
    host.event_metadata[1].id, host.event_metadata[1].name = 1, "IteratorGetNext"
    host.event_metadata[2].id, host.event_metadata[2].name = 2, "EagerExecute"
    loop = host.lines.add(id=1, name="tf_Compute", timestamp_ns=0)
    for k in range(500):
        loop.events.add(metadata_id=1, offset_ps=k * 200_000 * 1000, duration_ps=20_000 * 1000)
    path.write_bytes(space.SerializeToString())
    return path


def test_the_profiles_steps_line_is_the_steps(tmp_path: Path) -> None:
    """Five 20 ms steps on each GPU's ``Steps`` line: five steps, each GPU 75 % busy, not hundreds of pseudo-steps
    of 0.2 ms from the input calls."""
    lines = [[(40 + i, i * 20 + 2 * g, i * 20 + 2 * g + 15) for i in range(5)] for g in range(2)]
    (rank,) = analyze([tf_mirrored_profile(tmp_path / "worker-0.xplane.pb", lines)]).ranks
    assert rank.step_source == "device_steps"
    assert [s.step for s in rank.steps] == [40, 41, 42, 43, 44]
    assert [round(s.dur_s * 1e3, 6) for s in rank.steps] == [20.0] * 4 + [17.0]  # the last: to GPU 1's end
    for device in rank.devices:
        assert round(device.busy_s * 1e3, 6) == 75.0
    assert window_words(rank).endswith("steps from the profile's Steps line")


def test_a_broken_steps_line_is_named_and_passed_over(tmp_path: Path) -> None:
    """GPU 1's step 41 begins before GPU 0's step 40 has ended by more than a rounding: the merged steps overlap,
    one note says so and the steps are inferred, with the window line saying there were no usable markers."""
    lines = [[(40, 0, 15), (41, 20, 35)], [(41, 10, 37), (40, 2, 17)]]
    (rank,) = analyze([tf_mirrored_profile(tmp_path / "worker-0.xplane.pb", lines)]).ranks
    assert rank.step_source != "device_steps"
    (note,) = [n for n in rank.notes if "not used" in n]
    assert note == ("2 steps from the profile's Steps line not used, broken: 1 overlapping (step 41 starts 7.000 ms "
                    "before step 40 ends)")


def test_steps_are_taken_on_the_device_side_where_the_host_runs_ahead(tmp_path: Path) -> None:
    """The host marks a step every 10 ms and launches its work at once; the device, busy with earlier steps, starts
    each step's 10 ms kernel 25 ms after its launch: the steps are where the device runs them, one per kernel,
    and a note says so. The control: a host that waits 8 ms for data before launching, the device starting at
    once, keeps its markers."""
    ahead = Trace()
    for n in range(5):
        at = n * 10 * MS
        ahead.step(n, at, 10 * MS)
        ahead.launch(at=at + 0.1 * MS, call_dur=10, start=at + 25 * MS, dur=10 * MS)
    (rank,) = analyze([ahead.write(tmp_path / "ahead.json.gz")]).ranks
    assert [round((s.start_s - rank.steps[0].start_s) * 1e3, 3) for s in rank.steps] == [0, 10, 20, 30, 40]
    assert [round(s.busy_s / s.dur_s, 3) for s in rank.steps] == [1.0] * 5
    (note,) = [q.says for q in rank.quality if q.kind == "host_ahead"]
    assert "waits 24.90 ms in the median step" in note

    loader = Trace()
    for n in range(5):
        at = n * 10 * MS
        loader.step(n, at, 10 * MS)
        loader.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", at, 8 * MS)
        loader.launch(at=at + 8 * MS, call_dur=10, start=at + 8.02 * MS, dur=1.9 * MS)
    (rank,) = analyze([loader.write(tmp_path / "loader.json.gz")]).ranks
    assert [round(s.start_s * 1e3, 3) for s in rank.steps] == [0, 10, 20, 30, 40]
    assert not [q for q in rank.quality if q.kind == "host_ahead"]
