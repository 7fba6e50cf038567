"""A profile of many steps costs per shape of name and per column, not per step: names that differ only in a
trailing ``#N`` are classified once, and the figures of every step are the ones a step-by-step pass gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuidle.analysis import names as n
from gpuidle.analysis.names import NameClasses
from gpuidle.api import analyze
from gpuidle.model import Source
from gpuidle.report.common import printable_report
from gpuidle.report.text import printable
from minitrace import Trace

HOST_RANGES = ["ProfilerStep", "Optimizer.step", "Optimizer.zero_grad", "enumerate(DataLoader)", "my_region",
               "DistributedDataParallel.forward", "train_step", "## forward ##", "CompiledFxGraph"]
OTHER = ["cudaLaunchKernel", "cudaStreamSynchronize", "aten::item", "volta_sgemm_128x64_nn",
         "ampere_fp16_s16816gemm_fp16_128x128", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "read", "Memcpy HtoD"]
NAME = st.one_of(st.builds(lambda p, k: f"{p}#{k}", st.sampled_from(HOST_RANGES), st.integers(0, 10**7)),
                 st.sampled_from(OTHER + HOST_RANGES))


@settings(max_examples=200, deadline=None)
@given(st.lists(NAME, max_size=30))
def test_names_classified_by_shape_as_each_name_alone(strings: list[str]) -> None:
    classes = NameClasses.of(strings)
    for field, fact in (("profiler_step", n.PROFILER_STEP), ("optimizer_step", n.OPTIMIZER_STEP),
                        ("zero_grad", n.ZERO_GRAD), ("data_loading", n.DATA_LOADING), ("region", n.REGION),
                        ("launch_call", n.LAUNCH_CALLS), ("sync_call", n.SYNC_CALLS)):
        folded = [s.lower() for s in strings] if fact in n.FOLDED else strings
        assert getattr(classes, field).tolist() == [any(p.search(s) for p in fact) for s in folded], field


def test_every_step_of_a_long_profile_keeps_its_figures(tmp_path: Path) -> None:
    """3,000 steps of 1 ms, a 600 µs kernel in each but every tenth step's, which waits 200 µs more on a
    synchronisation: each step's figures as the trace has them, and the printable copy of the report equal to it
    (no control character in any name)."""
    t = Trace()
    for k in range(3000):
        base = k * 1000.0
        t.step(k + 1, base, 1000)
        start = base + (210 if k % 10 == 0 else 10)
        if k % 10 == 0:
            t.runtime("cudaStreamSynchronize", base + 5, 200)
        t.launch(at=start - 5, call_dur=3, start=start, dur=600)
    report = analyze([t.write(tmp_path / "long.json.gz")])
    (rank,) = report.ranks
    assert [s.step for s in rank.steps] == list(range(1, 3001))
    busy = np.array([s.busy_s for s in rank.steps])
    assert np.allclose(busy, 600e-6)
    for s in rank.steps:
        assert abs(s.busy_s + sum(s.idle_by_cause_s.values()) - s.dur_s) < 1e-12
    assert printable_report(report) == report


@settings(max_examples=300, deadline=None)
@example(["a\x7fb"]).via("DEL, left raw by JSON")
@example(["\u202e", "é"]).via("an override beside other text beyond ASCII")
@given(st.lists(st.text(alphabet=st.one_of(st.sampled_from(list("a\n\t\r\x1b\x7f\x85\u061c\u202e\u2066é\\\"")),
                                         st.characters(codec="utf-8")), max_size=6), max_size=4))
def test_a_report_is_printed_as_it_is_only_where_every_string_is_printable(paths: list[str]) -> None:
    """The shortcut over the report's JSON agrees with cleaning every string (DEL, C1 controls, bidirectional
    overrides, escapes JSON writes)."""
    source = Source(paths=paths, format="kineto")
    assert printable_report(source).paths == [printable(p, keep_newlines=True) for p in paths]
