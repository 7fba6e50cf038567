"""Annotated traces: the original events untouched, plus a gpuidle track equal to the idle segments."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conftest import DATA
from corpus import CORPUS, needs_corpus
from gpuidle import api
from gpuidle.analysis.idle import attribute_idle
from gpuidle.analysis.links import launcher_rows
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.startup import find_startup
from gpuidle.analysis.steps import step_window
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.model import CAUSES
from gpuidle.report.annotate import PID, us
from gpuidle.sources import jsonstream, kineto
from minitrace import Trace

REAL = [
    "nccl_parser_config__nccl_data.json.gz",  # NCCL collectives, 3 profiler steps
    "trace_file_list__inference_rank_1.json.gz",  # old categories, epoch timestamps
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm
]
NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_float=Decimal)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def expected_segments(path: Path) -> dict[int, list[tuple[str, int, int, int]]]:
    """``(cause, start ns, end ns, step)`` per device, straight from ``attribute_idle``, in trace time; idle under
    start-up is in no cause, as in the report, and is not drawn."""
    tl = kineto.read(str(path))
    names = NameClasses.of(tl.strings)
    window = step_window(tl, names)
    bounds = window.bounds
    launchers = launcher_rows(tl)
    startup = find_startup(tl, names, window, launchers).ranges()
    out: dict[int, list[tuple[str, int, int, int]]] = {}
    for d in attribute_idle(tl, names, window, launchers, startup=startup):
        s, e, c = d.segments
        rows = []
        for a, b, k in zip(s.tolist(), e.tolist(), c.tolist(), strict=True):
            if k >= len(CAUSES):
                continue
            i = max(0, min(sum(1 for x in bounds.tolist() if x <= a) - 1, bounds.size - 2))
            rows.append((CAUSES[k].value, tl.meta.t0_ns + a, tl.meta.t0_ns + b, int(window.steps.number[i])))
        out[d.device] = rows
    return out


def merged(rows: list[tuple[str, int, int, int]]) -> list[tuple[int, int]]:
    """The idle time covered, as maximal intervals (cut points of causes removed)."""
    out: list[tuple[int, int]] = []
    for _, a, b, _ in sorted(rows, key=lambda r: r[1]):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def track(doc: dict[str, Any]) -> dict[int, list[tuple[str, int, int, int]]]:
    """The gpuidle X events per device, as ``(name, start ns, end ns, step)``; ts/dur read as exact decimals."""
    out: dict[int, list[tuple[str, int, int, int]]] = {}
    for e in doc["traceEvents"]:
        if e.get("pid") == PID and e["ph"] == "X":
            assert e["cat"] == "gpuidle"
            assert e["args"]["cause"] == e["name"]
            assert e["args"]["device"] == e["tid"]
            start = e["ts"] * 1000
            end = start + e["dur"] * 1000
            assert start == int(start)
            assert end == int(end)
            out.setdefault(e["tid"], []).append((e["name"], int(start), int(end), e["args"]["step"]))
    return out


@pytest.mark.parametrize("name", REAL)
def test_real_trace_annotated(name: str, tmp_path: Path) -> None:
    src = DATA / name
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "annotated.json.gz"
    api.annotate_trace(src, out)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest  # the input is never modified

    doc = load(out)  # plain json reads it
    original = load(src)
    assert doc["traceEvents"][: len(original["traceEvents"])] == original["traceEvents"]
    assert {k: v for k, v in doc.items() if k != "traceEvents"} == {
        k: v for k, v in original.items() if k != "traceEvents"}
    added = doc["traceEvents"][len(original["traceEvents"]):]
    assert all(e["pid"] == PID for e in added)

    expected = expected_segments(src)
    assert track(doc) == {d: rows for d, rows in expected.items() if rows}
    meta = [e for e in added if e["ph"] == "M"]
    assert {"name": "process_name", "args": {"name": "gpuidle: idle time by cause"}}.items() <= meta[0].items()
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert sorted(threads) == sorted(expected)
    assert all(v.startswith(f"GPU {k} idle") for k, v in threads.items())

    # our own reader takes it, and finds the same trace (the added process is not GPU work)
    before, after = api.analyze([src]), api.analyze([out])
    assert [r.devices for r in after.ranks] == [r.devices for r in before.ranks]
    assert [r.steps for r in after.ranks] == [r.steps for r in before.ranks]


def test_exact_microseconds_on_an_epoch_clock(tmp_path: Path) -> None:
    base = 1695835535123456.5  # µs since the epoch, half a µs past: exactly representable
    t = Trace()
    t.step(1, base, 1000)
    t.annotation(NEXT, base, 400)
    t.op("aten::linear", base + 400, 100)
    t.launch(at=base + 450, call_dur=10, start=base + 500, dur=500)
    src = t.write(tmp_path / "t.json", gz=False)
    out = tmp_path / "annotated.json"
    api.annotate_trace(src, out)
    text = out.read_text()
    assert text.startswith("{")  # not gzip: the name does not end in .gz
    b_ns = 1695835535123456500
    got = track(load(out))
    assert got == expected_segments(src)
    # [0, 400) in __next__; then launch overhead up to the kernel at 500, in pieces split where the
    # layers change (an op that launches, the launch call, the launch in flight)
    (rows,) = got.values()
    assert rows[0] == ("data_loading", b_ns, b_ns + 400_000, 1)
    assert {r[0] for r in rows[1:]} == {"launch_overhead"}
    assert [(a[2], b[1]) for a, b in pairwise(rows)] == [(r[1], r[1]) for r in rows[1:]]  # contiguous
    assert rows[-1][2] == b_ns + 500_000
    assert '"ts":1695835535123456.500,"dur":400.000' in text
    # plain json (floats) also agrees with ns / 1000, rounded once
    plain = json.loads(text)
    xs = [e for e in plain["traceEvents"] if e.get("pid") == PID and e["ph"] == "X"]
    assert [e["ts"] for e in xs] == [r[1] / 1000 for r in rows]
    assert [e["dur"] for e in xs] == [(r[2] - r[1]) / 1000 for r in rows]


def test_us_literal() -> None:
    assert (us(0), us(1), us(999), us(1000), us(1234567), us(-1)) == (
        "0.000", "0.001", "0.999", "1.000", "1234.567", "-0.001")


def test_streamed_in_small_chunks_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = DATA / "nccl_parser_config__nccl_data.json.gz"
    api.annotate_trace(src, tmp_path / "big.json")
    monkeypatch.setattr(jsonstream, "CHUNK", 4096)
    monkeypatch.setattr(jsonstream, "READ_BLOCK", 1000)
    api.annotate_trace(src, tmp_path / "small.json")
    assert (tmp_path / "small.json").read_bytes() == (tmp_path / "big.json").read_bytes()


def test_bare_array_and_keys_after_the_events(tmp_path: Path) -> None:
    t = Trace(rank=2, world=4)
    t.step(1, 0, 1000)
    t.launch(at=0, call_dur=10, start=100, dur=500)
    doc = t.to_dict()
    events = doc.pop("traceEvents")
    after_keys = tmp_path / "after.json"
    after_keys.write_text(json.dumps({"traceEvents": events, **doc}))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    for src in (after_keys, bare):
        out = tmp_path / f"{src.stem}.annotated.json.gz"
        api.annotate_trace(src, out)
        got = load(out)
        assert got["traceEvents"][: len(events)] == json.loads(json.dumps(events), parse_float=Decimal)
        # [0, 10) in the launch call, [10, 60) its queue (launching costs the call plus at most 50 µs);
        # the kernel waits 40 µs more on something the trace does not show; after the kernel, nothing
        assert track(got) == {0: [("launch_overhead", 0, 10_000, 1), ("launch_overhead", 10_000, 60_000, 1),
                                  ("unattributed", 60_000, 100_000, 1), ("unattributed", 600_000, 1_000_000, 1)]}
    assert {k: v for k, v in load(tmp_path / "after.annotated.json.gz").items() if k != "traceEvents"} == doc
    assert kineto.read(str(tmp_path / "after.annotated.json.gz")).meta.rank == 2


def test_the_input_is_never_the_output(tmp_path: Path) -> None:
    src = tmp_path / "t.json.gz"
    src.write_bytes((DATA / "trace_compare__base__base.json.gz").read_bytes())
    before = src.read_bytes()
    with pytest.raises(GpuidleError, match="would overwrite its input"):
        api.annotate_trace(src, src)
    assert src.read_bytes() == before


def test_a_broken_input_leaves_no_output(tmp_path: Path) -> None:
    good = (DATA / "trace_compare__base__base.json.gz").read_bytes()
    src = tmp_path / "cut.json.gz"
    src.write_bytes(good[: len(good) // 2])
    tl = api.idle_timeline(DATA / "trace_compare__base__base.json.gz")
    with pytest.raises(GpuidleError, match="truncated"):
        api.annotate_trace(src, tmp_path / "out.json.gz", tl)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.json.gz"]


def test_timeline_bins_add_up(tmp_path: Path) -> None:
    tl = api.idle_timeline(DATA / "nccl_parser_config__nccl_data.json.gz", bins=97)
    report = api.analyze([DATA / "nccl_parser_config__nccl_data.json.gz"])
    for d, dr in zip(tl.devices, report.ranks[0].devices, strict=True):
        widths = (d.bin_edges[1:] - d.bin_edges[:-1]).astype(float)
        assert len(widths) == 97
        assert (d.bin_edges[0], d.bin_edges[-1]) == d.window
        # shares weighted by slice width give back the report's idle by cause and busy time, in ns
        for j, c in enumerate(CAUSES):
            assert (d.bin_idle[:, j] * widths).sum() == pytest.approx(dr.idle_by_cause_s[c.value] * 1e9, abs=1.0)
        assert (d.bin_busy * widths).sum() == pytest.approx(dr.busy_s * 1e9, abs=1.0)
        assert int((d.seg_end - d.seg_start).sum()) == round(dr.idle_s * 1e9)


# -- through the command line -----------------------------------------------------------


def test_cli_annotate_one_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = DATA / "trace_compare__test__test.json.gz"
    out = tmp_path / "a.json.gz"
    assert main(["analyze", str(src), "--annotate", str(out), "--no-ledger"]) == 0
    assert capsys.readouterr().err == ""
    assert track(load(out)) == {d: rows for d, rows in expected_segments(src).items() if rows}


def test_cli_annotate_a_job_takes_the_lowest_utilization_rank(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        name = f"trace_filter__sampled_rank-{r}.json.gz"
        (job / name).write_bytes((DATA / name).read_bytes())
    out = tmp_path / "a.json"
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(job), "--annotate", str(out),
                           "--no-ledger"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = api.analyze([job])
    worst = min(report.ranks, key=lambda r: r.primary().utilization)
    assert f"timeline of {worst.path}: rank {worst.rank} of 2, the lowest utilization" in proc.stderr
    got = msgspec.json.decode(out.read_bytes())
    assert got["distributedInfo"]["rank"] == worst.rank
    annotated = track(load(out))
    alone = {d: rows for d, rows in expected_segments(Path(worst.path)).items() if rows}
    # the same idle intervals as the rank analysed alone; waiting for the other rank, which only the
    # job can tell, is named straggler_wait instead of communication, exactly as in the job report
    assert {d: merged(rows) for d, rows in annotated.items()} == {d: merged(rows) for d, rows in alone.items()}
    for device in worst.devices:
        totals: dict[str, int] = {}
        for cause, a, b, _ in annotated.get(device.device, []):
            totals[cause] = totals.get(cause, 0) + b - a
        for cause, seconds in device.idle_by_cause_s.items():
            if device.device == worst.primary().device or cause != "straggler_wait":
                assert totals.get(cause, 0) == pytest.approx(seconds * 1e9, abs=2), cause
    assert any(cause == "straggler_wait" for rows in annotated.values() for cause, *_ in rows) == \
        (worst.primary().idle_by_cause_s["straggler_wait"] > 0)


@needs_corpus
def test_each_gpu_is_annotated_over_its_own_steps(tmp_path: Path) -> None:
    """A multi-GPU XSpace profile whose GPUs run their steps apart (GPU 4's step of 19.9 ms, GPU 6's of 21.3 ms,
    647 ms later): each GPU's idle in the annotated trace, summed from its events, is the report's idle of that GPU,
    cause by cause, and lies inside a span no longer than that GPU's own window; never one window for both."""
    (src,) = (CORPUS / "tf_bert_multigpu_v100").glob("*.xplane.pb")
    (rank,) = api.analyze([src]).ranks
    out = tmp_path / "bert.json.gz"
    api.annotate_trace(src, out)
    annotated = track(load(out))
    devices = {d.device: d for d in rank.devices}
    assert {4, 6} <= set(annotated)
    for device, rows in annotated.items():
        d = devices[device]
        totals: dict[str, int] = {}
        for cause, a, b, _ in rows:
            totals[cause] = totals.get(cause, 0) + b - a
        assert sum(totals.values()) == pytest.approx(d.idle_s * 1e9, abs=2), device
        for cause, seconds in d.idle_by_cause_s.items():
            assert totals.get(cause, 0) == pytest.approx(seconds * 1e9, abs=2), (device, cause)
        assert max(b for _, _, b, _ in rows) - min(a for _, a, _, _ in rows) <= d.window_s * 1e9 + 1
    assert devices[4].idle_s == pytest.approx(4.99e-3, abs=0.01e-3)  # not GPU 6's window: 21.3 ms of idle
