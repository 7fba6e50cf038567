"""The annotated trace: the original events, plus a ``gpuidle`` track of idle intervals by cause.

Open the result in Perfetto UI or chrome://tracing: beside the trace's own processes
sits one named ``gpuidle``, with a track per device, where every idle interval is an
event named by its cause (``data_loading``, ``host_sync``, ...) and carries its step
in ``args``. The causes become visible right under the kernels they explain.

The original events are copied as their JSON text, untouched, chunk by chunk as the
reader streams them; the keys around the event list are written back around it. The
output goes to a temporary file beside ``out`` that replaces ``out`` only once
complete, so a failure never leaves half a trace, and the input is never opened for
writing.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import msgspec

from gpuidle.errors import GpuidleError
from gpuidle.model import CAUSES, DeviceTimeline, IdleTimeline

PID = "gpuidle"
CATEGORY = "gpuidle"
_CAUSE_NAMES = [c.value for c in CAUSES]


def us(ns: int) -> str:
    """Integer ns as an exact decimal µs literal (``1234567`` -> ``1234.567``): no float rounding."""
    if ns < 0:
        return "-" + us(-ns)
    whole, frac = divmod(ns, 1000)
    return f"{whole}.{frac:03d}"


def track_name(d: DeviceTimeline) -> str:
    return f"GPU {d.device} idle" + (f" ({d.name})" if d.name else "")


def track_events(tl: IdleTimeline) -> Iterable[bytes]:
    """The ``gpuidle`` process: metadata, then one X event per idle segment, in trace time (µs)."""
    enc = msgspec.json.encode
    pid = enc(PID).decode()
    yield enc({"ph": "M", "name": "process_name", "pid": PID, "tid": 0,
               "args": {"name": "gpuidle: idle time by cause"}})
    yield enc({"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "args": {"sort_index": -1}})
    for d in tl.devices:
        yield enc({"ph": "M", "name": "thread_name", "pid": PID, "tid": d.device, "args": {"name": track_name(d)}})
        yield enc({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": d.device,
                   "args": {"sort_index": d.device}})
    t0 = tl.t0_ns
    for d in tl.devices:
        head = f'{{"ph":"X","cat":"{CATEGORY}","pid":{pid},"tid":{d.device},'
        for s, e, c, step in zip(d.seg_start.tolist(), d.seg_end.tolist(), d.seg_cause.tolist(),
                                 d.seg_step.tolist(), strict=True):
            cause = _CAUSE_NAMES[c]
            yield (f'{head}"name":"{cause}","ts":{us(t0 + s)},"dur":{us(e - s)},'
                   f'"args":{{"cause":"{cause}","step":{step},"device":{d.device}}}}}').encode()


def write_annotated(
    out: str | Path,
    events: Iterable[list[msgspec.Raw]],
    header: Mapping[str, Any],
    timeline: IdleTimeline,
) -> None:
    """Write the annotated trace to ``out`` (gzip when it ends in ``.gz``).

    :param events: the original events, chunk by chunk, each event as its raw JSON.
    :param header: the keys around the event list; a live mapping that the reader fills
        while ``events`` is consumed (keys after the list arrive last).
    """
    out = _target(Path(out))
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as raw:
            if out.name.endswith(".gz"):
                with gzip.GzipFile(filename=out.name[:-3], mode="wb", fileobj=raw, compresslevel=6) as f:
                    _write(f, events, header, timeline)
            else:
                _write(raw, events, header, timeline)
        os.replace(tmp, out)
    except OSError as err:
        raise GpuidleError(f"cannot write {out}: {err.strerror or err}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _target(out: Path) -> Path:
    """The file the annotated trace replaces: where a link points (the link kept), and never a device, a FIFO or a
    folder, which a rename would replace rather than write."""
    try:
        if out.is_symlink():
            out = out.resolve(strict=False)
        special = out.exists() and not out.is_file()
    except (OSError, RuntimeError) as err:  # a loop of links
        raise GpuidleError(f"cannot write {out}: {getattr(err, 'strerror', None) or err}") from None
    if special:
        raise GpuidleError(f"cannot write {out}: not a regular file", "give a file path for the annotated trace")
    return out


def _keys(header: Mapping[str, Any], skip: set[str]) -> list[bytes]:
    enc = msgspec.json.encode
    return [enc(k) + b":" + enc(v) for k, v in header.items() if k not in skip]


def _write(
    f: IO[bytes] | gzip.GzipFile, events: Iterable[list[msgspec.Raw]], header: Mapping[str, Any], tl: IdleTimeline,
) -> None:
    written: set[str] | None = None
    first = True
    for chunk in events:
        if written is None:  # the keys before the event list are known by the first chunk
            written = set(header)
            f.write(b"{" + b"".join(k + b"," for k in _keys(header, set())) + b'"traceEvents":[\n')
        if chunk:
            f.write((b"" if first else b",\n") + b",\n".join(bytes(e) for e in chunk))
            first = False
    if written is None:
        written = set(header)
        f.write(b"{" + b"".join(k + b"," for k in _keys(header, set())) + b'"traceEvents":[\n')
    batch: list[bytes] = []
    for event in track_events(tl):
        batch.append(event)
        if len(batch) >= 4096:
            f.write((b"" if first else b",\n") + b",\n".join(batch))
            first, batch = False, []
    if batch:
        f.write((b"" if first else b",\n") + b",\n".join(batch))
    f.write(b"\n]" + b"".join(b"," + k for k in _keys(header, written)) + b"}\n")
