"""Steady state in tracker runs: warm-up, the profiler's window and its shutdown are left out of gains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuidle.analysis.series import rank_report
from gpuidle.api import analyze, analyze_series
from gpuidle.model import StepSeries
from gpuidle.report.terminal import TerminalRenderer
from minitrace import Trace

MS = 1_000_000


def series(dur_ms: list[int], data_ms: list[int], profiled: list[bool]) -> StepSeries:
    n = len(dur_ms)
    z = np.zeros(n, dtype=np.int64)
    dur = np.array(dur_ms, dtype=np.int64) * MS
    data = np.array(data_ms, dtype=np.int64) * MS
    return StepSeries(
        rank=0, world_size=1, path="rank-0.jsonl", timing="host", device=0, device_name=None,
        compute_phases=["forward"], copy_phase="h2d", step=np.arange(n, dtype=np.int64),
        start=np.concatenate([[0], np.cumsum(dur)[:-1]]).astype(np.int64), dur=dur, data=data,
        phases={"forward": dur - data}, device_phases={}, comm=z, comm_exposed=z, straggler=z, buckets=z,
        bucket_bytes=z, samples=z, batches=z, profiled=np.array(profiled),
    )


# step 0: warm-up; steps 3-4 profiled (dropped by the tracker); step 5: the profiler's shutdown
DUR = [400, 10, 10, 30, 30, 24, 10, 10]
DATA = [0, 4, 4, 4, 4, 4, 4, 4]
PROF = [False, False, False, True, True, False, False, False]


def test_tracker_steps_are_marked() -> None:
    r = rank_report(series(DUR, DATA, PROF))
    assert [(s.step, s.excluded) for s in r.steps] == [
        (0, "warmup"), (1, None), (2, None), (5, "profiler"), (6, None), (7, None)]
    # whole-window figures keep every measured step
    assert r.devices[0].window_s == pytest.approx((400 + 10 + 10 + 24 + 10 + 10) / 1e3)


def test_gains_use_steady_steps_only() -> None:
    report = analyze_series([series(DUR, DATA, PROF)], ["run"])
    loader = next(x for x in report.recommendations if x.id == "dataloader_workers")
    assert loader.gain.step_s_before == pytest.approx(10 * MS / 1e9)
    assert loader.gain.step_s_saved == pytest.approx(4 * MS / 1e9)
    assert loader.gain.utilization_after == pytest.approx(1.0)
    assert report.combined is not None
    assert report.combined.step_s_after == pytest.approx(6 * MS / 1e9)


def test_reports_say_which_steps_are_left_out() -> None:
    text = TerminalRenderer().render(analyze_series([series(DUR, DATA, PROF)], ["run"]))
    assert "step 0, 400.0 ms: warm-up, left out of per-step figures and gains" in text
    assert "step 5, 24.00 ms: profiler start/stop, left out" in text
    assert "would count" not in text  # a host-timed run makes no device claim


def test_real_traces_mark_steps_and_never_all(data: Path) -> None:
    for name in ("critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
                 "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                 "negative_queue_length_values_check__rank0.json.gz"):
        report = analyze([data / name])
        steps = report.ranks[0].steps
        assert any(s.excluded is None for s in steps)
        c = report.combined
        assert c is not None
        d = report.ranks[0].primary()
        steady = [s for s in steps if s.excluded is None]
        assert c.step_s_before == pytest.approx(sum(s.dur_s for s in steady) / len(steady))
        # never more than the steady step's idle plus the compute the fixes shrink
        assert 0 <= c.step_s_saved <= c.step_s_before
        # start-up costs (AlexNet's 6 s context creation, 3 s first launch) are in no cause and not in the window
        assert d.busy_s + sum(d.idle_by_cause_s.values()) == pytest.approx(d.window_s, abs=1e-9)


def test_a_sliver_of_busy_time_makes_no_outlier() -> None:
    """Data-bound steps of ~10 ms whose device is busy a few µs in one step and a few hundred in the next (its
    completion stamps land in bursts) are all steady; a one-time wait in the compute of an ordinary-length step
    (DDP rebuilding its buckets) is still left out."""
    from gpuidle.analysis.steps import OUTLIER, steady_state

    dur = [10.5, 10.6, 10.4, 10.7, 10.5, 10.6, 10.5, 10.4]
    sliver = [0.005, 0.35, 0.004, 0.40, 0.006, 0.005, 0.37, 0.005]
    assert steady_state(dur, busy=sliver) == [None] * 8
    rebuilt = [6.0, 6.1, 9.9, 6.0, 6.2, 6.1, 6.0, 6.1]  # step 2's compute held a 3.8 ms one-time wait
    assert steady_state(dur, busy=rebuilt) == [None, None, OUTLIER, None, None, None, None, None]


def test_a_profiles_last_step_cut_short_is_left_out(tmp_path: Path) -> None:
    """Steps of 150-190 ms and a last one of 40 ms where the profile stopped (or a first one of 30 ms where it
    started): it is ``truncated``, out of the mean step; a step of ordinary length stays."""
    def job(durations_ms: list[float]) -> list[str | None]:
        t = Trace()
        at = 0.0
        for n, dur in enumerate(durations_ms):
            t.step(n, at * 1000, dur * 1000)
            t.launch(at=at * 1000, call_dur=10, start=at * 1000 + 20, dur=dur * 1000 * 0.6)
            at += dur
        (rank,) = analyze([t.write(tmp_path / f"cut{len(durations_ms)}.json.gz")]).ranks
        return [s.excluded for s in rank.steps]

    assert job([150, 190, 146, 180, 40]) == [None, None, None, None, "truncated"]
    assert job([30, 190, 146, 180, 170]) == ["truncated", None, None, None, None]
    assert job([150, 190, 146, 180, 120, 160]) == [None] * 6


def test_device_events_that_stop_early_are_said_and_their_steps_left_out(tmp_path: Path) -> None:
    """Ten steps launched, kernels recorded for the first five only (the device trace was cut): a note says so, and
    the five steps with no device work are left out of the per-step figures."""
    t = Trace()
    for n in range(10):
        base = n * 10_000.0
        t.step(n, base, 10_000)
        for k in range(3):
            if n < 5:
                t.launch(at=base + k * 100, call_dur=10, start=base + 1_000 + k * 2_000, dur=1_500)
            else:
                t.runtime("cudaLaunchKernel", base + k * 100, 10)
    (rank,) = analyze([t.write(tmp_path / "cut.json.gz")]).ranks
    assert [s.excluded for s in rank.steps][5:] == ["no_gpu_work"] * 5
    (note,) = [n for n in rank.notes if "device's events stop" in n]
    assert "(15 launches after them)" in note


def test_steps_unalike_among_themselves_tell_nothing_of_a_cut() -> None:
    """Steps inferred from calls of uneven work (60, 27, 4 and 46 ms): a last one of 2.6 ms is not called cut."""
    from gpuidle.analysis.steps import truncated_edges

    assert truncated_edges([59.9, 26.8, 3.8, 46.1, 2.6], [None] * 5) == [None] * 5
    assert truncated_edges([150, 190, 146, 180, 40], [None] * 5) == [None] * 4 + ["truncated"]


def test_an_end_of_profile_tail_is_left_out_of_the_window(tmp_path: Path) -> None:
    """Steps of 170 ms; the last one's marker runs 25 ms past everything recorded in it (the profile stopping): the
    window ends at its last activity, with a note, and no unattributed idle comes from the tail. A last step of
    ordinary length keeps its marker's end."""
    def job(tail_ms: float) -> tuple[float, list[str]]:
        t = Trace()
        for n in range(4):
            at = n * 170.0
            t.step(n, at * 1000, (170 + (tail_ms if n == 3 else 0)) * 1000)
            t.op("aten::mm", at * 1000 + 5, 10)
            t.launch(at=at * 1000 + 10, call_dur=10, start=at * 1000 + 30, dur=160_000)
            t.op("aten::add", at * 1000 + 160_000, 9_000)
        (rank,) = analyze([t.write(tmp_path / f"tail{tail_ms}.json.gz")]).ranks
        return rank.window.dur_s, [q.says for q in rank.quality if q.kind == "profile_tail"]

    dur, notes = job(25.0)
    assert dur == pytest.approx(3 * 0.170 + 0.169)  # to the end of the last step's aten::add
    assert notes == ["the last step's marker runs 26.00 ms past everything recorded in it (the profile stopping): "
                     "that tail is left out of the window"]
    dur, notes = job(0.0)
    assert dur == pytest.approx(4 * 0.170)
    assert notes == []


def test_a_long_step_that_recurs_is_the_loops_rhythm_not_an_outlier() -> None:
    """ResNet's loader stalls every fourth step (750-830 ms against 150-160 ms): the pool refilling, regular. The
    longest of them is no outlier while three others lie within 15 % of it; one long step alone still is, and slow
    first steps stay warm-up."""
    from gpuidle.analysis.steps import steady_state

    resnet = [171, 159, 158, 154, 159, 159, 159, 279, 486, 160, 150, 765, 482, 291, 151, 747, 333, 368, 161, 757,
              393, 373, 160, 827, 550, 160, 150, 179]
    assert steady_state(resnet) == [None] * len(resnet)
    assert steady_state([100, 100, 101, 99, 100, 900, 100, 100])[5] == "outlier"
    assert steady_state([500, 510, 505, 100, 100, 101, 99, 100, 300, 100])[:3] == ["warmup"] * 3
