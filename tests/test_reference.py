"""gpuidle's numbers on real traces against the independent reference in reference.py."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import reference as ref
from conftest import DATA
from gpuidle.analysis.idle import attribute_idle
from gpuidle.analysis.links import launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import step_window
from gpuidle.api import analyze
from gpuidle.model import CAUSES
from gpuidle.sources import kineto

GPU_TRACES = [
    "nccl_parser_config__nccl_data.json.gz",
    "negative_queue_length_values_check__rank0.json.gz",
    "trace_filter__sampled_rank-0.json.gz",
    "trace_filter__sampled_rank-1.json.gz",
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
    "critical_path__cuda_event_sync__event_sync_trace.json.gz",
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "triton_example__triton_example.json.gz",
    "trace_compare__base__base.json.gz",
    "trace_compare__test__test.json.gz",
    "trace_file_list__inference_rank_1.json.gz",
    "h200_dataloader__before.pt.trace.json.gz",
    "h200_dataloader__after.pt.trace.json.gz",
]


@pytest.mark.parametrize("name", GPU_TRACES)
def test_window_busy_idle_match_reference(name: str) -> None:
    path = DATA / name
    t = ref.parse(path)
    lo, hi = ref.window(t)
    report = analyze([path])
    (rank,) = report.ranks
    assert rank.window.dur_s == pytest.approx((hi - lo) / 1e9, abs=1e-9)
    for d in rank.devices:
        busy = ref.busy(t, d.device)
        once = ref.startup_idle(t, d.device)  # one-time start-up idle: in the rank's window, in no cause
        assert d.window_s == pytest.approx((hi - lo - once) / 1e9, abs=1e-9)
        assert d.busy_s + d.idle_s == pytest.approx(d.window_s, abs=1e-9)
        assert d.busy_s == pytest.approx(busy / 1e9, abs=1e-9)
        assert d.startup_s == pytest.approx(once / 1e9, abs=1e-9)
        assert d.idle_s == pytest.approx((hi - lo - busy - once) / 1e9, abs=1e-9)
        assert d.utilization == pytest.approx(busy / (hi - lo - once), abs=1e-12)
        assert sum(d.idle_by_cause_s.values()) == pytest.approx(d.idle_s, abs=1e-9)


@pytest.mark.parametrize("name", GPU_TRACES)
def test_step_starts_match_reference(name: str) -> None:
    """Each step starts at its host marker, or where the device begins its work when the host runs ahead."""
    t = ref.parse(DATA / name)
    (rank,) = analyze([DATA / name]).ranks
    if not t.steps:
        return
    starts = ref.step_starts(t)
    assert [round((s.start_s - rank.steps[0].start_s) * 1e9) for s in rank.steps] == [x - starts[0] for x in starts]


def test_a_host_running_ahead_gets_the_devices_steps() -> None:
    """A V100 trace whose host runs 89 ms ahead of the device: each step from where the device begins its work,
    as the reference finds them (its timestamps are sub-microsecond and past float64's resolution at their
    magnitude, so within a microsecond), and steps of one length, not 35, 72, 96, 96 and 185 ms."""
    name = "ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    t = ref.parse(DATA / name)
    (rank,) = analyze([DATA / name]).ranks
    starts = ref.step_starts(t)
    assert starts != [s for _, s, _ in t.steps]
    got = [(s.start_s - rank.steps[0].start_s) * 1e9 for s in rank.steps]
    assert got == pytest.approx([x - starts[0] for x in starts], abs=1_000)
    assert [round(s.dur_s * 1e3) for s in rank.steps] == [98, 96, 96, 96, 95]
    assert any("run ahead of the device" in q.says for q in rank.quality if q.kind == "host_ahead")


@pytest.mark.parametrize("name", GPU_TRACES)
def test_steps_add_up_to_the_window(name: str) -> None:
    (rank,) = analyze([DATA / name]).ranks
    d = rank.primary()
    assert sum(s.dur_s for s in rank.steps) == pytest.approx(d.window_s, abs=1e-9)
    assert sum(s.dur_s + s.startup_s for s in rank.steps) == pytest.approx(rank.window.dur_s, abs=1e-9)
    assert sum(s.startup_s for s in rank.steps) == pytest.approx(d.startup_s, abs=1e-9)
    assert sum(s.busy_s for s in rank.steps) == pytest.approx(d.busy_s, abs=1e-9)
    for c in CAUSES:
        assert sum(s.idle_by_cause_s[c.value] for s in rank.steps) == pytest.approx(d.idle_by_cause_s[c.value],
                                                                                  abs=1e-9)


def _segments(path: Path) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, int]]:
    tl = kineto.read(str(path))
    names = NameClasses.of(tl.strings)
    win = step_window(tl, names)
    out = []
    for d in attribute_idle(tl, names, win, launcher_rows(tl)):
        s, e, c = d.segments
        out.append((d.device, s + tl.meta.t0_ns, e + tl.meta.t0_ns, c, int(d.busy_ns)))
    return out


@pytest.mark.parametrize("name", GPU_TRACES)
def test_idle_causes_match_reference_at_sampled_instants(name: str) -> None:
    """At random idle instants, the cause must be what the plain-Python rules say."""
    path = DATA / name
    t = ref.parse(path)
    rng = random.Random(7)
    for device, s, e, cause, _ in _segments(path):
        at = ref.cause_at(t, device)
        busy = ref.Cover([(o.start, o.end) for o in t.device_ops
                          if o.device == device and not ref.COLLECTIVE.search(o.name)])
        lengths = (e - s).astype(float)
        picks = rng.choices(range(len(s)), weights=lengths.tolist(), k=min(400, 20 * len(s)))
        for i in picks:
            instant = rng.randrange(int(s[i]), int(e[i]))
            assert instant not in busy
            assert at(instant) == CAUSES[int(cause[i])].value, (name, device, instant)
        # every segment boundary too: the first instant of each segment
        for i in range(0, len(s), max(1, len(s) // 200)):
            assert at(int(s[i])) == CAUSES[int(cause[i])].value, (name, device, int(s[i]))


@pytest.mark.parametrize("name", ["nccl_parser_config__nccl_data.json.gz",
                                  "negative_queue_length_values_check__rank0.json.gz"])
def test_kernel_facts_and_collective_histogram_match_reference(name: str) -> None:
    """Kernel count, time, short-kernel share and the collective size histogram, recomputed plainly."""
    path = DATA / name
    t = ref.parse(path)
    lo, hi = ref.window(t)
    kernels = [o for o in t.device_ops if o.cat in ("kernel", "Kernel") and not ref.COLLECTIVE.search(o.name)
               and lo <= o.start < hi]
    total = sum(o.end - o.start for o in kernels)
    short = sum(o.end - o.start for o in kernels if o.end - o.start < 10_000)
    (rank,) = analyze([path]).ranks
    k = rank.kernels
    assert k.count == len(kernels)
    assert k.total_s == pytest.approx(total / 1e9, abs=1e-9)
    assert k.short_kernel_share == pytest.approx(short / total)
    assert k.short_kernel_count == sum(1 for o in kernels if o.end - o.start < 10_000)
    top = max({o.name for o in kernels}, key=lambda n: sum(o.end - o.start for o in kernels if o.name == n))
    assert k.top[0].name == top
    coll = [o for o in t.device_ops if ref.COLLECTIVE.search(o.name) and o.start < hi and o.end > lo]
    assert sum(c.count for c in rank.communication.collectives) == len(coll)
    assert sum(rank.communication.size_histogram.values()) == sum(
        c.count for c in rank.communication.collectives if c.size_bucket != "unknown")
