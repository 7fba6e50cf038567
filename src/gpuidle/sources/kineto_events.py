"""Kineto events as decoded: typed structs, a lenient fallback for odd types, and integer ranges.

The typed decoder reads only the fields used. An event it refuses (a string where a number
belongs, an element that is not an object) is decoded generically and coerced in Python;
integers are kept unbounded there, and :func:`int64` tells which ones the model cannot hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from gpuidle.model import I64


class Args(msgspec.Struct, gc=False):
    correlation: int = -1
    device: int = -1
    stream: int | str = -1
    bytes: int = -1
    collective: str = msgspec.field(default="", name="Collective name")
    group: str = msgspec.field(default="", name="Process Group Name")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    group_size: int = msgspec.field(default=-1, name="Group size")
    dtype: str = ""
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


NO_TIME = float("nan")
"""A missing ``ts`` or ``dur``: not a number, so the event is skipped with the out-of-range ones."""


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = NO_TIME
    dur: float = NO_TIME
    pid: int | str = 0
    tid: int | str = 0
    args: Args | None = None


EMPTY_ARGS = Args()
_strict = msgspec.json.Decoder(list[Event])
_raws = msgspec.json.Decoder(list[msgspec.Raw])
_one = msgspec.json.Decoder(Event)
_args = msgspec.json.Decoder(Args)
_any = msgspec.json.Decoder(Any)


def _int(v: Any, default: int = -1) -> int:
    """An integer from a number or a numeric string (``"0x1f"`` too); unbounded, checked later."""
    if isinstance(v, bool) or v is None:
        return default
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        try:
            return int(str(v), 0)
        except (TypeError, ValueError):
            return default


def _float(v: Any) -> float:
    if isinstance(v, bool) or v is None:
        return NO_TIME
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return NO_TIME


def _loose_args(a: dict[str, Any]) -> Args:
    """Args from a generic decode: numbers and numeric strings as integers; a string stream (ROCm's ``"0x0"``)
    kept as the typed decoder keeps it."""
    stream = a.get("stream")
    return Args(
        correlation=_int(a.get("correlation")),
        device=_int(a.get("device")),
        stream=stream if isinstance(stream, str) else _int(stream),
        bytes=_int(a.get("bytes")),
        collective=str(a.get("Collective name", "")),
        group=str(a.get("Process Group Name", "")),
        in_nelems=_int(a.get("In msg nelems")),
        out_nelems=_int(a.get("Out msg nelems")),
        group_size=_int(a.get("Group size")),
        dtype=str(a.get("dtype", "")),
        input_dims=msgspec.Raw(msgspec.json.encode(a.get("Input Dims", []))),
        input_type=msgspec.Raw(msgspec.json.encode(a.get("Input type", []))),
    )


def _loose_to_strict(ev: dict[str, Any]) -> Event:
    a = ev.get("args")
    args = _loose_args(a if isinstance(a, dict) else {})
    pid, tid = ev.get("pid", 0), ev.get("tid", 0)
    pid = pid if isinstance(pid, int | str) and not isinstance(pid, bool) else str(pid)
    tid = tid if isinstance(tid, int | str) and not isinstance(tid, bool) else str(tid)
    return Event(str(ev.get("ph", "")), str(ev.get("cat", "")), str(ev.get("name", "")),
                  _float(ev.get("ts")), _float(ev.get("dur")), pid, tid, args)


def _event(raw: msgspec.Raw) -> Event | None:
    """One event, typed; coerced in Python only where its own fields need it (None: not an object)."""
    try:
        return _one.decode(raw)
    except msgspec.ValidationError:
        ev = _any.decode(raw)
        return _loose_to_strict(ev) if isinstance(ev, dict) else None


def decode_chunk(text: bytes) -> list[Event]:
    """Typed decoding. In a chunk with unexpected types (ROCm's ``"bytes":"616"``, elements that are not
    objects) each event is decoded typed on its own, and only those that need it are coerced in Python: one odd
    field costs its event, not its chunk."""
    try:
        return _strict.decode(text)
    except msgspec.ValidationError:
        return [e for e in map(_event, _raws.decode(text)) if e is not None]


def decode_args(text: bytes) -> Args:
    """An event's args object, typed, or coerced as its event's would be."""
    try:
        return _args.decode(text)
    except msgspec.ValidationError:
        a = _any.decode(text)
        return _loose_args(a if isinstance(a, dict) else {})


I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def int64(values: list[int]) -> tuple[I64, npt.NDArray[np.bool_]]:
    """The values as int64, and which were out of its range (those read -1)."""
    try:
        return np.array(values, dtype=np.int64), np.zeros(len(values), dtype=bool)
    except OverflowError:
        bad = np.array([not I64_MIN <= v <= I64_MAX for v in values], dtype=bool)
        return np.array([-1 if b else v for v, b in zip(values, bad, strict=True)], dtype=np.int64), bad


def int64_field(items: Sequence[Any], field: str) -> tuple[I64, npt.NDArray[np.bool_]]:
    """A field typed ``int`` (never a string) of every item, as :func:`int64` gives it: in one C loop
    unless a value overflows int64."""
    try:
        return np.fromiter(map(attrgetter(field), items), np.int64, len(items)), np.zeros(len(items), dtype=bool)
    except OverflowError:
        return int64([getattr(x, field) for x in items])


def float_field(items: Sequence[Any], field: str) -> npt.NDArray[np.float64]:
    """A field typed ``float`` of every item, in one C loop."""
    return np.fromiter(map(attrgetter(field), items), np.float64, len(items))


def fits_int32(values: I64) -> npt.NDArray[np.bool_]:
    return (values >= I32_MIN) & (values <= I32_MAX)


def fit(value: int) -> int:
    """A count or size beyond int64 is as good as unknown."""
    return value if I64_MIN <= value <= I64_MAX else -1
