"""Utilization analysis and advice on hand-built series: exact numbers, and a simple reference."""

from __future__ import annotations

import math
import random
import statistics

import msgspec
import numpy as np
import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.advice.utilization import build_report, recommend
from gpuidle.analysis.counters import UtilOptions, headroom_factor, periodic_drops, runs_below, sample_weights
from gpuidle.analysis.utilization import analyze
from gpuidle.model import UTIL_SCHEMA, DeviceSeries, HostSeries, UtilizationReport, UtilSeries
from gpuidle.report.common import RenderOptions
from gpuidle.report.utilization import UtilJsonRenderer, UtilTerminalRenderer, load_util_report


def dev(index: int, t: list[float], util: list[float], **cols: list[float]) -> DeviceSeries:
    values = {"util_pct": np.asarray(util, dtype=float), **{k: np.asarray(v, dtype=float) for k, v in cols.items()}}
    return DeviceSeries(device=index, name=f"GPU{index}", t=np.asarray(t, dtype=float), values=values)


def host(t: list[float], cores: list[list[float]], **cols: list[float]) -> HostSeries:
    return HostSeries(t=np.asarray(t, dtype=float), cpu_pct=np.asarray(cores, dtype=float),
                      values={k: np.asarray(v, dtype=float) for k, v in cols.items()})


def series(*devices: DeviceSeries, h: HostSeries | None = None) -> UtilSeries:
    return UtilSeries(devices=list(devices), host=h, format="test", paths=["mem"], t0=0.0, interval_s=None)


SECONDS = [float(i) for i in range(10)]


def test_sample_weights_cap_gaps() -> None:
    # median interval 1 s; the 8 s gap counts for one interval; the last sample for the median
    assert sample_weights(np.array([0.0, 1.0, 2.0, 10.0, 11.0])).tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]
    assert sample_weights(np.array([0.0, 1.0, 3.0, 4.0])).tolist() == [1.0, 2.0, 1.0, 1.0]


def test_window_mean_median_and_time_below() -> None:
    u = [0, 50, 85, 95, 100, 79, 89, 90, 20, 0]
    a = analyze(series(dev(0, SECONDS, u)))
    w = a.window
    # idle (< 10 %) at both ends is left out: model loading and teardown
    assert (w.start_s, w.dur_s, w.leading_idle_s, w.trailing_idle_s, w.interval_s) == (1.0, 8.0, 1.0, 1.0, 1.0)
    d = a.devices[0]
    assert d.samples == 8
    assert d.mean_util_pct == 608 / 8
    assert d.median_util_pct == (85 + 89) / 2
    assert (d.below_80_s, d.below_80_share) == (3.0, 3 / 8)  # 50, 79, 20
    assert (d.below_90_s, d.below_90_share) == (5.0, 5 / 8)  # 50, 85, 79, 89, 20
    assert d.idle_s == 0.0


def test_irregular_samples_are_time_weighted() -> None:
    d = analyze(series(dev(0, [0.0, 1.0, 3.0, 4.0], [100, 40, 100, 100]))).devices[0]
    assert d.window_s == 5.0
    assert d.mean_util_pct == (100 + 2 * 40 + 100 + 100) / 5


def test_idle_periods() -> None:
    u = [50, 5, 5, 50, 0, 50, 3, 3, 3, 50]
    d = analyze(series(dev(0, SECONDS, u))).devices[0]
    assert runs_below(np.asarray(u, dtype=float), 10) == [(1, 3), (4, 5), (6, 9)]
    assert d.idle_period_count == 3
    assert d.idle_s == 6.0
    assert [(p.start_s, p.dur_s, p.mean_util_pct) for p in d.idle_periods] == [(6.0, 3.0, 3.0), (1.0, 2.0, 5.0),
                                                                               (4.0, 1.0, 0.0)]


def _periodic_series() -> tuple[list[float], list[float]]:
    t = [i * 0.5 for i in range(200)]
    u = [2.0 if any(s <= x < s + 3 for s in (10, 30, 50, 70, 90)) else 90.0 for x in t]
    return t, u


def test_periodic_drops_with_steps() -> None:
    t, u = _periodic_series()
    a = analyze(series(dev(0, t, u)), UtilOptions(steps_per_s=2.0))
    p = a.devices[0].periodic
    assert p is not None
    assert (p.threshold_pct, p.period_s, p.drop_s, p.count, p.regularity) == (10.0, 20.0, 3.0, 5, 1.0)
    assert (p.period_steps, p.drop_steps) == (40.0, 6.0)
    f = next(f for f in a.findings if f.kind == "periodic_drops")
    assert f.summary == ("utilization drops below 10 % every 20.0 s for ~3.0 s (5 times) "
                         "(every ~40 steps, ~6 steps long)")
    assert f.seconds == 15.0
    assert f.share == 15.0 / 100.0
    recs = recommend(a, 2.0)
    stall = next(r for r in recs if r.id == "periodic_stall")
    # removing 15 s of idle from 100 s at 87.4 % mean (85 s at 90 %, 15 s at 2 %)
    busy = (85 * 90 + 15 * 2) / 100
    assert stall.gain.utilization_after == pytest.approx(busy / (100 - 15))
    assert stall.gain.step_s_saved == pytest.approx(15 / 200)
    # counters see no step: a bound, not a measured point; the terminal says so
    g = stall.gain
    assert (g.basis, g.step_s_saved_low, g.step_s_saved_high) == ("modelled", 0.0, g.step_s_saved)
    assert g.assumption is not None
    assert "at most" in g.assumption
    assert g.utilization_before == pytest.approx(busy / 100)


def test_irregular_drops_are_not_periodic() -> None:
    t = np.arange(0, 60, 1.0)
    u = np.full(t.shape, 90.0)
    u[[10, 15, 50, 52]] = 0.0
    w = sample_weights(t)
    assert periodic_drops(t, w, u, 10.0, 1.0) is None  # gaps 5, 35, 2 s: one in three near the median
    assert analyze(series(dev(0, t.tolist(), u.tolist()))).devices[0].periodic is None


def test_period_must_be_resolved() -> None:
    t = np.arange(0, 20, 1.0)
    u = np.where(np.arange(20) % 2 == 0, 0.0, 90.0)  # every other sample: period = 2 intervals, just resolved
    p = periodic_drops(t, sample_weights(t), u, 10.0, 1.0)
    assert p is not None
    assert p.period_s == 2.0
    assert periodic_drops(t, sample_weights(t), u, 10.0, 1.5) is None


def test_imbalance() -> None:
    a = analyze(series(dev(0, SECONDS, [90] * 10), dev(1, SECONDS, [70] * 10)))
    f = next(f for f in a.findings if f.kind == "imbalance")
    assert f.device == 1
    assert f.evidence["spread_points"] == 20.0
    assert f.seconds == pytest.approx(10 * 0.2 / 2)
    low = next(f for f in a.findings if f.kind == "low_utilization")
    assert low.share == pytest.approx(1 - 0.8)
    assert low.seconds == pytest.approx((10 * 0.1 + 10 * 0.3) / 2)


def _host_case(disk: list[float] | None = None) -> UtilSeries:
    u = [90, 90, 20, 20, 20, 90, 5, 5, 90, 90]
    cores = [[50, 50]] * 2 + [[95, 95]] * 3 + [[50, 50]] + [[10, 20]] * 2 + [[50, 50]] * 2
    cols = {"disk_read_mib_s": disk} if disk is not None else {}
    return series(dev(0, SECONDS, u), h=host(SECONDS, cores, **cols))


def test_rule_of_thumb_input_bound_and_waiting() -> None:
    a = analyze(_host_case())
    h = a.host
    assert h is not None
    assert h.cores == 2
    assert (h.starved_s, h.starved_cpu_saturated_s, h.starved_cpu_idle_s, h.starved_other_s) == (5.0, 3.0, 2.0, 0.0)
    assert h.cpu_mean_pct == (50 * 5 + 95 * 3 + 15 * 2) / 10
    assert h.cpu_when_starved_pct == (95 * 3 + 15 * 2) / 5
    assert h.cpu_when_busy_pct == 50.0
    inp = next(f for f in a.findings if f.kind == "input_bound")
    assert inp.cause == "data_loading"
    assert inp.share == 0.3
    assert inp.seconds == pytest.approx(3 * 0.8)
    wait = next(f for f in a.findings if f.kind == "waiting_comm_or_io")
    assert wait.cause == "communication"
    assert wait.seconds == pytest.approx(2 * 0.95)
    recs = {r.id: r for r in recommend(a, steps_per_s=4.0)}
    mean = (90 * 5 + 20 * 3 + 5 * 2) / 100 / 10  # 0.52
    g = recs["input_pipeline_cpu"].gain
    assert g.utilization_after == pytest.approx(mean * 10 / (10 - 2.4))
    assert g.step_s_saved == pytest.approx(2.4 / 40)
    assert recs["profile_comm_or_io"].cause == "communication"


def test_disk_reads_when_starved_point_at_storage() -> None:
    a = analyze(_host_case(disk=[10, 10, 10, 10, 10, 10, 200, 200, 10, 10]))
    wait = next(f for f in a.findings if f.kind == "waiting_comm_or_io")
    assert wait.cause == "data_loading"
    assert wait.evidence["storage_io"] is True
    assert wait.evidence["disk_read_when_starved_mib_s"] == pytest.approx((10 * 3 + 200 * 2) / 5)
    assert any(r.id == "storage_io" for r in recommend(a))


def test_one_hot_core_is_not_an_idle_cpu() -> None:
    cores = [[50, 50]] * 2 + [[100, 0]] * 3 + [[50, 50]] * 5
    a = analyze(series(dev(0, SECONDS, [90, 90, 20, 20, 20, 90, 90, 90, 90, 90]), h=host(SECONDS, cores)))
    assert a.host is not None
    assert (a.host.starved_cpu_idle_s, a.host.starved_other_s) == (0.0, 3.0)


def test_memory_headroom_and_larger_batch() -> None:
    assert headroom_factor(20000, 81920) == 3  # floor(0.9 * 81920 / 20000) = floor(3.69)
    assert headroom_factor(50000, 81920) == 1
    a = analyze(series(dev(0, SECONDS, [60] * 10, mem_used_mib=[20000] * 10, mem_total_mib=[81920] * 10)))
    d = a.devices[0]
    assert d.mem_headroom_share == 1 - 20000 / 81920
    f = next(f for f in a.findings if f.kind == "memory_headroom")
    assert f.evidence["batch_factor"] == 3
    rec = next(r for r in recommend(a, steps_per_s=1.0) if r.id == "larger_batch_memory")
    # 6 s busy, 4 s idle, nothing else explains it: a 3x batch keeps the busy time, idle / 3
    assert rec.gain.utilization_after == pytest.approx(6 / (6 + 4 / 3))
    assert rec.gain.step_s_saved == pytest.approx(4 * (1 - 1 / 3) / 10)
    assert "lr = base_lr * 3" in rec.fix
    assert "accumulation" in rec.fix
    assert rec.cause == "spare_memory"  # unused memory is its own kind, not an idle cause


def test_throttling_and_sm_activity() -> None:
    a = analyze(series(dev(0, SECONDS, [95] * 10, throttle_reasons=[4, 0] * 5, sm_active=[0.3] * 10,
                           sm_clock_mhz=[1200] * 10)))
    d = a.devices[0]
    assert d.throttle_share == {"sw_power_cap": 0.5}
    assert d.sm_active_mean == pytest.approx(0.3)
    kinds = {f.kind for f in a.findings}
    assert {"throttling", "sm_underused"} <= kinds
    assert "low_utilization" not in kinds
    assert any("SM_ACTIVE (DCGM) measures" in n for n in a.notes)


def test_host_only_series() -> None:
    s = series(h=host([0.0, 0.5, 1.0], [[10.0], [20.0], [30.0]]))
    s.gpu_unavailable = "no GPU"
    a = analyze(s)
    assert a.devices == []
    assert a.findings == []
    assert (a.window.start_s, a.window.dur_s) == (0.0, 1.5)
    assert a.host is not None
    assert a.host.cpu_mean_pct == 20.0
    text = UtilTerminalRenderer().render(build_report(s, a))
    assert "GPUs: unavailable (no GPU)" in text


def test_devices_option_and_used_devices() -> None:
    s = series(dev(0, SECONDS, [90] * 10), dev(1, SECONDS, [10] * 10))
    assert [d.device for d in analyze(s, UtilOptions(devices=[1])).devices] == [1]
    s.used_devices = [0]
    a = analyze(s)
    assert [d.device for d in a.devices] == [0]
    assert "devices used by the command: [0]" in a.notes
    s.used_devices = []
    assert [d.device for d in analyze(s).devices] == [0, 1]


def test_report_json_and_terminal() -> None:
    t, u = _periodic_series()
    s = series(dev(0, t, u, mem_used_mib=[1000] * 200, mem_total_mib=[16000] * 200))
    report = build_report(s, analyze(s, UtilOptions(steps_per_s=2.0)), 2.0)
    text = UtilJsonRenderer().render(report)
    data = msgspec.json.decode(text)
    assert data["schema"] == UTIL_SCHEMA
    assert data["devices"][0]["periodic"]["period_s"] == 20.0
    assert isinstance(load_util_report(text), UtilizationReport)
    term = UtilTerminalRenderer().render(report, RenderOptions(top=2))
    assert "periodic: device 0 drops below 10 % every 20.0 s for ~3.0 s (5 times) (every ~40 steps)" in term
    assert "utilization.gpu is the share of time" in term
    stall = next(r for r in report.recommendations if r.id == "periodic_stall")
    assert f"saves up to {stall.gain.step_s_saved * 1e3:.1f}" in term.replace(",", "")


# ----------------------------------------------------------------------------------
# A plain reference: one loop per figure, no numpy, compared on random series
# ----------------------------------------------------------------------------------


def ref_device(t: list[float], u: list[float], idle: float = 10.0) -> dict[str, float]:
    n = len(t)
    gaps = [t[i + 1] - t[i] for i in range(n - 1)]
    med = statistics.median(gaps)
    w = [med if g > 3 * med else g for g in gaps] + [med]
    busy = [i for i in range(n) if not math.isnan(u[i]) and u[i] >= idle]
    start, end = t[busy[0]], t[busy[-1]] + w[busy[-1]]
    total = mean = below80 = idle_s = 0.0
    runs, in_run = 0, False
    for i in range(n):
        if not (start <= t[i] < end) or math.isnan(u[i]):
            continue
        wi = min(w[i], end - t[i])
        total += wi
        mean += wi * u[i]
        below80 += wi if u[i] < 80 else 0.0
        if u[i] < idle:
            idle_s += wi
            runs += 0 if in_run else 1
            in_run = True
        else:
            in_run = False
    return {"start": start, "dur": end - start, "window_s": total, "mean": mean / total,
            "below80": below80, "idle_s": idle_s, "runs": runs}


@pytest.mark.parametrize("seed", range(8))
def test_device_figures_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    t, x = [], 0.0
    for _ in range(300):
        t.append(round(x, 3))
        x += rng.choice([0.1, 0.1, 0.1, 0.12, 0.08, 0.9])  # jitter, and now and then a gap
    u = [rng.choice([0.0, 3.0, 50.0, 85.0, 95.0, 100.0, math.nan]) for _ in t]
    u[5] = 60.0
    ref = ref_device(t, u)
    a = analyze(series(dev(0, t, u)))
    d = a.devices[0]
    assert a.window.start_s == pytest.approx(ref["start"])
    assert a.window.dur_s == pytest.approx(ref["dur"])
    assert d.window_s == pytest.approx(ref["window_s"])
    assert d.mean_util_pct == pytest.approx(ref["mean"])
    assert d.below_80_s == pytest.approx(ref["below80"])
    assert d.idle_s == pytest.approx(ref["idle_s"])
    assert d.idle_period_count == ref["runs"]


def test_advice_merges_throttled_devices_and_ranks_by_utilization_after() -> None:
    a = analyze(series(dev(0, SECONDS, [95] * 10, throttle_reasons=[4] * 10),
                       dev(1, SECONDS, [95] * 10, throttle_reasons=[0x40] * 10)))
    recs = [r for r in recommend(a) if r.id == "clock_throttling"]
    assert len(recs) == 1
    assert recs[0].evidence["devices"] == [0, 1]
    assert recs[0].evidence["reasons"] == ["hw_thermal_slowdown", "sw_power_cap"]
    t, u = _periodic_series()
    mixed = recommend(analyze(series(dev(0, t, u, mem_used_mib=[1000] * 200, mem_total_mib=[16000] * 200),
                                     dev(1, t, [x * 0.7 for x in u]))))
    after = [r.gain.utilization_after for r in mixed]
    assert after == sorted(after, reverse=True)


def test_pointer_to_the_tools_only_when_utilization_is_low() -> None:
    assert not any(r.id == "find_the_cause" for r in recommend(analyze(series(dev(0, SECONDS, [85] * 10)))))
    low = recommend(analyze(series(dev(0, SECONDS, [60] * 10))))
    assert [r.id for r in low] == ["find_the_cause"]


def _drops_log(offsets: list[float]) -> tuple[UtilSeries, dict[str, float]]:
    """GPUs sampled each second, each GPU's lines ``offset`` s later (as real logs are), idle for the first 5 s
    and after 125 s, at 90 % otherwise but for 6 drops to 2 %, 3 s each, every 20 s from 15 s."""
    base = np.arange(0.0, 131.0)
    u = np.where((base >= 5) & (base < 125), 90.0, 0.0)
    for start in range(15, 125, 20):
        u[(base >= start) & (base < start + 3)] = 2.0
    devices = [dev(i, list(base + off), list(u)) for i, off in enumerate(offsets)]
    active = (base >= 5) & (base < 125)
    busy = float(np.sum(u[active]) / 100)          # busy seconds in the active 120 s of each GPU
    truth = {"drops": 6, "idle_s": 18.0, "active_s": float(active.sum()), "busy_s": busy,
             "after": busy / (float(active.sum()) - 18.0)}
    return series(*devices), truth


def test_per_gpu_timestamp_offsets_leave_no_sliver() -> None:
    s, truth = _drops_log([0.0, 0.004, 0.007, 0.011])
    a = analyze(s)
    for d in a.devices:
        assert d.idle_period_count == truth["drops"]          # not 7: no 4-11 ms idle sliver at the end
        assert d.idle_s == pytest.approx(truth["idle_s"])
        assert d.periodic is not None
        assert d.periodic.count == truth["drops"]
        assert d.window_s == pytest.approx(truth["active_s"])
        assert d.mean_util_pct == pytest.approx(100 * truth["busy_s"] / truth["active_s"])
    (f,) = [f for f in a.findings if f.kind == "periodic_drops"]
    assert f.evidence["count"] == truth["drops"]
    stall = next(r for r in recommend(a) if r.id == "periodic_stall")
    # 92.16 busy seconds of 120, 18 s of drops removed: 92.16 / 102 = 90.4 %
    assert stall.gain.utilization_after == pytest.approx(truth["after"], abs=5e-4)


def test_idle_column_says_periods_and_their_total() -> None:
    s, truth = _drops_log([0.0, 0.004])
    text = UtilTerminalRenderer().render(build_report(s, analyze(s)), RenderOptions(width=200))
    assert f"{truth['drops']} periods, {truth['idle_s']:.1f} s in all" in text   # 6 periods totalling 18 s
    assert "6× 18.0 s" not in text


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_device_table_leaves_columns_out_rather_than_cut_a_figure(width: int) -> None:
    """At any width every header and figure of the device table is whole: columns are left out, and named."""
    from gpuidle.report.common import RenderOptions
    from gpuidle.report.utilization import UtilTerminalRenderer

    report = api.summarize_log(DATA / "smi" / "query_gpu_units.csv")
    text = UtilTerminalRenderer().render(report, RenderOptions(width=width))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("device "))
    head, rows = lines[at], lines[at + 1:at + 1 + len(report.devices)]
    assert "…" not in "\n".join([head, *rows])
    assert max(len(line) for line in [head, *rows]) <= width
    assert head.split()[:3] == ["device", "mean", "median"]
    for d, row in zip(report.devices, rows, strict=True):
        cells = [c for c in row.split() if not set(c) <= set("█░")]  # the bar, where shown
        assert cells[:5] == [str(d.device), f"{d.mean_util_pct:.1f}", "%", f"{d.median_util_pct:.1f}", "%"]
    assert ("not shown at" in text) == (width < 120)
