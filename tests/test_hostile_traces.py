"""Hostile and broken traces: deep nesting, huge numbers, impossible times, bombs, special paths.

Each case ends in a clear one-line error or in skipped events named by a note, never in a
traceback, a silent drop or a numpy warning. The linear-time checks count the bytes handed to
the decoder (work, not wall-clock time).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.cli import main
from gpuidle.errors import CorruptInput, GpuidleError, InputNotFound
from gpuidle.jobs import executors
from gpuidle.sources import inputs, jsonstream, kineto, kineto_events, kineto_read, kineto_scan
from minitrace import Trace
from permissions import unprivileged

KERNEL_START, KERNEL_DUR = 20.0, 30.0


def base() -> dict[str, Any]:
    """``B``: one step, one launch, one 30 µs kernel."""
    t = Trace()
    t.step(1, 0, 100)
    t.launch(at=10, call_dur=5, start=KERNEL_START, dur=KERNEL_DUR)
    return t.to_dict()


def kernel(doc: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in doc["traceEvents"] if e["cat"] == "kernel")


def with_second_kernel(**fields: Any) -> dict[str, Any]:
    """B plus a kernel at 60 µs whose fields (``args.x`` for args) are overridden."""
    doc = base()
    extra = json.loads(json.dumps(kernel(doc)))
    extra.update(ts=60.0, dur=10.0, name="second_kernel")
    for key, value in fields.items():
        if key.startswith("args."):
            extra["args"][key[5:]] = value
        else:
            extra[key] = value
    doc["traceEvents"].append(extra)
    return doc


def write(path: Path, doc: Any, raw: str | None = None) -> Path:
    path.write_text(raw if raw is not None else json.dumps(doc))
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command line in this process, with every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = main(["analyze", "--no-ledger", *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuidle: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


# -- deep nesting ----------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["args", "event", "document", "header"])
def test_deep_nesting_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    doc = base()
    text = json.dumps(doc)
    if where == "args":
        text = text.replace('"correlation":', f'"deep": {nested(1000)}, "correlation":', 1)
    elif where == "event":
        text = text.replace('"traceEvents": [', '"traceEvents": [' + nested(1000) + ", ", 1)
    elif where == "document":
        text = nested(1000)
    else:
        text = text.replace('"schemaVersion": 1', f'"schemaVersion": {nested(1000)}', 1)
    path = write(tmp_path / "deep.json", None, text)
    code, _out, err = cli(capsys, str(path))
    assert_one_line_error(code, err, "nested too deeply" if where != "document" else "deep.json")


def test_nesting_a_trace_may_hold_is_read(tmp_path: Path) -> None:
    text = json.dumps(base()).replace('"correlation":', f'"deep": {nested(100)}, "correlation":', 1)
    tl = kineto.read(str(write(tmp_path / "t.json", None, text)))
    assert len(tl.device_ops) == 1


# -- integers past int64 ---------------------------------------------------------------------------

HUGE = [2**70, 1e30, 2**63]


@pytest.mark.parametrize("value", HUGE, ids=["2^70", "1e30", "2^63"])
@pytest.mark.parametrize("field", ["args.stream", "args.correlation", "args.device", "args.bytes"])
def test_ids_past_int64_skip_the_event_with_a_note(tmp_path: Path, field: str, value: Any) -> None:
    tl = kineto.read(str(write(tmp_path / "t.json", with_second_kernel(**{field: value}))))
    assert [tl.strings[i] for i in tl.device_ops.name] == ["volta_sgemm_128x64_nn"]
    assert any(n.startswith("1 events skipped: an id or size") and "second_kernel" in n for n in tl.meta.notes)


@pytest.mark.parametrize("value", HUGE, ids=["2^70", "1e30", "2^63"])
@pytest.mark.parametrize("field", ["pid", "tid"])
def test_huge_pid_and_tid_are_names(tmp_path: Path, field: str, value: Any) -> None:
    """pid and tid only name threads (the kernel's device and stream come from args): the kernel stays."""
    tl = kineto.read(str(write(tmp_path / "t.json", with_second_kernel(**{field: value}))))
    assert len(tl.device_ops) == 2
    assert set(tl.device_ops.device.tolist()) == {0}


def test_device_from_a_huge_pid_is_skipped(tmp_path: Path) -> None:
    doc = with_second_kernel(pid=2**70)
    del doc["traceEvents"][-1]["args"]["device"]
    tl = kineto.read(str(write(tmp_path / "t.json", doc)))
    assert len(tl.device_ops) == 1
    assert any("1 events skipped: an id or size" in n for n in tl.meta.notes)


def test_collective_sizes_past_int64_are_unknown(tmp_path: Path) -> None:
    doc = base()
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100, "tid": 1,
                               "ts": 30, "dur": 2, "args": {"Collective name": "allreduce", "dtype": "Float",
                                                            "In msg nelems": 2**70, "Group size": 2**40}})
    tl = kineto.read(str(write(tmp_path / "t.json", doc)))
    assert tl.collectives.in_bytes.tolist() == [-1]
    assert tl.collectives.group_size.tolist() == [-1]


# -- impossible times ----------------------------------------------------------------------------

BAD_TIMES = {
    "ts 1e16 µs": {"ts": 1e16},
    "dur 1e15 µs": {"dur": 1e15},
    "dur 1e16 µs": {"dur": 1e16},
    "ts 'nan'": {"ts": "nan"},
    "ts 'inf'": {"ts": "inf"},
    "dur 'inf'": {"dur": "inf"},
    "dur '-inf'": {"dur": "-inf"},
    "negative ts": {"ts": -5.0},
    "negative dur": {"dur": -1.0},
    "ts null": {"ts": None},
    "ts a list": {"ts": [1]},
    "ts 1e400 as text": {"ts": "1e400"},
}


@pytest.mark.parametrize("fields", BAD_TIMES.values(), ids=BAD_TIMES.keys())
def test_bad_times_skip_the_event_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             fields: dict[str, Any]) -> None:
    path = write(tmp_path / "t.json", with_second_kernel(**fields))
    code, out, err = cli(capsys, "--json", str(path))
    assert (code, err) == (0, "")
    rank = json.loads(out)["ranks"][0]
    assert any(n.startswith("1 events skipped: ts or dur") and "second_kernel" in n for n in rank["notes"])
    device = rank["devices"][0]
    assert device["busy_s"] == pytest.approx(KERNEL_DUR * 1e-6)  # only B's kernel counts
    assert rank["window"]["start_s"] >= 0
    assert 0 < rank["window"]["dur_s"] < 1e-3


@pytest.mark.parametrize("fields", [{"ts": 1e16}, {"dur": 1e15}, {"ts": "inf"}, {"ts": "nan"}, {"dur": -3}],
                         ids=["ts", "dur", "inf", "nan", "negative"])
def test_the_only_kernel_with_a_bad_time_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         fields: dict[str, Any]) -> None:
    doc = base()
    kernel(doc).update(fields)
    code, _out, err = cli(capsys, str(write(tmp_path / "t.json", doc)))
    assert_one_line_error(code, err, "no usable GPU events", "1 events skipped: ts or dur")


def test_missing_ts_is_skipped_not_taken_as_zero(tmp_path: Path) -> None:
    doc = with_second_kernel()
    del doc["traceEvents"][-1]["ts"]
    tl = kineto.read(str(write(tmp_path / "t.json", doc)))
    assert len(tl.device_ops) == 1
    assert any("1 events skipped: ts or dur" in n for n in tl.meta.notes)


def test_events_spanning_years_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    days = 400
    path = write(tmp_path / "t.json", with_second_kernel(ts=KERNEL_START + days * 86400e6))
    code, _out, err = cli(capsys, str(path))
    assert_one_line_error(code, err, f"span {days} days")


# -- error detection is linear in the input --------------------------------------------------------


def big_trace(kernels: int) -> str:
    """Launches with ops whose shapes put ``]`` all over the file, and names holding ``},{``."""
    t = Trace()
    t.step(1, 0, kernels * 20)
    shapes: dict[str, Any] = {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}
    for i in range(kernels):
        t.op("aten::mm", i * 20, 8, **shapes)
        t.launch(at=i * 20, call_dur=5, start=i * 20 + 10, dur=5, name=f"k_{i % 7}" + "},{not_a_cut")
    return json.dumps(t.to_dict(), indent=1)


def reading_work(path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> tuple[int, str]:
    """Bytes the reader hands to the decoder or copies out of its buffer, in all; and how reading ended."""
    total = 0
    decode = kineto_scan.scan_or_decode

    def counting(text: bytes) -> Any:
        nonlocal total
        total += len(text)
        return decode(text)

    def copying(data: Any = b"") -> bytes:
        nonlocal total
        copy = bytes(data)
        total += len(copy)
        return copy

    monkeypatch.setattr(jsonstream, "CHUNK", chunk)
    monkeypatch.setenv(kineto_read.WORKERS_ENV, "1")  # in this process, where the counting is
    monkeypatch.setattr(kineto_read, "scan_or_decode", counting)  # read() decodes through this name
    monkeypatch.setattr(jsonstream, "bytes", copying, raising=False)  # found before the builtin
    try:
        kineto.read(str(path))
        outcome = "read"
    except CorruptInput as err:
        outcome = str(err)
    return total, outcome


@pytest.mark.parametrize("chunk", [4096, jsonstream.CHUNK], ids=["small chunks", "one chunk"])
@pytest.mark.parametrize("damage", ["truncated", "bad byte at the end", "bad byte in the middle",
                                    "missing comma", "good"])
def test_decoding_work_is_linear_in_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str,
                                              chunk: int) -> None:
    text = big_trace(400)
    size = len(text)
    if damage == "truncated":
        text = text[: text.rindex("}", 0, size // 2) + 1]  # as a writer stopped after a whole event
    elif damage == "bad byte at the end":
        at = text.rindex('"dur"', 0, size - 100)
        text = text[:at] + "\x01" + text[at + 1:]
    elif damage == "bad byte in the middle":
        at = text.index('"ts":', size // 2) + 4
        text = text[:at] + "#" + text[at + 1:]
    elif damage == "missing comma":
        at = text.index("},", size // 2)
        text = text[: at + 1] + text[at + 2:]
    path = write(tmp_path / "t.json", None, text)
    total, outcome = reading_work(path, monkeypatch, chunk)
    assert (outcome == "read") == (damage == "good"), outcome
    # every byte is decoded or copied a bounded number of times: chunks double after a false cut,
    # the strict decoder may hand a chunk to the lenient one, the last chunk may be tried twice
    assert total <= 8 * len(text), (total, len(text))


def test_error_names_the_byte(tmp_path: Path) -> None:
    text = big_trace(50)
    at = text.index('"dur"', len(text) // 2)
    path = write(tmp_path / "t.json", None, text[:at] + "x" + text[at + 1:])
    with pytest.raises(CorruptInput, match=r"invalid JSON at byte \d+ of the event list"):
        kineto.read(str(path))


# -- gzip bombs ------------------------------------------------------------------------------------


class CountingStream(jsonstream.TraceStream[Any]):
    """Counts the decompressed bytes the reader pulled."""

    pulled = 0

    def _blocks(self, f: Any) -> Iterator[bytes]:
        for block in super()._blocks(f):
            CountingStream.pulled += len(block)
            yield block


BOMBS = {
    "spaces after the array opens": b'{"traceEvents": [' + b" " * (16 << 20),
    "spaces between events": b'{"traceEvents": [{"ph": "X", "cat": "kernel"},' + b" " * (16 << 20),
    "a huge name": b'{"traceEvents": [{"ph": "X", "name": "' + b"a" * (16 << 20) + b'"}]}',
    "spaces before the array": b'{"traceEvents": ' + b" " * (16 << 20),
}


@pytest.mark.parametrize("payload", BOMBS.values(), ids=BOMBS.keys())
def test_gzip_bombs_stop_at_the_event_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: bytes) -> None:
    limit = 1 << 20
    monkeypatch.setattr(jsonstream, "MAX_EVENT", limit)
    monkeypatch.setattr(jsonstream, "HEADER_LIMIT", limit)
    monkeypatch.setattr(jsonstream, "CHUNK", 1 << 16)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(payload, 1))
    CountingStream.pulled = 0
    with pytest.raises(GpuidleError, match=r"bomb\.json\.gz"):
        list(CountingStream(str(path), kineto_events.decode_chunk))
    assert CountingStream.pulled <= limit + (1 << 16) + 2 * jsonstream.READ_BLOCK


def test_whitespace_past_the_header_limit_is_said_so_not_called_empty(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonstream, "HEADER_LIMIT", 1 << 20)
    path = tmp_path / "spaces.json.gz"
    path.write_bytes(gzip.compress(b" " * (2 << 20) + b'{"traceEvents": []}', 1))
    with pytest.raises(CorruptInput, match="only whitespace in its first 1 MiB"):
        list(jsonstream.TraceStream(str(path), kineto_events.decode_chunk))


# -- special paths, unreadable files, crashing ranks -----------------------------------------------


def test_fifo_is_refused_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    code, _out, err = cli(capsys, str(fifo))
    assert_one_line_error(code, err, "not a regular file")


def test_character_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = cli(capsys, "/dev/null")
    assert_one_line_error(code, err, "/dev/null: not a regular file")


def test_fifo_inside_a_folder_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "rank0.json", base())
    os.mkfifo(tmp_path / "rank1.json")
    assert api.find_trace_files(tmp_path) == [str(tmp_path / "rank0.json")]


def test_trace_stream_refuses_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.json")
    with pytest.raises(InputNotFound, match="not a regular file"):
        jsonstream.TraceStream(str(tmp_path / "f.json"), kineto_events.decode_chunk)


def as_unprivileged(*args: str) -> subprocess.CompletedProcess[str]:
    """``gpuidle analyze`` without root's power to read anything (see :mod:`permissions`)."""
    return subprocess.run([*unprivileged(), sys.executable, "-m", "gpuidle", "analyze", "--no-ledger", *args],
                          capture_output=True, text=True, timeout=120)


def test_unreadable_file_and_folder(tmp_path: Path) -> None:
    trace = write(tmp_path / "t.json", base())
    trace.chmod(0o644)
    trace.chmod(0)
    proc = as_unprivileged(str(trace))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "Permission denied" in proc.stderr
    assert "Traceback" not in proc.stderr
    folder = tmp_path / "ranks"
    folder.mkdir(mode=0o700)
    write(folder / "rank0.json", base())
    folder.chmod(0)
    proc = as_unprivileged(str(folder))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "Permission denied" in proc.stderr


def test_unreadable_rank_file_is_skipped_with_a_warning(tmp_path: Path) -> None:
    for rank in range(2):
        t = Trace(rank=rank, world=2)
        t.step(1, 0, 100)
        t.launch(at=10, call_dur=5, start=20, dur=30)
        t.write(tmp_path / f"rank{rank}.json", gz=False).chmod(0o644)
    (tmp_path / "rank1.json").chmod(0)
    proc = as_unprivileged("--json", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("gpuidle: warning: skipped ")
    assert "rank1.json" in proc.stderr
    assert "Permission denied" in proc.stderr
    assert [r["rank"] for r in json.loads(proc.stdout)["ranks"]] == [0]


def refuse_to_open(path: str, *args: Any, **kwargs: Any) -> Any:
    if "rank1" in str(path) or str(path).endswith("t.json"):
        raise PermissionError(13, "Permission denied", str(path))
    return open(path, *args, **kwargs)


def test_unreadable_file_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """What the unprivileged run checks, wherever no unprivileged user can run this interpreter."""
    monkeypatch.setattr(inputs, "open", refuse_to_open, raising=False)
    code, _out, err = cli(capsys, str(write(tmp_path / "t.json", base())))
    assert_one_line_error(code, err, "t.json: cannot read (Permission denied)")


def test_unreadable_folder_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(self: Path) -> Any:
        raise PermissionError(13, "Permission denied", str(self))

    write(tmp_path / "rank0.json", base())
    monkeypatch.setattr(Path, "iterdir", refuse)
    code, _out, err = cli(capsys, str(tmp_path))
    assert_one_line_error(code, err, "cannot read (Permission denied)")


def test_unreadable_rank_file_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers are forked, so the refusing ``open`` is theirs too."""
    monkeypatch.setattr(executors, "fork_hazard", lambda: None)  # forked even where another test loaded JAX
    two_ranks(tmp_path)
    monkeypatch.setattr(inputs, "open", refuse_to_open, raising=False)
    warned: list[str] = []
    report = api.analyze([tmp_path], workers=2, warn=warned.append)
    assert [r.rank for r in report.ranks] == [0]
    assert len(warned) == 1
    assert "rank1.json.gz: cannot read (Permission denied)" in warned[0]


def two_ranks(folder: Path) -> None:
    for rank in range(2):
        t = Trace(rank=rank, world=2)
        t.step(1, 0, 100)
        t.launch(at=10, call_dur=5, start=20, dur=30)
        t.write(folder / f"rank{rank}.json.gz")


@pytest.mark.parametrize("how", ["raises", "kills its worker"])
def test_a_crashing_rank_file_does_not_take_the_folder_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           how: str) -> None:
    """Workers are forked, so the patched reader is theirs too."""
    monkeypatch.setattr(executors, "fork_hazard", lambda: None)  # forked even where another test loaded JAX
    two_ranks(tmp_path)
    read = kineto.read

    def crashing(path: str, progress: Any = None) -> Any:
        if path.endswith("rank1.json.gz"):
            if how == "raises":
                raise RuntimeError("a bug\nover two lines")
            os._exit(3)
        return read(path, progress)

    monkeypatch.setattr(kineto, "read", crashing)
    warned: list[str] = []
    report = api.analyze([tmp_path], workers=2, warn=warned.append)
    assert [r.rank for r in report.ranks] == [0]
    assert len(warned) == 1
    assert "rank1.json.gz" in warned[0]
    assert "\n" not in warned[0]
    assert ("RuntimeError: a bug over two lines" if how == "raises" else "worker reading it died") in warned[0]


# -- the good path is unchanged ------------------------------------------------------------------


def test_real_traces_lose_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every complete GPU and host event of a real trace is read (none is skipped as out of range)."""
    name = "trace_filter__sampled_rank-0.json.gz"
    events = json.loads(gzip.decompress((DATA / name).read_bytes()))["traceEvents"]
    cats = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
    host = {"cpu_op", "Operator", "cuda_runtime", "Runtime", "cuda_driver", "user_annotation"}
    tl = kineto.read(str(DATA / name))
    assert len(tl.device_ops) == sum(e.get("ph") == "X" and e.get("cat") in cats for e in events)
    assert len(tl.host) == sum(e.get("ph") == "X" and e.get("cat") in host for e in events)
    assert not any("skipped" in n for n in tl.meta.notes)


def test_non_object_elements_in_the_event_list_are_ignored(tmp_path: Path) -> None:
    doc = base()
    doc["traceEvents"][1:1] = [5, "text", None, [1, 2]]
    tl = kineto.read(str(write(tmp_path / "t.json", doc)))
    assert len(tl.device_ops) == 1


def test_numbers_past_float_are_a_clear_error(tmp_path: Path) -> None:
    text = json.dumps(base()).replace(f'"dur": {KERNEL_DUR}', '"dur": 1e999', 1)
    with pytest.raises(CorruptInput, match="Number out of range"):
        kineto.read(str(write(tmp_path / "t.json", None, text)))


def test_msgspec_reports_error_positions() -> None:
    """The reader tells a false cut from bad bytes by the position msgspec names."""
    with pytest.raises(msgspec.DecodeError, match=r"\(byte 10\)"):
        msgspec.json.decode(b'[{"a":1}, x]')
