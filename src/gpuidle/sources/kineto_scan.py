"""Kineto event chunks read straight into columns by the compiled scanner, when it is built.

The scanner (``_kscan.c``) reads a chunk's events into typed arrays without a Python object per event: the
cost that dominates reading a big trace in Python. It accepts only what the typed decoder would read to the same
values; any other chunk (bad syntax, odd types, numbers past int64) is decoded by
:func:`~gpuidle.sources.kineto_events.decode_chunk`, which gives that chunk's values or its error. Without a C
compiler at install time there is no scanner, and every chunk is decoded that way; ``GPUIDLE_READER=python``
reads that way too, without loading the scanner at all (a build that is broken, or a comparison of the two).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from gpuidle.model import I64
from gpuidle.sources.kineto_events import Event, decode_chunk

READER_ENV = "GPUIDLE_READER"
"""``python``: read every chunk with the typed decoder, the compiled scanner not even loaded."""

if TYPE_CHECKING or os.environ.get(READER_ENV, "").strip().lower() != "python":
    try:
        from gpuidle.sources import _kscan
    except ImportError:  # built without a C compiler
        _kscan = None  # type: ignore[assignment]
else:
    _kscan = None

I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]


class Scanned(msgspec.Struct, frozen=True):
    """One chunk's events as columns. String fields are ids into :attr:`strings` (the chunk's own, in order of
    first appearance); ``pid_s``/``tid_s`` are a string pid's or tid's id (-1: an integer, in ``pid``/``tid``);
    missing args read -1, a missing time NaN; ``args_lo:args_hi`` is the args object's text (-1: none)."""

    text: bytes
    strings: list[str]
    cat: I32
    ph: I32
    name: I32
    pid_s: I32
    tid_s: I32
    ts: F64
    dur: F64
    pid: I64
    tid: I64
    corr: I64
    device: I64
    stream: I64
    nbytes: I64
    args_lo: I64
    args_hi: I64

    def __len__(self) -> int:
        return int(self.cat.size)


SCANNER_BUILT = _kscan is not None


def scan(text: bytes) -> Scanned | None:
    """The chunk's columns; None where the scanner is not built or the chunk needs the general decoder."""
    if _kscan is None:
        return None
    out = _kscan.scan(text)
    if out is None:
        return None
    _, strings, cat, ph, name, pid_s, tid_s, ts, dur, pid, tid, corr, device, stream, nbytes, args_lo, args_hi = out

    def i32(c: _kscan.Column) -> I32:
        return np.frombuffer(memoryview(c), np.int32)

    def f64(c: _kscan.Column) -> F64:
        return np.frombuffer(memoryview(c), np.float64)

    def i64(c: _kscan.Column) -> I64:
        return np.frombuffer(memoryview(c), np.int64)

    return Scanned(text, strings, i32(cat), i32(ph), i32(name), i32(pid_s), i32(tid_s), f64(ts), f64(dur), i64(pid),
                   i64(tid), i64(corr), i64(device), i64(stream), i64(nbytes), i64(args_lo), i64(args_hi))


def scan_or_decode(text: bytes) -> Scanned | list[Event]:
    """The chunk as columns where the scanner reads it, else as decoded events (or the decoder's error)."""
    scanned = scan(text)
    return scanned if scanned is not None else decode_chunk(text)
