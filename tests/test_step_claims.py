"""Steps a trace claims are believed only where they cover the device's work: steps apart from every kernel are set
aside, a step far from the device's work is dropped, steps are clipped to the window, and no step is ever of
negative length."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuidle.analysis.steps import clipped, on_device_work
from gpuidle.api import analyze
from gpuidle.model import Steps
from minitrace import Trace
from xspace_steps import profile

US = 1e-6
DAY_PS = 86400 * 10**12


def steps_of(starts: list[int], lengths: list[int]) -> Steps:
    start = np.array(sorted(starts), dtype=np.int64)
    end = start + np.array(lengths[:start.size], dtype=np.int64)
    return Steps(np.arange(start.size, dtype=np.int64), start, end, "profiler_step")


@settings(max_examples=150, deadline=None)
@given(starts=st.lists(st.integers(0, 10**12), min_size=1, max_size=12, unique=True),
       lengths=st.lists(st.integers(0, 10**10), min_size=12, max_size=12),
       ops=st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**9)), min_size=1, max_size=8),
       end=st.integers(0, 2 * 10**12))
def test_kept_steps_reach_the_device_work_and_clip_to_the_window(starts: list[int], lengths: list[int],
                                                                 ops: list[tuple[int, int]], end: int) -> None:
    steps = steps_of(starts, lengths)
    op_start = np.array([s for s, _ in ops], dtype=np.int64)
    op_end = op_start + np.array([d for _, d in ops], dtype=np.int64)
    kept, note = on_device_work(steps, op_start, op_end, (op_start, op_end))
    assert (note is None) == (len(kept) == len(steps))
    if len(kept) == 0:
        return
    lo, hi = int(op_start.min()), int(op_end.max())
    margin = int(np.max(steps.end - steps.start))
    assert bool(((kept.end > lo - margin - 1) & (kept.start < hi + margin + 1)).all())
    assert bool((kept.end >= kept.start).all())
    window_end = max(end, int(kept.start[0]))
    out, _ = clipped(kept, window_end)
    bounds = np.append(out.start, window_end)
    assert len(out) >= 1
    assert bool((np.diff(bounds) >= 0).all())
    assert bool((out.end <= window_end).all())


def host_ahead(tmp_path: Path, last_launches: bool) -> Path:
    """Five 1 ms host steps launching 100 µs kernels that run from 5 ms on (the host runs ahead); the last step
    launches nothing where not ``last_launches``."""
    t = Trace()
    for n in range(5):
        t.step(n + 1, n * 1000.0, 1000)
        if n < 4 or last_launches:
            t.launch(at=n * 1000.0 + 5, call_dur=5, start=5000 + n * 100, dur=100)
    return t.write(tmp_path / "ahead.json.gz")


def test_a_trailing_empty_step_moved_past_the_window_is_left_out(tmp_path: Path) -> None:
    """Before: step 5 moved to the device's side began 2.25 ms after the window's end, a step of −2.25 ms."""
    (rank,) = analyze([host_ahead(tmp_path, last_launches=False)]).ranks
    assert [s.step for s in rank.steps] == [1, 2, 3, 4]
    assert [round(s.dur_s / US) for s in rank.steps] == [100] * 4
    assert any("step(s) 5 begin after the window's end" in n for n in rank.notes)


def test_steps_apart_from_every_kernel_are_set_aside(tmp_path: Path) -> None:
    """Profiler steps over the first 5 ms, kernels 10 s later (launched then too): not a 0 % window of steps, but
    the next step source (the device's five alike kernels), with a note."""
    t = Trace()
    for n in range(5):
        t.step(n + 1, n * 1000.0, 1000)
    for n in range(5):
        t.launch(at=10_000_000 + n * 1000.0, call_dur=5, start=10_000_100 + n * 1000.0, dur=800)
    (rank,) = analyze([t.write(tmp_path / "apart.json.gz")]).ranks
    assert rank.step_source == "device_period"  # the next source: the device's own repeating kernels
    assert len(rank.steps) == 5
    assert rank.primary().utilization > 0.8
    assert any("lie outside the device's work: set aside" in n for n in rank.notes)
    assert not any("none could be inferred" in n for n in rank.notes)


def test_xspace_steps_apart_from_every_kernel_are_set_aside(tmp_path: Path) -> None:
    """JAX's step markers a second before the kernels and their launches: before, six steps at 0 %."""
    (rank,) = analyze([profile(tmp_path / "apart.xplane.pb", apart_ps=10**12)]).ranks
    assert rank.step_source != "profiler_step"
    assert rank.primary().utilization > 0.5
    assert any("6 step(s) of the trace (profiler_step) lie outside the device's work" in n for n in rank.notes)


def test_an_xspace_steps_event_days_late_is_set_aside(tmp_path: Path) -> None:
    """One ``Steps`` event 52 days late: before, a window of 52 days at 0 % utilization; now five 1 ms steps."""
    (rank,) = analyze([profile(tmp_path / "late.xplane.pb", steps_line=True, late_ps=52 * DAY_PS)]).ranks
    assert len(rank.steps) == 5
    assert rank.primary().window_s < 0.01
    assert math.isclose(rank.primary().utilization, 0.6, rel_tol=0.01)
    assert any("step(s) 5 lie more than a step away from the device's work" in n for n in rank.notes)


@settings(max_examples=25, deadline=None)
@given(shifts=st.lists(st.integers(-30_000, 30_000), min_size=6, max_size=6),
       empty=st.lists(st.booleans(), min_size=6, max_size=6))
def test_any_steps_give_a_window_on_the_device_s_work(shifts: list[int], empty: list[bool]) -> None:
    """Six profiler steps, each moved by up to 30 ms against kernels launched at 1 ms steps, some launching
    nothing: no step of negative length, and the window overlaps the device's work."""
    import tempfile

    t = Trace()
    for n in range(6):
        t.step(n + 1, max(0.0, n * 1000.0 + shifts[n]), 1000)
        if not empty[n] or n == 0:
            t.launch(at=n * 1000.0 + 5, call_dur=5, start=n * 1000.0 + 3000, dur=400)
    with tempfile.TemporaryDirectory() as d:
        report = analyze([t.write(Path(d) / "r.json.gz")])
    (rank,) = report.ranks
    assert all(s.dur_s >= 0 for s in rank.steps)
    device = rank.primary()
    assert device.busy_s > 0
    assert 0 < device.utilization <= 1
