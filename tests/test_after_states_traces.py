"""A real before/after pair recorded on an H200: the data fix's predicted step against the step measured
once the slow batches were gone (the pair is described in ``tests/data/README.md``)."""

from __future__ import annotations

import gzip
import json
import re
import statistics

import pytest

from conftest import DATA
from gpuidle.api import analyze

BEFORE = DATA / "h200_dataloader__before.pt.trace.json.gz"
AFTER = DATA / "h200_dataloader__after.pt.trace.json.gz"
STEP = re.compile(r"ProfilerStep#(\d+)")


def _step_spans_ms(path: object) -> dict[int, float]:
    """Each profiler step's host span (not its device-side copy), from the raw JSON."""
    with gzip.open(str(path), "rt") as f:
        events = json.load(f)["traceEvents"]
    return {int(m.group(1)): e["dur"] / 1e3 for e in events
            if e.get("cat") == "user_annotation" and (m := STEP.fullmatch(e.get("name", "")))}


def test_the_data_fix_predicts_the_step_measured_without_slow_batches() -> None:
    before, after = analyze(BEFORE), analyze(AFTER)
    fix = next(r for r in before.recommendations if r.id == "dataloader_workers")
    assert before.recommendations[0].id == "dataloader_workers"
    g = fix.gain
    assert g.basis == "measured"
    assert g.step_s_after is not None
    steady = [s.dur_s for s in after.ranks[0].steps if s.excluded is None]
    measured = statistics.fmean(steady)
    assert abs(g.step_s_after - measured) <= 0.05 * measured, (g.step_s_after, measured)
    # the saving is the injected delay (256 samples x 0.05 ms per step) plus at most what the default
    # loader costs on its own: the device has no queued work to hide either behind
    assert 12.8e-3 <= g.step_s_saved <= 12.8e-3 + 2e-3


def test_step_durations_are_the_profiler_steps() -> None:
    """The steps gpuidle times are the profiler's own step spans (within the device's tail)."""
    for path in (BEFORE, AFTER):
        spans = _step_spans_ms(path)
        (rank,) = analyze(path).ranks
        assert [s.step for s in rank.steps] == sorted(spans)
        total = sum(s.dur_s for s in rank.steps) * 1e3
        assert total == pytest.approx(sum(spans.values()), rel=0.05)
