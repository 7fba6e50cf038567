"""A one-off wait is named by its call: how long the call ran and what its transfer took."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.api import analyze
from gpuidle.report.terminal import TerminalRenderer
from minitrace import Trace

STEP_US = 10_000.0
COPY_CALL_US = 463_000.0
TRANSFER_US = 4.5
ONE_OFF = 5


def one_blocking_copy(path: Path) -> Path:
    """Eight 10 ms steps; in step 5 a device-to-host copy call blocks 463 ms for a 4.5 µs transfer: the host
    waited for something the trace does not show (the audit's decode trace, in small)."""
    t = Trace()
    base = 0.0
    for n in range(8):
        t.launch(at=base, call_dur=5, start=base + 10, dur=4_000)
        tail = base + 4_010
        if n == ONE_OFF:
            t.launch(at=tail, call_dur=COPY_CALL_US, start=tail + COPY_CALL_US - 10, dur=TRANSFER_US,
                     kind="gpu_memcpy", call="cudaMemcpyAsync", name="Memcpy DtoH (Device -> Pageable)", bytes=4)
            tail += COPY_CALL_US
        t.launch(at=tail + 20, call_dur=5, start=tail + 30, dur=1_950)
        length = tail + 2_000 - base + (STEP_US - 6_010)
        t.step(n, base, length)
        base += length
    return t.write(path / "one_copy.json.gz")


def test_the_copy_call_and_its_transfer_are_measured(tmp_path: Path) -> None:
    (rank,) = analyze([one_blocking_copy(tmp_path)]).ranks
    step = next(s for s in rank.steps if s.step == ONE_OFF)
    call = step.main_calls["host_sync"]
    assert call.name == "cudaMemcpyAsync"
    assert call.call_s == pytest.approx(COPY_CALL_US * 1e-6)
    assert call.transfer_s == pytest.approx(TRANSFER_US * 1e-6)
    # device idle under the call: kernel end to the copy's start, less the 50 µs launch queue charged to
    # launching, plus the call's tail after the transfer (until it returns)
    under = (COPY_CALL_US - 10) - 50 + (10 - TRANSFER_US)
    assert call.idle_s == pytest.approx(under * 1e-6)
    assert step.idle_by_cause_s["host_sync"] == pytest.approx(call.idle_s)
    # no other step has a main host_sync call; none has one that covers a share below half its cause
    for s in rank.steps:
        for cause, c in s.main_calls.items():
            assert c.idle_s >= 0.5 * s.idle_by_cause_s[cause] - 1e-12
    assert all("host_sync" not in s.main_calls for s in rank.steps if s.step != ONE_OFF)


def test_the_outlier_step_names_its_call(tmp_path: Path) -> None:
    report = analyze([one_blocking_copy(tmp_path)])
    step = next(s for s in report.ranks[0].steps if s.step == ONE_OFF)
    assert step.excluded == "outlier"
    text = " ".join(TerminalRenderer().render(report).split())
    assert ("step 5, 473.0 ms: outlier (host_sync 462.9 ms under one cudaMemcpyAsync call of 463.0 ms, its "
            "transfer 4.5 µs), left out of per-step figures and gains") in text
    # one event is no per-step cause: no fix claims the 463 ms
    assert all((r.gain.step_s_saved or 0.0) < 0.005 for r in report.recommendations)


def test_a_loader_on_a_real_trace_is_named_each_step() -> None:
    """The H200 DataLoader trace: each step's data_loading idle is under the loader's ``__next__`` range, the
    call as long as the trace records it."""
    import gzip
    import json

    path = DATA / "h200_dataloader__before.pt.trace.json.gz"
    (rank,) = analyze([path]).ranks
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    nexts = sorted(e["dur"] for e in events if e.get("name", "").startswith("enumerate(DataLoader)#")
                   and e.get("ph") == "X")
    steady = [s for s in rank.steps if s.excluded is None]
    assert steady
    for s in steady:
        call = s.main_calls["data_loading"]
        assert call.name.startswith("enumerate(DataLoader)#")
        assert any(call.call_s == pytest.approx(d * 1e-6, abs=1e-9) for d in nexts)
        assert call.idle_s <= call.call_s + 1e-9
        assert call.transfer_s is None
