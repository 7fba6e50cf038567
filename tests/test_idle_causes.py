"""Each idle cause on a hand-built trace, with exact expected nanoseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuidle.api import analyze
from gpuidle.model import CAUSES, RankReport
from minitrace import BWD, Trace

US = 1e-6


def run(t: Trace, tmp_path: Path) -> RankReport:
    (rank,) = analyze([t.write(tmp_path / "trace.json.gz")]).ranks
    return rank


def causes_us(rank: RankReport) -> dict[str, float]:
    d = rank.primary()
    return {k: round(v / US, 3) for k, v in d.idle_by_cause_s.items() if v}


def test_data_loading_then_launch(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 400)
    t.op("aten::linear", 400, 100)
    t.launch(at=450, call_dur=10, start=500, dur=500)
    r = run(t, tmp_path)
    d = r.primary()
    assert d.window_s == pytest.approx(1000 * US)
    assert d.busy_s == pytest.approx(500 * US)
    # [0,400) in __next__; [400,450) in an op that launches; [450,500) the launch in flight
    assert causes_us(r) == {"data_loading": 400, "launch_overhead": 100}
    assert r.step_source == "profiler_step"


def test_host_sync(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=10, start=10, dur=290)
    t.runtime("cudaStreamSynchronize", 20, 330)  # waits for the kernel, returns at 350
    t.op("aten::add", 350, 30)
    t.launch(at=360, call_dur=10, start=400, dur=600)
    r = run(t, tmp_path)
    # [0,10) first launch in flight; [300,350) blocked in the sync; [350,360) op launching; [360,400) in flight
    assert causes_us(r) == {"host_sync": 50, "launch_overhead": 60}
    assert r.kernels.syncs_per_step == 1


def test_item_is_host_sync_and_counted(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=5, start=5, dur=195)
    t.op("aten::item", 10, 290)
    t.op("aten::_local_scalar_dense", 15, 280)
    t.launch(at=600, call_dur=10, start=700, dur=300)
    r = run(t, tmp_path)
    # [200,300) inside .item(); [300,600) nothing recorded; [0,5) in flight. The second kernel starts 90 µs
    # after its 10 µs launch call returned: launching costs the call plus at most 50 µs of queue, so
    # [600,660) is its launch and [660,700) is waiting on something the trace does not show (this was
    # 100 µs of launch_overhead before launches were bounded by what they cost)
    assert causes_us(r) == {"host_sync": 100, "unattributed": 340, "launch_overhead": 65}
    assert r.kernels.item_calls_per_step == 1


def test_cpu_compute_inside_an_op_that_launches_nothing(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=10, start=10, dur=90)
    t.op("aten::to_dense_on_cpu", 100, 500)  # launches nothing
    t.op("aten::mm", 600, 50)
    t.launch(at=610, call_dur=10, start=650, dur=350)
    r = run(t, tmp_path)
    # [100,600) cpu work; [600,610) op launching; [610,650) and [0,10) in flight
    assert causes_us(r) == {"cpu_compute": 500, "launch_overhead": 60}


def test_pageable_copy_is_memcpy(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=10, start=10, dur=90)
    t.op("aten::copy_", 100, 320)
    t.launch(at=120, call_dur=300, start=380, dur=20, name="Memcpy HtoD (Pageable -> Device)",
             kind="gpu_memcpy", call="cudaMemcpyAsync", bytes=1 << 20)
    t.launch(at=430, call_dur=10, start=450, dur=550)
    r = run(t, tmp_path)
    # [100,120) op launching; [120,380) staging the pageable copy (in flight); [400,420) still in the
    # blocking copy call; [420,430) Python; [430,450) and [0,10) in flight
    assert causes_us(r) == {"memcpy": 280, "launch_overhead": 50, "unattributed": 10}
    assert r.kernels.pageable_htod_copies == 1
    assert r.kernels.pageable_htod_bytes == 1 << 20


def test_exposed_collective_is_communication(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=10, start=10, dur=390)
    t.launch(at=20, call_dur=10, start=300, dur=400, stream=20,
             name="ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)")
    t.launch(at=30, call_dur=10, start=800, dur=200)
    r = run(t, tmp_path)
    c = r.communication
    # collective [300,700): overlapped with compute [300,400), exposed [400,700)
    assert c.comm_s == pytest.approx(400 * US)
    assert c.exposed_s == pytest.approx(300 * US)
    assert c.overlap_ratio == pytest.approx(0.25)
    # [400,700) communication; [700,800) after the collective, nothing on the host: unattributed
    # ([30,40) launch of the last kernel is not in its gap); [0,10) in flight
    assert causes_us(r) == {"communication": 300, "unattributed": 100, "launch_overhead": 10}
    d = r.primary()
    assert d.active_s == pytest.approx(890 * US)
    assert d.busy_s == pytest.approx(590 * US)


def test_backward_thread_feeds_the_device(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=10, start=10, dur=190)
    t.op("autograd::engine::evaluate_function: MmBackward0", 200, 400, tid=BWD)
    t.op("aten::cpu_side_helper", 250, 100, tid=BWD)  # nested, launches nothing
    t.launch(at=500, call_dur=10, start=600, dur=400, tid=BWD)
    r = run(t, tmp_path)
    # The backward thread's work counts. [250,350) nested CPU-only op. The backward op spends 290 µs of its
    # own host time for one launch, far over the 100 µs dispatching one costs, so its self time [200,250),
    # [350,500), [560,600) is CPU work (this was launch_overhead before operators were bounded by what their
    # launches cost). [500,510) the launch call, [510,560) its queue; [0,10) in flight
    assert causes_us(r) == {"cpu_compute": 340, "launch_overhead": 70}


def test_causes_sum_to_idle_per_step(tmp_path: Path) -> None:
    t = Trace()
    for n, base in enumerate((0, 1000, 2000), start=1):
        t.step(n, base, 1000)
        t.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, 100 * n)
        t.launch(at=base + 100 * n, call_dur=10, start=base + 100 * n + 20, dur=500)
    r = run(t, tmp_path)
    assert [s.step for s in r.steps] == [1, 2, 3]
    for s in r.steps:
        assert s.busy_s + sum(s.idle_by_cause_s.values()) == pytest.approx(s.dur_s, abs=1e-12)
    assert [round(s.idle_by_cause_s["data_loading"] / US) for s in r.steps] == [100, 200, 300]
    assert set(r.steps[0].idle_by_cause_s) == {c.value for c in CAUSES}


def test_window_extends_to_gpu_work_of_the_last_step(tmp_path: Path) -> None:
    t = Trace()
    t.step(1, 0, 500)
    t.step(2, 500, 500)
    t.launch(at=900, call_dur=10, start=950, dur=300)  # runs past the end of step 2
    t.launch(at=1200, call_dur=10, start=1300, dur=100)  # launched after the steps: outside
    r = run(t, tmp_path)
    assert r.window.dur_s == pytest.approx(1250 * US)
    assert r.steps[-1].dur_s == pytest.approx(750 * US)
    assert r.primary().busy_s == pytest.approx(300 * US)


def test_steps_inferred_from_dataloader(tmp_path: Path) -> None:
    t = Trace()
    for i in range(3):
        base = i * 1000
        t.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, 200)
        t.launch(at=base + 200, call_dur=10, start=base + 250, dur=700)
    r = run(t, tmp_path)
    assert r.step_source == "inferred:dataloader_next"
    assert len(r.steps) == 3
    assert r.window.kind == "inferred_steps"
    assert any("inferred" in n for n in r.notes)


def test_no_steps_window_is_gpu_activity(tmp_path: Path) -> None:
    t = Trace(rank=None)
    t.launch(at=0, call_dur=10, start=100, dur=100)
    t.launch(at=10, call_dur=10, start=300, dur=100)
    r = run(t, tmp_path)
    assert r.window.kind == "gpu_activity"
    assert r.window.dur_s == pytest.approx(300 * US)
    assert r.step_source == "none"
    assert any("no rank" in n for n in r.notes)
    assert r.rank == 0


def test_a_long_host_to_device_call_moving_little_is_a_wait_not_a_copy(tmp_path: Path) -> None:
    """A 493 ms cudaMemcpy to the device moving 64 KiB in 4.7 µs: the host waited for something the trace does
    not show, as in a blocking device-to-host copy; it is host_sync, and no pinned-memory fix is sized from it."""
    t = Trace()
    t.step(1, 0, 500_000)
    t.launch(at=0, call_dur=5, start=5, dur=95)
    t.launch(at=100, call_dur=493_000, start=493_090, dur=4.7, name="Memcpy HtoD (Pinned -> Device)",
             kind="gpu_memcpy", call="cudaMemcpy", bytes=64 << 10)
    t.launch(at=493_105, call_dur=5, start=493_112, dur=6_000)
    r = run(t, tmp_path)
    causes = causes_us(r)
    assert causes.get("memcpy", 0) < 100
    assert causes["host_sync"] > 490_000


def test_the_pinned_memory_fix_names_a_data_loader_only_where_the_trace_has_one(tmp_path: Path) -> None:
    def copies(with_loader: bool) -> Path:
        t = Trace()
        for n in range(4):
            base = n * 1000
            t.step(n + 1, base, 1000)
            if with_loader:
                t.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base + 1, 2)
            t.launch(at=base + 5, call_dur=5, start=base + 10, dur=90)
            t.launch(at=base + 120, call_dur=300, start=base + 380, dur=20, name="Memcpy HtoD (Pageable -> Device)",
                     kind="gpu_memcpy", call="cudaMemcpyAsync", bytes=1 << 20)
            t.launch(at=base + 430, call_dur=10, start=base + 450, dur=500)
        return t.write(tmp_path / f"copies_{with_loader}.json.gz")

    for with_loader in (True, False):
        report = analyze([copies(with_loader)])
        rec = next(r for r in report.recommendations if r.id == "pinned_memory_non_blocking")
        assert ("DataLoader(" in rec.fix) == with_loader
        assert rec.evidence["data_loader_in_trace"] is with_loader
        assert "non_blocking=True" in rec.fix
