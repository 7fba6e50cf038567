"""The Kineto reader: both schemas, ROCm, exact timestamps, linkage, metadata, and chunked streaming."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA
from gpuidle.errors import CorruptInput
from gpuidle.model import CopyKind, DeviceOpKind, HostKind, Timeline
from gpuidle.sources import jsonstream, kineto, kineto_scan
from minitrace import Trace


def columns(tl: Timeline) -> dict[str, np.ndarray]:
    d, h = tl.device_ops, tl.host
    return {"ds": d.start, "de": d.end, "dn": np.array([tl.strings[i] for i in d.name]), "dc": d.correlation,
            "hs": h.start, "he": h.end, "hn": np.array([tl.strings[i] for i in h.name]), "hk": h.kind}


@pytest.mark.parametrize("name", ["nccl_parser_config__nccl_data.json.gz", "trace_filter__sampled_rank-0.json.gz"])
def test_tiny_chunks_read_the_same_timeline(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = columns(kineto.read(str(DATA / name)))
    monkeypatch.setattr(jsonstream, "CHUNK", 3000)
    monkeypatch.setattr(jsonstream, "READ_BLOCK", 777)
    chunked = columns(kineto.read(str(DATA / name)))
    for key, col in whole.items():
        np.testing.assert_array_equal(col, chunked[key], err_msg=key)


def test_false_cuts_inside_strings_and_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`},{` inside a name or nested args must not split an event; keys after the array are read."""
    t = Trace(rank=3, world=4)
    t.step(1, 0, 1000)
    for i in range(40):
        t.launch(at=i * 20, call_dur=5, start=i * 20 + 10, dur=5, name=f"k_{i}}},{{weird\\\"name")
        t.op("aten::foo", i * 20, 3, nested=[{"a": 1}, {"b": [1, 2]}])
    doc = t.to_dict()
    events = doc.pop("traceEvents")
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, **doc}, indent=1)
    path = tmp_path / "t.json"
    path.write_text(text)
    monkeypatch.setattr(jsonstream, "CHUNK", 200)
    monkeypatch.setattr(jsonstream, "READ_BLOCK", 64)
    tl = kineto.read(str(path))
    assert len(tl.device_ops) == 40
    assert tl.strings[tl.device_ops.name[3]] == 'k_3},{weird\\"name'
    assert tl.meta.rank == 3
    assert tl.meta.world_size == 4
    assert tl.meta.device_names == {0: "Test GPU"}


def test_bare_array_and_multimember_gzip(tmp_path: Path) -> None:
    t = Trace()
    t.launch(at=0, call_dur=5, start=10, dur=5)
    t.launch(at=1, call_dur=5, start=20, dur=5)
    text = json.dumps(t.events).encode()
    half = len(text) // 2
    path = tmp_path / "bare.json.gz"
    path.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    tl = kineto.read(str(path))
    assert len(tl.device_ops) == 2
    assert any("no rank" in n for n in tl.meta.notes)


def test_fractional_microseconds_are_kept_to_the_nanosecond(tmp_path: Path) -> None:
    t = Trace()
    t.launch(at=4458676522690.655, call_dur=1.284, start=4458676522700.001, dur=41.407)
    tl = kineto.read(str(t.write(tmp_path / "t.json.gz")))
    d, h = tl.device_ops, tl.host
    assert int(d.start[0] - h.start[0]) == 9346
    assert int(d.end[0] - d.start[0]) == 41407
    assert int(h.end[0] - h.start[0]) == 1284
    assert tl.meta.t0_ns + int(h.start[0]) == 4458676522690655


def test_epoch_microseconds_do_not_lose_precision() -> None:
    tl = kineto.read(str(DATA / "trace_file_list__inference_rank_1.json.gz"))
    raw = json.loads(gzip.decompress((DATA / "trace_file_list__inference_rank_1.json.gz").read_bytes()))
    first_kernel = next(e for e in raw["traceEvents"] if e.get("cat") == "Kernel")
    assert tl.meta.t0_ns + int(tl.device_ops.start[0]) == first_kernel["ts"] * 1000


def test_old_schema_categories_and_stream_tid() -> None:
    tl = kineto.read(str(DATA / "trace_file_list__inference_rank_1.json.gz"))
    assert len(tl.device_ops) == 4
    assert set(tl.device_ops.kind.tolist()) == {DeviceOpKind.KERNEL}
    assert set(tl.device_ops.stream.tolist()) == {7}
    assert (tl.host.kind == HostKind.RUNTIME).sum() == 8
    assert tl.meta.rank == 1


def test_rocm_trace_hip_names_and_copies() -> None:
    tl = kineto.read(str(DATA / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"))
    assert tl.devices == [2]
    names = {tl.strings[i] for i in tl.host.name[tl.host.kind == HostKind.RUNTIME]}
    assert "hipLaunchKernel" in names
    assert set(tl.device_ops.copy_kind[tl.device_ops.kind == DeviceOpKind.MEMCPY].tolist()) == {CopyKind.HTOD}
    assert list(tl.steps.number) == [1, 2]  # the GPU-side copy of ProfilerStep#1 is not a host step
    assert tl.meta.device_names[2].startswith("AMD")


def test_correlation_links_runtime_to_kernels() -> None:
    from gpuidle.analysis.links import launcher_rows

    tl = kineto.read(str(DATA / "nccl_parser_config__nccl_data.json.gz"))
    rows = launcher_rows(tl)
    linked = rows >= 0
    assert linked.mean() > 0.99
    assert (tl.host.correlation[rows[linked]] == tl.device_ops.correlation[linked]).all()
    assert (tl.host.start[rows[linked]] <= tl.device_ops.start[linked]).all()


def test_collectives_and_distributed_info() -> None:
    tl = kineto.read(str(DATA / "nccl_parser_config__nccl_data.json.gz"))
    assert (tl.meta.rank, tl.meta.world_size, tl.meta.backend) == (0, 2, "nccl")
    assert (tl.device_ops.kind == DeviceOpKind.COLLECTIVE).sum() == 21
    calls = tl.collectives
    first = next(i for i in range(len(calls)) if calls.collective[i] == "allreduce")
    assert calls.in_bytes[first] == 2049000 * 4
    assert calls.group_size[first] == 2


def test_unknown_categories_are_ignored(tmp_path: Path) -> None:
    t = Trace()
    t.launch(at=0, call_dur=5, start=10, dur=5)
    t.x("some_future_category", "whatever", 1, 2)
    t.events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": "12", "dur": 3, "pid": 0, "tid": 7,
                     "args": {"device": "0", "correlation": None}})  # odd types: lenient path
    tl = kineto.read(str(t.write(tmp_path / "t.json.gz")))
    assert len(tl.device_ops) == 2


def test_corrupt_event_list(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1,, "dur": 2}]}')
    with pytest.raises(CorruptInput):
        kineto.read(str(path))


@pytest.mark.parametrize("name", ["nccl_parser_config__nccl_data.json.gz", "h200_dataloader__before.pt.trace.json.gz",
                                  "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
def test_gpu_annotations_are_ranges_on_the_device_not_its_work(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpu_user_annotation`` events are kept as ranges on their device's timeline (device from the pid, stream
    from the tid, as Kineto writes them), never as device work; the scanner and the typed decoder read them alike."""
    path = DATA / name
    with gzip.open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    marked = sorted((e["name"], e["pid"], e["tid"]) for e in events
                    if e.get("cat") == "gpu_user_annotation" and e.get("ph") == "X")
    work = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    tl = kineto.read(str(path))
    ranges = tl.device_ranges
    assert marked
    assert sorted(zip([tl.strings[i] for i in ranges.name], ranges.device.tolist(), ranges.stream.tolist(),
                      strict=True)) == marked
    assert len(tl.device_ops) == work
    assert (ranges.end >= ranges.start).all()
    monkeypatch.setattr(kineto_scan, "_kscan", None)
    decoded = kineto.read(str(path))
    for field in ("start", "end", "device", "stream", "name"):
        np.testing.assert_array_equal(getattr(decoded.device_ranges, field), getattr(ranges, field), err_msg=field)
    np.testing.assert_array_equal(decoded.device_ops.start, tl.device_ops.start)
