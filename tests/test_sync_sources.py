"""The user's functions the host waits on the GPU from, from the trace's Python stacks (``with_stack=True``): each
function's share of the ``host_sync`` idle, computed against an independent sum over the hand-built waits, named in
the sync fix; library frames (torch, built-in methods) are passed over for the user's frame around them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuidle.api import analyze
from minitrace import Trace

CHECK = "train.py(40): check_finite"
LOG = "train.py(12): log_metrics"


def step_with_waits(t: Trace, n: int, base: float) -> None:
    """One 1,000 µs step: a kernel [base+10, base+300); ``check_finite`` calls ``.item()`` (through a torch frame and
    the built-in method), which waits until base+380: 80 µs of device idle; ``log_metrics`` synchronizes the stream
    from base+400 to base+420 while nothing runs: 20 µs; then the next kernel."""
    t.step(n, base, 1000)
    t.launch(at=base, call_dur=10, start=base + 10, dur=290)
    t.x("python_function", "train.py(70): train_step", base, 990)
    t.x("python_function", CHECK, base + 20, 365)
    t.x("python_function", "torch/_tensor.py(1200): __bool__", base + 25, 358)
    t.x("python_function", "<built-in method item of Tensor object at 0x7f1>", base + 30, 352)
    t.op("aten::item", base + 30, 350)
    t.op("aten::_local_scalar_dense", base + 31, 348)
    t.x("python_function", LOG, base + 395, 30)
    t.runtime("cudaStreamSynchronize", base + 400, 20)
    t.launch(at=base + 430, call_dur=10, start=base + 440, dur=560)


def test_waits_are_named_by_the_user_function_they_come_from(tmp_path: Path) -> None:
    t = Trace()
    for i in range(4):
        step_with_waits(t, i, i * 1000.0)
    report = analyze([t.write(tmp_path / "stacks.json.gz")])
    (rank,) = report.ranks
    sync_us = sum(s.idle_by_cause_s.get("host_sync", 0.0) for s in rank.steps) * 1e6
    assert sync_us == pytest.approx(4 * (80 + 20), abs=0.01)
    by_function = {s.function: s for s in rank.sync_sources}
    assert list(by_function) == [CHECK, LOG]  # largest first; torch's frame and the built-in method passed over
    assert by_function[CHECK].idle_s * 1e6 == pytest.approx(4 * 80, abs=0.01)
    assert by_function[CHECK].share == pytest.approx(0.8)
    assert by_function[LOG].share == pytest.approx(0.2)
    fix = next(r for r in report.recommendations if r.id == "remove_host_sync")
    assert fix.fix.startswith(f"# waits from {CHECK}: 80% of the sync idle\n# waits from {LOG}: 20% of the sync idle")
    assert fix.evidence["waits_from"] == {CHECK: "0.08 ms/step, 80%", LOG: "0.02 ms/step, 20%"}


def test_without_stacks_no_function_is_named(tmp_path: Path) -> None:
    t = Trace()
    for i in range(3):
        base = i * 1000.0
        t.step(i, base, 1000)
        t.launch(at=base, call_dur=10, start=base + 10, dur=290)
        t.op("aten::item", base + 30, 350)
        t.launch(at=base + 430, call_dur=10, start=base + 440, dur=560)
    report = analyze([t.write(tmp_path / "plain.json.gz")])
    assert report.ranks[0].sync_sources == []
    fix = next(r for r in report.recommendations if r.id == "remove_host_sync")
    assert "waits_from" not in fix.evidence
    assert not fix.fix.startswith("# waits from")
