"""Both gzip inflaters (ISA-L when installed, the standard library's zlib) read every trace alike: the same
bytes, the same timeline, the same one-line error for damaged or truncated data."""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.analysis.summary import summarize_rank
from gpuidle.errors import CorruptInput
from gpuidle.sources import inflate, kineto

pytest.importorskip("isal")

TRACE = DATA / "trace_filter__sampled_rank-0.json.gz"


@pytest.fixture(params=["isal", "zlib"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    inflate._backend.cache_clear()
    if request.param == "zlib":
        monkeypatch.setitem(sys.modules, "isal", None)  # as if not installed
    assert inflate.backend() == request.param
    yield request.param
    inflate._backend.cache_clear()


def _inflate_all(data: bytes) -> bytes:
    out, pending = [], data
    d = inflate.gunzipper()
    while pending:
        if d.eof:
            d = inflate.gunzipper()
        out.append(d.decompress(pending, 1 << 16))
        pending = d.unconsumed_tail or d.unused_data
    return b"".join(out)


def test_same_bytes_as_gzip_also_for_several_members(backend: str) -> None:
    data = TRACE.read_bytes()
    assert _inflate_all(data + data) == gzip.decompress(data) * 2


def test_same_analysis_with_either(monkeypatch: pytest.MonkeyPatch) -> None:
    reports = []
    for blocked in (False, True):
        inflate._backend.cache_clear()
        if blocked:
            monkeypatch.setitem(sys.modules, "isal", None)
        reports.append((inflate.backend(), summarize_rank(kineto.read(str(TRACE))).report))
    inflate._backend.cache_clear()
    assert [name for name, _ in reports] == ["isal", "zlib"]
    assert reports[0][1] == reports[1][1]


@pytest.mark.parametrize("damage", ["truncated", "bad bytes"])
def test_same_error_line(backend: str, damage: str, tmp_path: Path) -> None:
    data = TRACE.read_bytes()
    bad = data[: len(data) // 2] if damage == "truncated" else data[:200] + b"\xff" * 64 + data[264:]
    path = tmp_path / "t.json.gz"
    path.write_bytes(bad)
    with pytest.raises(CorruptInput) as err:
        kineto.read(str(path))
    if damage == "truncated":
        assert str(err.value).startswith(f"{path}: the gzip stream is truncated")
    else:
        assert str(err.value).startswith(f"{path}: damaged gzip data (")
    with pytest.raises(zlib.error):
        gzip.decompress(bad) if damage == "bad bytes" else zlib.decompress(bad, wbits=31)
