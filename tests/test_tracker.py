"""The in-process step tracker on one process: lazy marker resolution, exact host timing,
the exchange and straggler split, its log format, the reader and ``gpuidle analyze``."""

from __future__ import annotations

import gc
import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from gpuidle.analysis.series import HOST_TIMED_NOTE, rank_report, split_steps, straggler_split
from gpuidle.api import analyze, analyze_tracker
from gpuidle.cli import main
from gpuidle.errors import CorruptInput, GpuidleError, NotATrace
from gpuidle.live.tracker import HostClock, Marker, StepTracker, batch_size, timed_hook
from gpuidle.live.tracker.ddp import comm_times
from gpuidle.model import CAUSES, TRACKER_SUMMARY, AnalysisReport, StepSeries
from gpuidle.sources import tracker as reader

MS = 1_000_000


class FakeClock:
    """The host clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t

    def add(self, ns: int) -> None:
        self.t += ns


class FakeMarker:
    def __init__(self, dev: FakeDevice, at: int) -> None:
        self.dev = dev
        self.at = at

    def query(self) -> bool:
        self.dev.queries += 1
        return self.dev.now >= self.at

    def synchronize(self) -> None:
        self.dev.syncs += 1
        self.dev.now = max(self.dev.now, self.at)


class FakeDevice:
    """A device with a work queue: ``work(ns)`` enqueues, ``run(ns)`` lets it execute.

    A marker completes once the device has executed everything enqueued before it, as a
    CUDA event recorded on a stream does. Reading an incomplete one is a bug, counted.
    """

    def __init__(self) -> None:
        self.now = 0
        self.queued = 0
        self.queries = self.syncs = self.marks = self.released = self.early_reads = 0

    def work(self, ns: int) -> None:
        self.queued += ns

    def run(self, ns: int) -> None:
        self.now = min(self.queued, self.now + ns)

    def mark(self) -> FakeMarker:
        self.marks += 1
        return FakeMarker(self, self.queued)

    def elapsed_ns(self, start: Marker, end: Marker) -> int:
        assert isinstance(start, FakeMarker)
        assert isinstance(end, FakeMarker)
        if self.now < end.at:
            self.early_reads += 1
        return end.at - start.at

    def release(self, markers: Iterable[Marker]) -> None:
        self.released += len(list(markers))


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _steps(path: Path) -> list[dict[str, object]]:
    return [x for x in _lines(path) if x["type"] == "step"]


def _loop(tr: StepTracker, clk: FakeClock, dev: FakeDevice | None, steps: int, run_ns: int,
          data_ns: int = 1 * MS) -> None:
    """Steps of 1 ms data wait, then phases with known host and device time."""

    class Loader:
        def __iter__(self) -> Iterator[torch.Tensor]:
            for _ in range(steps):
                clk.add(data_ns)
                yield torch.zeros(8, 3)

    for _ in tr.loader(Loader()):
        for name, host, device in (("h2d", 1 * MS, 1 * MS), ("forward", 2 * MS, 3 * MS),
                                   ("backward", 3 * MS, 6 * MS), ("optimizer", 1 * MS, 1 * MS)):
            with tr.phase(name):
                clk.add(host)
                if dev is not None:
                    dev.work(device)
        tr.step()
        if dev is not None:
            dev.run(run_ns)


# ----------------------------------------------------------------------------------
# Lazy resolution of device markers
# ----------------------------------------------------------------------------------


def test_device_markers_are_read_late_never_waited_for_when_the_device_keeps_up(tmp_path: Path) -> None:
    clk, dev = FakeClock(), FakeDevice()
    tr = StepTracker(tmp_path, device_clock=dev, clock=clk, every=4, log=lambda _: None)
    # the device runs a step's 11 ms of work per step, one step behind the host: never more than 2 steps
    _loop(tr, clk, dev, steps=12, run_ns=11 * MS)
    assert dev.syncs == 0
    assert tr.forced_waits == 0
    tr.close()
    assert dev.early_reads == 0
    steps = _steps(tmp_path / "rank-0.jsonl")
    assert [s["step"] for s in steps] == list(range(12))
    for s in steps:
        assert s["device_phases"] == {"h2d": 1 * MS, "forward": 3 * MS, "backward": 6 * MS, "optimizer": 1 * MS,
                                      "other": 0}
        assert s["phases"] == {"h2d": 1 * MS, "forward": 2 * MS, "backward": 3 * MS, "optimizer": 1 * MS, "other": 0}
    assert dev.released == dev.marks == 12 * 8


def test_a_device_far_behind_is_waited_for_only_past_the_lag(tmp_path: Path) -> None:
    clk, dev = FakeClock(), FakeDevice()
    tr = StepTracker(tmp_path, device_clock=dev, clock=clk, every=100, resolve_lag=3, log=lambda _: None)
    _loop(tr, clk, dev, steps=10, run_ns=0)  # the device never runs by itself
    # steps 0..6 had to be read by step 10 (lag 3): each waited for once, the rest still queued
    assert dev.syncs == 7
    assert tr.forced_waits == 7
    assert len(tr._pending) == 3
    tr.close()
    assert dev.syncs == 10
    assert dev.early_reads == 0
    assert all(s["device_phases"]["backward"] == 6 * MS for s in _steps(tmp_path / "rank-0.jsonl"))


def test_markers_resolve_in_step_order_as_soon_as_complete(tmp_path: Path) -> None:
    clk, dev = FakeClock(), FakeDevice()
    tr = StepTracker(tmp_path, device_clock=dev, clock=clk, every=100, resolve_lag=50, log=lambda _: None)
    _loop(tr, clk, dev, steps=6, run_ns=0)
    assert len(tr._rows) == 0
    dev.run(11 * MS * 2 + 1)  # two steps done, the third begun
    _loop(tr, clk, dev, steps=1, run_ns=0)
    assert [int(r[0]) for r in tr._rows] == [0, 1]
    assert dev.syncs == 0
    tr.close()


# ----------------------------------------------------------------------------------
# Host timing, the step boundaries, the log
# ----------------------------------------------------------------------------------


def test_host_timing_is_exact_and_says_so(tmp_path: Path) -> None:
    clk = FakeClock()
    lines: list[str] = []
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, every=5, log_every=5, log=lines.append)
    _loop(tr, clk, None, steps=10, run_ns=0)
    report = tr.close()
    assert report is not None
    head = _lines(tmp_path / "rank-0.jsonl")[0]
    assert head["timing"] == "host"
    assert HOST_TIMED_NOTE in head["notes"]
    assert lines[0] == HOST_TIMED_NOTE
    assert any(line.startswith("step 5 | 8 ms | host busy 75 % | data wait 12 %") for line in lines)
    for s in _steps(tmp_path / "rank-0.jsonl"):
        assert s["dur_ns"] == 8 * MS
        assert s["data_ns"] == 1 * MS
        assert s["samples"] == 8
        assert s["batches"] == 1
        assert "device_phases" not in s
    (rank,) = report.ranks
    d = rank.primary()
    assert d.window_s == pytest.approx(0.080)
    assert d.busy_s == pytest.approx(0.060)
    assert d.idle_by_cause_s["data_loading"] == pytest.approx(0.010)
    assert d.idle_by_cause_s["memcpy"] == pytest.approx(0.010)
    assert sum(d.idle_by_cause_s.values()) == pytest.approx(d.idle_s)
    assert HOST_TIMED_NOTE in rank.notes
    assert (tmp_path / TRACKER_SUMMARY).exists()
    assert [r.id for r in report.recommendations] == ["dataloader_workers", "pinned_memory_non_blocking"]


def test_a_new_pass_over_the_loader_starts_a_new_step(tmp_path: Path) -> None:
    clk = FakeClock()
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, log=lambda _: None)
    _loop(tr, clk, None, steps=2, run_ns=0)
    clk.add(500 * MS)  # evaluation between epochs: no step's time
    _loop(tr, clk, None, steps=2, run_ns=0)
    tr.close()
    assert [s["dur_ns"] for s in _steps(tmp_path / "rank-0.jsonl")] == [8 * MS] * 4


def test_phases_without_a_column_add_to_other_and_begin_end_works(tmp_path: Path) -> None:
    clk = FakeClock()
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, log=lambda _: None)
    tr.begin("forward")
    clk.add(2 * MS)
    tr.end("forward")
    with tr.phase("logging"):
        clk.add(3 * MS)
    tr.add_time("checkpoint", 1 * MS)
    tr.add_data_wait(4 * MS, samples=16)
    tr.begin("optimizer")
    clk.add(1 * MS)
    tr.step()  # closes the open phase
    tr.close()
    (s,) = _steps(tmp_path / "rank-0.jsonl")
    assert s["phases"] == {"h2d": 0, "forward": 2 * MS, "backward": 0, "optimizer": 1 * MS, "other": 4 * MS}
    assert s["data_ns"] == 4 * MS
    assert s["samples"] == 16


def test_bad_arguments_are_gpuidle_errors(tmp_path: Path) -> None:
    with pytest.raises(GpuidleError, match="every"):
        StepTracker(tmp_path, every=0)
    tr = StepTracker(tmp_path, device_clock=None, log=lambda _: None)
    with pytest.raises(GpuidleError, match="consecutive"):
        tr.profile(range(5, 10, 2))
    with pytest.raises(GpuidleError, match="DistributedDataParallel"):
        tr.watch_ddp(torch.nn.Linear(2, 2))
    tr.close()


def test_an_exception_keeps_the_steps_and_says_why(tmp_path: Path) -> None:
    clk = FakeClock()

    def train() -> None:
        with StepTracker(tmp_path, device_clock=None, clock=clk, every=50, log=lambda _: None) as tr:
            _loop(tr, clk, None, steps=3, run_ns=0)
            raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        train()
    lines = _lines(tmp_path / "rank-0.jsonl")
    assert [x["step"] for x in lines if x["type"] == "step"] == [0, 1, 2]
    assert "closed by RuntimeError" in lines[-1]["notes"][0]
    assert not (tmp_path / TRACKER_SUMMARY).exists()


def test_batch_size() -> None:
    assert batch_size(torch.zeros(5, 2)) == 5
    assert batch_size((torch.zeros(3), torch.zeros(3))) == 3
    assert batch_size({"input_ids": torch.zeros(7, 4), "labels": torch.zeros(7)}) == 7
    assert batch_size([{"x": torch.zeros(2, 1)}]) == 2
    assert batch_size("text") == 0


# ----------------------------------------------------------------------------------
# Cost: what the tracker does per step, and what only every K steps
# ----------------------------------------------------------------------------------


def test_exchanges_and_writes_happen_every_k_steps_not_every_step(tmp_path: Path) -> None:
    clk, dev = FakeClock(), FakeDevice()
    calls: list[int] = []

    def gather(rows: np.ndarray) -> np.ndarray:
        calls.append(rows.shape[0])
        return rows[None]

    tr = StepTracker(tmp_path, device_clock=dev, clock=clk, every=10, resolve_lag=2, gather=gather,
                     log=lambda _: None)
    writes: list[int] = []
    real = tr._file.write
    tr._file.write = lambda b: writes.append(1) or real(b)  # type: ignore[method-assign]
    _loop(tr, clk, dev, steps=35, run_ns=11 * MS)
    assert calls == [8, 10, 10]  # the first window waits for the lag
    assert len(writes) == 3
    assert dev.marks == 35 * 8  # two markers per phase, nothing else
    tr.close()
    assert calls == [8, 10, 10, 7]
    assert dev.syncs == 0


# ----------------------------------------------------------------------------------
# Communication and the straggler split
# ----------------------------------------------------------------------------------


class FakeBucket:
    def __init__(self, n: int) -> None:
        self._buf = torch.zeros(n)

    def buffer(self) -> torch.Tensor:
        return self._buf


def test_timed_hook_marks_each_bucket_ready_and_done() -> None:
    events: list[str] = []
    entries: list[list[object]] = []

    def inner(state: object, bucket: FakeBucket) -> torch.futures.Future[torch.Tensor]:
        events.append("inner")
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer() + 1)
        return fut

    def ready(buf: torch.Tensor) -> list[object]:
        events.append(f"ready {buf.numel()}")
        entry: list[object] = [buf.numel(), None]
        entries.append(entry)
        return entry

    def done(entry: list[object]) -> None:
        events.append("done")
        entry[1] = "done"

    hook = timed_hook(inner, ready, done)
    out = hook(None, FakeBucket(4)).wait()
    assert torch.equal(out, torch.ones(4))
    assert events == ["ready 4", "inner", "done"]
    assert entries == [[4, "done"]]


def test_bucket_times_union_and_exposed(tmp_path: Path) -> None:
    clk = FakeClock()
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, log=lambda _: None)
    host = HostClock(clk)
    t0 = clk.t

    def at(ns: int) -> object:
        return host.mark() if clk.add(ns - (clk.t - t0)) is None else None

    a_ready = at(0)
    b_ready = at(2 * MS)
    a_done = at(3 * MS)
    c_ready = at(5 * MS)
    b_done = at(6 * MS)
    c_done = at(9 * MS)
    union, exposed = comm_times(host, [[a_ready, a_done, 0], [b_ready, b_done, 0], [c_ready, c_done, 0]])
    assert union == 9 * MS
    assert exposed == 4 * MS  # the last bucket was ready at 5 ms, the last done at 9 ms
    tr.close()


def _swept(spans_us: list[tuple[int, int]]) -> tuple[int, int]:
    """Reference: a tick per µs. Communication runs in a tick some bucket's [ready, done) covers;
    exposed are those ticks after the last bucket was handed over (no gradient is computed then)."""
    end = max(b for _, b in spans_us)
    running = np.zeros(end, dtype=bool)
    for a, b in spans_us:
        running[a:b] = True
    last_ready = max(a for a, _ in spans_us)
    return int(running.sum()) * 1000, int(running[last_ready:].sum()) * 1000


@pytest.mark.parametrize("spans_us", [
    [(0, 3_000), (2_000, 6_000), (5_000, 9_000)],  # buckets overlapping backward, in order
    [(0, 30_000), (10_000, 31_000)],  # a heavy early bucket: the last one waits behind it in the queue
    [(0, 40_000), (10_000, 12_000)],  # the heavy early bucket ends after the last one
    [(1_000, 2_000), (4_000, 5_000), (9_000, 25_000)],  # gaps between, then a heavy last bucket
    [(7_000, 18_000)],  # one bucket: everything after it was handed over
])
def test_bucket_booking_agrees_with_a_sweep(spans_us: list[tuple[int, int]]) -> None:
    clk = FakeClock()
    host = HostClock(clk)
    t0 = clk.t

    def mark(us: int) -> Marker:
        clk.t = t0 + us * 1000
        return host.mark()

    buckets: list[list[object]] = [[mark(a), mark(b), 0] for a, b in spans_us]
    assert comm_times(host, buckets) == _swept(spans_us)


def test_straggler_split_is_the_excess_over_the_last_rank() -> None:
    exposed = np.array([[5, 1, 7], [1, 4, 7], [3, 1, 7]]) * MS
    np.testing.assert_array_equal(straggler_split(exposed), np.array([[4, 0, 0], [0, 3, 0], [2, 0, 0]]) * MS)


def test_exchange_splits_the_wait_and_rank0_names_the_straggler(tmp_path: Path) -> None:
    """Two ranks in one process: the other rank's rows are this rank's with 4 ms more forward
    and 4 ms less exposed communication; this rank waits 4 ms per step for it."""
    clk = FakeClock()
    phases = ["h2d", "forward", "backward", "optimizer", "other"]
    host_cols = {p: 4 + i for i, p in enumerate(phases)}
    exposed_col = 4 + 2 * len(phases) + 1

    def gather(rows: np.ndarray) -> np.ndarray:
        if rows.shape[1] == 1:
            return np.stack([rows, rows])
        other = rows.copy()
        other[:, host_cols["forward"]] += 4 * MS
        other[:, host_cols["backward"]] -= 4 * MS
        other[:, exposed_col] -= 4 * MS
        return np.stack([rows, other])

    tr = StepTracker(tmp_path, device_clock=None, clock=clk, every=5, gather=gather, rank=0, world_size=2,
                     log=lambda _: None)
    for _ in range(10):
        with tr.phase("forward"):
            clk.add(2 * MS)
        with tr.phase("backward"):
            clk.add(10 * MS)
            tr._open.comm.append([tr._comm_clock.mark(), None, 1024])
            clk.add(5 * MS)
            tr._open.comm[-1][1] = tr._comm_clock.mark()
        tr.step()
    report = tr.close()
    assert report is not None
    steps = _steps(tmp_path / "rank-0.jsonl")
    assert {s["comm_exposed_ns"] for s in steps} == {5 * MS}
    assert {s["straggler_ns"] for s in steps} == {4 * MS}
    assert report.job is not None
    (st,) = report.job.stragglers
    assert st.rank == 1
    assert st.score == pytest.approx(17 / 13)
    assert st.cause == "compute"
    assert "forward" in st.why
    assert report.recommendations[0].id == "straggler_rank_1"
    r0 = report.ranks[0].primary()
    assert r0.idle_by_cause_s["straggler_wait"] == pytest.approx(0.040)
    assert r0.idle_by_cause_s["communication"] == pytest.approx(0.010)
    assert {s.last_rank for s in report.job.steps} == {1}


# ----------------------------------------------------------------------------------
# The analysis of a series, the reader, the API and the CLI
# ----------------------------------------------------------------------------------


def _series(n: int = 4, **cols: np.ndarray) -> StepSeries:
    z = np.zeros(n, dtype=np.int64)
    base: dict[str, object] = {
        "rank": 0, "world_size": 1, "path": "rank-0.jsonl", "timing": "host", "device": 0, "device_name": None,
        "compute_phases": ["forward", "backward", "optimizer"], "copy_phase": "h2d", "step": np.arange(n),
        "start": z, "dur": z, "data": z, "phases": {}, "device_phases": {}, "comm": z, "comm_exposed": z,
        "straggler": z, "buckets": z, "bucket_bytes": z, "samples": z, "batches": z,
        "profiled": np.zeros(n, dtype=bool),
    }
    base.update(cols)
    return StepSeries(**base)  # type: ignore[arg-type]


def test_causes_are_capped_in_order_and_add_up_to_idle() -> None:
    ms = np.full(3, MS)
    s = _series(3, dur=10 * ms, data=4 * ms, phases={"forward": 3 * ms, "backward": 4 * ms, "h2d": 2 * ms},
                comm_exposed=2 * ms, straggler=ms)
    split = split_steps(s)
    np.testing.assert_array_equal(split.busy, 5 * ms)
    row = dict(zip([c.value for c in CAUSES], split.causes[0], strict=True))
    assert row["straggler_wait"] == MS
    assert row["communication"] == MS
    assert row["data_loading"] == 3 * MS  # capped: only 3 ms of idle left
    assert row["memcpy"] == 0
    np.testing.assert_array_equal(split.causes.sum(axis=1), split.idle)


def test_profiled_steps_are_left_out_with_a_note() -> None:
    ms = np.full(4, MS)
    s = _series(4, dur=np.array([10, 10, 30, 10]) * MS, phases={"forward": 5 * ms},
                profiled=np.array([False, False, True, False]))
    r = rank_report(s)
    assert [x.step for x in r.steps] == [0, 1, 3]
    assert any("1 profiled step(s) left out" in n for n in r.notes)


def _write_run(tmp_path: Path, steps: int = 6) -> Path:
    clk = FakeClock()
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, every=3, log=lambda _: None)
    _loop(tr, clk, None, steps=steps, run_ns=0)
    tr.close()
    return tmp_path


def test_the_reader_gives_back_what_the_tracker_wrote(tmp_path: Path) -> None:
    run = _write_run(tmp_path)
    s = reader.read_log(run / "rank-0.jsonl")
    assert len(s) == 6
    assert s.timing == "host"
    np.testing.assert_array_equal(s.dur, np.full(6, 8 * MS))
    np.testing.assert_array_equal(s.phases["backward"], np.full(6, 3 * MS))
    assert reader.is_tracker_path(run)
    assert reader.is_tracker_path(run / "rank-0.jsonl")
    assert reader.is_tracker_path(run / TRACKER_SUMMARY)


def test_a_log_cut_short_is_read_with_a_note_and_a_broken_one_is_an_error(tmp_path: Path) -> None:
    run = _write_run(tmp_path)
    log = run / "rank-0.jsonl"
    text = log.read_bytes()
    lines = text.splitlines(keepends=True)
    cut = tmp_path / "cut" / "rank-0.jsonl"
    cut.parent.mkdir()
    cut.write_bytes(b"".join(lines[:4]) + lines[4][:20])
    s = reader.read_log(cut)
    assert len(s) == 3
    assert any("cut short" in n for n in s.notes)
    assert any("no end line" in n for n in s.notes)
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"".join(lines[:2]) + b"{nonsense\n" + b"".join(lines[2:]))
    with pytest.raises(CorruptInput, match=":3:"):
        reader.read_log(broken)
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(NotATrace):
        reader.read_log(other)


def test_analyze_reads_a_tracker_folder_like_a_trace_folder(tmp_path: Path) -> None:
    run = _write_run(tmp_path)
    summary = AnalysisReport.from_json((run / TRACKER_SUMMARY).read_bytes())
    report = analyze([run])
    assert report.source.format == "tracker"
    assert report.ranks[0].step_source == "tracker"
    assert [r.id for r in report.recommendations] == [r.id for r in summary.recommendations]
    assert msgspec.json.encode(report.ranks[0].devices) == msgspec.json.encode(summary.ranks[0].devices)


def test_the_summary_stands_in_for_rank_logs_on_another_node(tmp_path: Path) -> None:
    run = _write_run(tmp_path)
    report = AnalysisReport.from_json((run / TRACKER_SUMMARY).read_bytes())
    report.ranks.append(msgspec.structs.replace(report.ranks[0], rank=1))
    (run / TRACKER_SUMMARY).write_bytes(msgspec.json.encode(report))
    assert [r.rank for r in analyze([run]).ranks] == [0, 1]


def test_cli_analyze_on_a_tracker_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _write_run(tmp_path)
    assert main(["analyze", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"]["format"] == "tracker"
    assert out["recommendations"][0]["id"] == "dataloader_workers"
    assert main(["analyze", str(run)]) == 0
    assert "tracker" in capsys.readouterr().out
    assert main(["analyze", str(run), "--html", str(tmp_path / "report.html"), "--no-ledger"]) == 2
    assert "tracker.profile" in capsys.readouterr().err


def test_cli_refuses_a_tracker_folder_mixed_with_traces(tmp_path: Path, data: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = _write_run(tmp_path)
    assert main(["analyze", str(run), str(data / "trace_filter__sampled_rank-0.json.gz")]) == 2
    assert "gpuidle: error:" in capsys.readouterr().err


# ----------------------------------------------------------------------------------
# A profiled window
# ----------------------------------------------------------------------------------


def test_profile_a_window_of_steps(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 2)
    tr = StepTracker(tmp_path, device_clock=None, log=lambda _: None)
    where = tr.profile(range(3, 5))
    for x in tr.loader([torch.randn(4, 8) for _ in range(8)]):
        with tr.phase("forward"):
            loss = model(x).sum()
        with tr.phase("backward"):
            loss.backward()
        tr.step()
    report = tr.close()
    (trace,) = list(where.glob("rank0.*.pt.trace.json.gz"))
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")} == {
        "ProfilerStep#3", "ProfilerStep#4"}
    assert [s.get("profiled", False) for s in _steps(tmp_path / "rank-0.jsonl")].count(True) == 3  # warm-up + 2
    assert report is not None
    assert [s.step for s in report.ranks[0].steps] == [0, 1, 5, 6, 7]
    with pytest.raises(GpuidleError, match="already running"):
        tr.profile(range(2))


def test_rank0_keeps_the_last_steps_for_the_summary_and_the_logs_keep_all(tmp_path: Path) -> None:
    clk = FakeClock()
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, every=5, summary_steps=10, log=lambda _: None)
    _loop(tr, clk, None, steps=30, run_ns=0)
    report = tr.close()
    assert report is not None
    assert [s.step for s in report.ranks[0].steps] == list(range(20, 30))
    assert any("last 10 steps of 30" in n for n in report.ranks[0].notes)
    assert len(analyze([tmp_path]).ranks[0].steps) == 30


def test_a_failed_summary_does_not_crash_the_training_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuidle.advice.series_report

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("bad numbers")

    monkeypatch.setattr(gpuidle.advice.series_report, "series_report", broken)
    clk = FakeClock()
    lines: list[str] = []
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, log=lines.append)
    _loop(tr, clk, None, steps=3, run_ns=0)
    assert tr.close() is None
    assert "no job summary (ValueError: bad numbers)" in lines[-1]
    assert _lines(tmp_path / "rank-0.jsonl")[-1]["type"] == "end"


def test_watch_ddp_times_the_buckets_and_lets_go_at_close(tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 64),
                                                                              torch.nn.Linear(64, 4)))
        tr = StepTracker(tmp_path / "run", model=model, device_clock=None, log=lambda _: None)
        with pytest.raises(GpuidleError, match="already has a comm hook"):
            tr.watch_ddp(model)
        x = torch.randn(8, 16)
        for _ in range(3):
            with tr.phase("forward"):
                loss = model(x).square().mean()
            with tr.phase("backward"):
                loss.backward()
            tr.step()
        report = tr.close()
        model(x).sum().backward()  # training goes on after close: the hook lets buckets through
        assert tr._open.comm == []
        # DDP's reducer holds the process group: freed after it, gloo's destructor can wait on its threads forever
        del model, tr, loss
        gc.collect()
    finally:
        dist.destroy_process_group()
    steps = _steps(tmp_path / "run" / "rank-0.jsonl")
    assert all(int(s["buckets"]) >= 1 for s in steps)  # type: ignore[call-overload]
    assert all(int(s["bucket_bytes"]) == (16 * 64 + 64 + 64 * 4 + 4) * 4 for s in steps)  # type: ignore[call-overload]
    assert all(0 < int(s["comm_ns"]) < int(s["dur_ns"]) for s in steps)  # type: ignore[call-overload]
    assert report is not None
    assert report.ranks[0].communication.collectives[0].collective == "all_reduce"
    assert _lines(tmp_path / "run" / "rank-0.jsonl")[-1]["comm_hook"] == "allreduce_hook"


def test_the_job_summary_is_recorded_in_the_ledger(tmp_path: Path) -> None:
    from gpuidle.ledger import Ledger

    book = tmp_path / "ledger.sqlite"
    clk = FakeClock()
    tr = StepTracker(tmp_path / "run", device_clock=None, clock=clk, log_every=None, log=lambda _: None,
                     label="baseline", ledger=book)
    _loop(tr, clk, None, steps=4, run_ns=0)
    report = tr.close()
    assert report is not None
    with Ledger(book) as ledger:
        (run,) = ledger.runs()
    assert run.kind == "tracker"
    assert run.label == "baseline"
    assert AnalysisReport.from_json(run.report).source.format == report.source.format


def test_no_ledger_record_when_asked(tmp_path: Path) -> None:
    book = tmp_path / "ledger.sqlite"
    clk = FakeClock()
    tr = StepTracker(tmp_path / "run", device_clock=None, clock=clk, log_every=None, log=lambda _: None,
                     ledger=False)
    _loop(tr, clk, None, steps=2, run_ns=0)
    tr.close()
    assert not book.exists()


def test_the_ledger_record_carries_utilization_step_time_and_gpu_count(tmp_path: Path) -> None:
    from gpuidle.ledger import Ledger

    book = tmp_path / "ledger.sqlite"
    clk = FakeClock()
    tr = StepTracker(tmp_path / "run", device_clock=None, clock=clk, log_every=None, log=lambda _: None, ledger=book)
    _loop(tr, clk, None, steps=5, run_ns=0)
    tr.close()
    with Ledger(book) as ledger:
        (run,) = ledger.runs()
    # by hand: 8 ms steps of which forward + backward + optimizer are 2 + 3 + 1 ms of host time
    assert run.step_s == pytest.approx(0.008)
    assert run.utilization == pytest.approx(6 / 8)
    assert run.gpu_count == 1


# ----------------------------------------------------------------------------------
# Runs that end early, and what their logs say
# ----------------------------------------------------------------------------------


def test_profiling_without_cuda_warns_that_the_traces_have_no_device(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lines: list[str] = []
    tr = StepTracker(tmp_path, device_clock=None, log=lines.append, log_every=None, ledger=False)
    tr.profile(range(2, 3))
    assert any("no device activity" in line for line in lines)
    for x in tr.loader([torch.zeros(2, 2) for _ in range(5)]):
        with tr.phase("forward"):
            x.sum()
        tr.step()
    report = tr.close()
    assert report is not None
    assert any("no device activity" in n for n in report.ranks[0].notes)
    # learnt after the log's header was written: in its end line, so analyze of the folder says it too
    assert any("no device activity" in n for n in _lines(tmp_path / "rank-0.jsonl")[-1]["notes"])
    assert any("no device activity" in n for n in analyze_tracker([tmp_path]).ranks[0].notes)


def _two_ranks_with_buckets(out: Path, steps: int, every: int) -> StepTracker:
    """Rank 0 of two in one process (the other rank's rows are a copy), DDP buckets timed every step."""
    clk = FakeClock()
    tr = StepTracker(out, device_clock=None, clock=clk, every=every, gather=lambda rows: np.stack([rows, rows]),
                     rank=0, world_size=2, log=lambda _: None, ledger=False)
    for _ in range(steps):
        with tr.phase("backward"):
            clk.add(4 * MS)
            entry = tr._bucket_ready(torch.zeros(256))
            clk.add(3 * MS)
            tr._bucket_done(entry)
        tr.step()
    return tr


def test_a_run_stopped_before_close_has_no_false_communication_note(tmp_path: Path) -> None:
    tr = _two_ranks_with_buckets(tmp_path, steps=10, every=5)  # killed here: no close(), no end line
    (rank,) = analyze([tmp_path]).ranks
    assert any("no end line" in n for n in rank.notes)
    assert not any("communication not timed" in n for n in rank.notes)
    assert rank.communication.exposed_s == pytest.approx(10 * 0.003)
    tr._file.close()


def test_a_tracker_log_with_only_a_header_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clk = FakeClock()
    tr = StepTracker(tmp_path, device_clock=None, clock=clk, every=50, log=lambda _: None, ledger=False)
    _loop(tr, clk, None, steps=3, run_ns=0)  # killed before the first exchange wrote a step
    tr._file.close()
    assert main(["analyze", str(tmp_path), "--no-ledger"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("gpuidle: error:")
    assert "without steps" in err[0]
    assert "every 50 steps" in err[0]


def test_a_tracker_closed_before_any_step_writes_no_summary(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    tr = StepTracker(tmp_path, device_clock=None, log=lines.append, ledger=False)
    assert tr.close() is None
    assert not (tmp_path / TRACKER_SUMMARY).exists()
    assert "no step was recorded" in lines[-1]
    assert main(["analyze", str(tmp_path), "--no-ledger"]) == 2
    assert "without steps" in capsys.readouterr().err
