"""A big trace read on every core gives exactly the timeline a read in this process gives.

``GPUIDLE_READ_WORKERS`` forces the pool on small traces, and a small chunk size makes many chunks,
each with its own name and thread tables for the merge to re-intern. Every test runs twice: with the
compiled scanner (its threads read the chunks) and without it, as where no C compiler built it (the
typed decoder in forked processes).
"""

from __future__ import annotations

import gzip
import multiprocessing
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import DATA
from gpuidle.errors import CorruptInput, GpuidleError
from gpuidle.model import Timeline
from gpuidle.sources import jsonstream, kineto, kineto_read, kineto_scan

EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
TRACES = [
    "nccl_parser_config__nccl_data.json.gz",
    "negative_queue_length_values_check__rank0.json.gz",
    "trace_file_list__inference_rank_1.json.gz",
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "h200_dataloader__before.pt.trace.json.gz",
]


@pytest.fixture(autouse=True, params=["scanner", "decoder"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which reader reads the chunks: the scanner (where built) or the typed decoder alone."""
    if request.param == "scanner" and not kineto_scan.SCANNER_BUILT:
        pytest.skip("the scanner is not built (no C compiler)")
    if request.param == "decoder":
        monkeypatch.setattr(kineto_scan, "_kscan", None)
        monkeypatch.setattr(kineto_read, "SCANNER_BUILT", False)
        # the decoders are forked processes: where an earlier test left JAX loaded in this process, the reader
        # would rightly read in one process instead (tests/test_workers.py checks that)
        monkeypatch.setattr(kineto_read, "fork_hazard", lambda: None)
    return str(request.param)


def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 KiB chunks, read serially or on threads (processes use the stream's own chunk)."""
    monkeypatch.setattr(jsonstream, "CHUNK", 64 << 10)
    monkeypatch.setattr(kineto_read, "THREAD_CHUNK", 64 << 10)


def _columns(tl: Timeline) -> dict[str, Any]:
    out: dict[str, Any] = {"strings": tl.strings, "threads": tl.threads, "notes": tl.meta.notes,
                           "t0": tl.meta.t0_ns, "steps": (tl.steps.number.tolist(), tl.steps.start.tolist())}
    for group in ("device_ops", "host", "collectives", "device_ranges"):
        cols = getattr(tl, group)
        for name in getattr(cols, "__slots__", ()) or vars(cols):
            value = getattr(cols, name)
            out[f"{group}.{name}"] = value.tolist() if isinstance(value, np.ndarray) else value
    return out


def _read(path: Path, workers: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv(kineto_read.WORKERS_ENV, str(workers))
    return _columns(kineto.read(str(path)))


@pytest.mark.parametrize("name", TRACES)
def test_every_core_reads_what_one_process_reads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    small_chunks(monkeypatch)  # many chunks: the merge re-interns each one's names
    serial = _read(DATA / name, 1, monkeypatch)
    parallel = _read(DATA / name, 2, monkeypatch)
    assert parallel.keys() == serial.keys()
    for key, value in serial.items():
        assert parallel[key] == value, key


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each read of the file on every core: True while its cuts are taken on trust."""
    passes: list[bool] = []
    read_on = kineto_read._read_on

    def counted(workers: int, stream: Any, path: str, trusted: bool) -> Any:
        passes.append(trusted)
        return read_on(workers, stream, path, trusted)

    monkeypatch.setattr(kineto_read, "_read_on", counted)
    return passes


@pytest.mark.parametrize("path", [DATA / TRACES[1], EXAMPLE], ids=["events last", "keys and a list after the events"])
def test_a_well_formed_trace_is_read_once_its_cuts_on_trust(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also where keys follow the event list (the example's ``"logs": [...]``: a ``]`` after the list's own):
    the list's end is found by its syntax, not handed unread to a worker that would fail on what follows."""
    small_chunks(monkeypatch)
    passes = _reads(monkeypatch)
    _read(path, 2, monkeypatch)
    assert passes == [True]


@pytest.mark.parametrize("nested", [b'"args": {"nested": [{"a": 1}, {"b": {"c": [2]}}], ',
                                    b'"args": {"note": "x},  {y}, {z", '])
def test_cuts_inside_events_are_found_and_the_read_is_a_serial_ones(tmp_path: Path, nested: bytes,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event's args hold ``}, {`` (in nested objects, or in a string): trusted cuts fall inside events,
    a worker cannot decode its chunk, and the read starts again checking each cut: the serial read's columns."""
    text = gzip.decompress((DATA / TRACES[1]).read_bytes())
    assert text.count(b'"args": {') > 100
    path = tmp_path / "nested.json.gz"
    path.write_bytes(gzip.compress(text.replace(b'"args": {', nested)))
    small_chunks(monkeypatch)
    serial = _read(path, 1, monkeypatch)
    passes = _reads(monkeypatch)
    parallel = _read(path, 2, monkeypatch)
    assert passes == [True, False]
    assert parallel == serial


@pytest.mark.parametrize("damage", ["truncated gzip", "bad byte in the middle", "not closed"])
def test_damage_reads_the_same_error_on_every_core(tmp_path: Path, damage: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    text = gzip.decompress((DATA / "nccl_parser_config__nccl_data.json.gz").read_bytes())
    path = tmp_path / "damaged.json.gz"
    if damage == "truncated gzip":
        whole = gzip.compress(text)
        path.write_bytes(whole[: len(whole) // 2])
    elif damage == "bad byte in the middle":
        at = text.index(b'"ts"', len(text) // 2)
        path.write_bytes(gzip.compress(text[:at] + b"\x00" + text[at + 1:]))
    else:
        path.write_bytes(gzip.compress(text[: text.rindex(b"]")]))
    small_chunks(monkeypatch)
    errors = []
    for workers in (1, 2):
        monkeypatch.setenv(kineto_read.WORKERS_ENV, str(workers))
        with pytest.raises(CorruptInput) as err:
            kineto.read(str(path))
        errors.append(str(err.value))
    assert errors[0] == errors[1]


def test_who_reads_on_every_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = DATA / "nccl_parser_config__nccl_data.json.gz"
    monkeypatch.delenv(kineto_read.WORKERS_ENV, raising=False)
    assert kineto_read.read_workers(str(small)) == 1  # small: this process
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: the size alone decides
        f.truncate(kineto_read.PARALLEL_FROM)
    monkeypatch.setattr(kineto_read.os, "sched_getaffinity", lambda _: {0, 1, 2}, raising=False)
    assert kineto_read.read_workers(str(big)) == 3
    assert kineto_read.read_workers(str(tmp_path / "missing.json")) == 1  # the stream says why, in its words
    assert kineto_read.read_workers("s3://bucket/big.json.gz") == 1  # no request just to learn its size
    monkeypatch.setenv(kineto_read.WORKERS_ENV, "4")
    assert kineto_read.read_workers(str(small)) == 4
    monkeypatch.setenv(kineto_read.WORKERS_ENV, "many")
    with pytest.raises(GpuidleError, match="not a number of processes"):
        kineto_read.read_workers(str(small))
    monkeypatch.setenv(kineto_read.WORKERS_ENV, "4")
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert kineto_read.read_workers(str(big)) == 1  # a worker itself (a job's rank, a Dask task): never
    assert kineto_read.read_workers(str(small)) == 1


def test_the_thread_inflating_ahead_stops_with_the_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read whole, refused half-way or left after one chunk, the file's inflating thread is gone after the read."""
    import threading

    text = gzip.decompress((DATA / "nccl_parser_config__nccl_data.json.gz").read_bytes())
    cut = tmp_path / "cut.json.gz"
    whole = gzip.compress(text)
    cut.write_bytes(whole[: len(whole) // 2])
    small_chunks(monkeypatch)
    monkeypatch.setenv(kineto_read.WORKERS_ENV, "2")
    kineto.read(str(DATA / "nccl_parser_config__nccl_data.json.gz"))
    with pytest.raises(CorruptInput, match="truncated"):
        kineto.read(str(cut))
    stream = iter(jsonstream.TraceStream(str(DATA / "nccl_parser_config__nccl_data.json.gz"), bytes,
                                         chunk=64 << 10, inflate_ahead=True))
    assert isinstance(stream, Generator)
    assert next(stream).startswith(b"[")
    stream.close()
    assert not [t for t in threading.enumerate() if t.name == "gpuidle-inflate"]


def test_blocks_inflated_ahead_come_in_order_and_their_error_in_its_place() -> None:
    def blocks() -> Generator[bytes, None, None]:
        for i in range(50):
            yield bytes([i]) * 10
        raise CorruptInput("damaged at block 50")

    got: list[bytes] = []
    ahead = jsonstream._ahead(blocks())
    with pytest.raises(CorruptInput, match="block 50"):
        got.extend(ahead)
    assert got == [bytes([i]) * 10 for i in range(50)]
