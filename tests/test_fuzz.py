"""Seeded mutants of the real test traces through ``gpuidle analyze``, in this process.

Each mutant either exits 0 with a sane report (utilization in [0, 1], idle causes adding up
to the idle time, busy + idle = window, no NaN or Infinity in the JSON, nothing on stderr, no
warning) or exits 2 with exactly one ``gpuidle: error:`` line; never a traceback, and the
input file is never modified. The mutant for a given number is always the same.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA
from gpuidle.cli import main
from gpuidle.sources import jsonstream

SEEDS = (
    "trace_compare__base__base.json.gz",
    "trace_compare__test__test.json.gz",
    "trace_file_list__inference_rank_1.json.gz",
    "critical_path__cuda_event_sync__event_sync_trace.json.gz",
    "triton_example__triton_example.json.gz",
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
)
MUTANTS = 320
BOMB_LIMIT = 1 << 20
"""The per-event limit while fuzzing, so that a small bomb (a few MiB) trips it."""


@cache
def seed_text(name: str) -> str:
    return gzip.decompress((DATA / name).read_bytes()).decode()


def seed_doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(seed_text(name))
    return doc


def random_events(doc: dict[str, Any], rng: random.Random, k: int) -> list[dict[str, Any]]:
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime")]
    pool = gpu if gpu and rng.random() < 0.7 else events
    return rng.sample(pool, min(k, len(pool)))


WRONG = ["x", [], {}, None, True, "12", -1, 0, "0x10", [1, 2], {"a": 1}, "", 1.5]
HUGE = [2**64, 2**70, -(2**70), 1e30, -1e30, 1e16, -1e16, 1e308, 9.3e15, 2**63, "1e400", "nan", "inf", "-inf"]
FIELDS = ["ts", "dur", "pid", "tid", "name", "cat", "ph", "args"]
ARGS = ["stream", "correlation", "device", "bytes", "Collective name", "In msg nelems", "Group size", "dtype",
        "Input Dims", "Input type"]


def set_field(e: dict[str, Any], rng: random.Random, values: list[Any]) -> None:
    if rng.random() < 0.5 and isinstance(e.get("args"), dict):
        e["args"][rng.choice(ARGS)] = rng.choice(values)
    else:
        e[rng.choice(FIELDS)] = rng.choice(values)


def m_missing_keys(doc: dict[str, Any], rng: random.Random) -> None:
    for e in random_events(doc, rng, rng.randint(1, 5)):
        if e:
            del e[rng.choice(list(e))]


def m_wrong_types(doc: dict[str, Any], rng: random.Random) -> None:
    for e in random_events(doc, rng, rng.randint(1, 5)):
        set_field(e, rng, WRONG)


def m_huge_numbers(doc: dict[str, Any], rng: random.Random) -> None:
    for e in random_events(doc, rng, rng.randint(1, 3)):
        set_field(e, rng, HUGE)


DEEP = "<deep>"
"""Stands for deep nesting in a document, written out after json.dumps (which would recurse)."""


def m_deep_nesting(doc: dict[str, Any], rng: random.Random) -> None:
    e = random_events(doc, rng, 1)[0]
    where = rng.choice([e.setdefault("args", {}) if isinstance(e.get("args", {}), dict) else e, e, doc])
    where[rng.choice(["deep", "Input Dims", "deviceProperties", "stream"])] = DEEP


def m_header(doc: dict[str, Any], rng: random.Random) -> None:
    info = doc.setdefault("distributedInfo", {})
    if not isinstance(info, dict):
        info = doc["distributedInfo"] = {}
    info[rng.choice(["rank", "world_size", "backend", "pg_config"])] = rng.choice(WRONG + HUGE)
    if rng.random() < 0.5:
        doc["deviceProperties"] = rng.choice([[{"id": rng.choice(HUGE), "name": "x"}], "x", [None], {"id": 0}])


def m_shuffle_and_duplicate(doc: dict[str, Any], rng: random.Random) -> None:
    events = doc["traceEvents"]
    extra = [json.loads(json.dumps(e)) for e in random_events(doc, rng, rng.randint(1, 10))]
    events.extend(extra)
    rng.shuffle(events)


DOC_MUTATIONS: dict[str, Callable[[dict[str, Any], random.Random], None]] = {
    "missing keys": m_missing_keys, "wrong types": m_wrong_types, "huge numbers": m_huge_numbers,
    "deep nesting": m_deep_nesting, "header": m_header, "shuffle": m_shuffle_and_duplicate,
}


def t_truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def t_flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def t_nan_tokens(data: bytes, rng: random.Random) -> bytes:
    token = rng.choice([b"NaN", b"Infinity", b"-Infinity", b'"nan"', b'"inf"', b"nan", b"1e999", b"-0"])
    key = rng.choice([b'"ts": ', b'"dur": ', b'"pid": ', b'"correlation": '])
    starts = [i for i in range(len(data)) if data.startswith(key, i)]
    if not starts:
        return data
    at = rng.choice(starts) + len(key)
    end = at
    while end < len(data) and data[end:end + 1] not in b",}":
        end += 1
    return data[:at] + token + data[end:]


def t_non_utf8(data: bytes, rng: random.Random) -> bytes:
    at = data.find(b'"name": "', rng.randrange(len(data)))
    at = at + 9 if at >= 0 else rng.randrange(len(data))
    return data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\x1b]0;x\x07"]) + data[at:]


def t_whitespace_bomb(data: bytes, rng: random.Random) -> bytes:
    at = data.find(b"},", rng.randrange(len(data)))
    at = at + 2 if at >= 0 else len(data) // 2
    return data[:at] + b" " * rng.choice([BOMB_LIMIT // 2, 3 * BOMB_LIMIT]) + data[at:]


def t_name_bomb(data: bytes, rng: random.Random) -> bytes:
    at = data.find(b'"name": "', rng.randrange(len(data)))
    at = at + 9 if at >= 0 else len(data) // 2
    return data[:at] + b"A" * (3 * BOMB_LIMIT) + data[at:]


BYTE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "truncate": t_truncate, "flip": t_flip, "nan tokens": t_nan_tokens, "non-utf8": t_non_utf8,
    "whitespace bomb": t_whitespace_bomb, "name bomb": t_name_bomb,
}


def mutant(n: int) -> tuple[str, bytes, bool]:
    """The ``n``-th mutant: what was done, the bytes, and whether to gzip them."""
    rng = random.Random(n)
    seed = rng.choice(SEEDS)
    gz = rng.random() < 0.5
    what = rng.choice(list(DOC_MUTATIONS) + list(BYTE_MUTATIONS))
    if what in DOC_MUTATIONS:
        doc = seed_doc(seed)
        DOC_MUTATIONS[what](doc, rng)
        text = json.dumps(doc, indent=rng.choice([None, 1])).encode()
        depth = rng.choice([50, 500, 1000, 3000])
        text = text.replace(json.dumps(DEEP).encode(), b"[" * depth + b"1" + b"]" * depth)
    else:
        text = BYTE_MUTATIONS[what](seed_text(seed).encode(), rng)
    return f"{what} of {seed}", text, gz


def strict_json(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in the JSON report")

    return json.loads(text, parse_constant=refuse)


def assert_sane(report: dict[str, Any]) -> None:
    for rank in report["ranks"]:
        for d in rank["devices"]:
            assert 0.0 <= d["utilization"] <= 1.0, d
            assert math.isclose(sum(d["idle_by_cause_s"].values()), d["idle_s"], rel_tol=1e-6, abs_tol=1e-9), d
            # idle under one-time start-up costs is in the rank's window, in no cause and not in the device's window
            assert math.isclose(d["busy_s"] + d["idle_s"], d["window_s"], rel_tol=1e-6, abs_tol=1e-9), d
            assert d["window_s"] + d["startup_s"] <= rank["window"]["dur_s"] * (1 + 1e-6) + 1e-9, (d, rank["window"])
            assert min(d["window_s"], d["busy_s"], d["idle_s"], d["startup_s"]) >= 0, d
        assert min(rank["window"]["dur_s"], rank["window"]["start_s"]) >= 0, rank["window"]


@pytest.mark.parametrize("n", range(MUTANTS))
def test_mutant(n: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    what, text, gz = mutant(n)
    monkeypatch.setattr(jsonstream, "MAX_EVENT", BOMB_LIMIT)
    path = tmp_path / ("mutant.json.gz" if gz else "mutant.json")
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["analyze", "--no-ledger", "--json", str(path)])
    out, err = capsys.readouterr()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, what
    assert not caught, (what, [str(w.message) for w in caught])
    if code == 0:
        assert err == "", (what, err)
        assert_sane(strict_json(out))
    elif code == 1:  # the device's records gone, the launches kept: the host side, said once on stderr
        report = strict_json(out)
        assert report["ranks"] == [], what
        assert report["host_side"], what
        assert [q["kind"] for q in report["quality"]] == ["device_records_lost"], what
        assert err.startswith("gpuidle: warning: "), (what, err)
        assert "device records were lost" in err, (what, err)
    else:
        assert code == 2, (what, code, err)
        lines = err.splitlines()
        assert len(lines) == 1, (what, err)
        assert lines[0].startswith("gpuidle: error: "), (what, err)
