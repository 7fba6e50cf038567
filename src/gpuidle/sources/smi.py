"""Device-counter logs: ``nvidia-smi --query-gpu`` CSV, ``nvidia-smi dmon``, and gpuidle's own JSONL
(and, by their own modules, ``dcgmi dmon`` and a Prometheus range-query export).

Each reader turns one log into a :class:`~gpuidle.model.UtilSeries`. The format is
recognised from the first line; a file is only ever read.

nvidia-smi CSV (``--query-gpu=... --format=csv[,noheader][,nounits] -l 1`` or ``-lms 100``)
writes one row per GPU per sample, fields separated by ``", "``. Headers carry units
(``utilization.gpu [%]``), values too unless ``nounits`` (``87 %``, ``1234 MiB``,
``250.31 W``); a value nvidia-smi cannot read is ``[N/A]``, ``[Not Supported]`` or
another bracketed word. Newer drivers renamed ``clocks_throttle_reasons.*`` to
``clocks_event_reasons.*``; both are read. Without a header (``noheader``) the field
list must be given, as it was passed to ``--query-gpu``.

``nvidia-smi dmon`` prints a ``# gpu pwr gtemp ...`` header and a ``# Idx W C ...`` unit
line (repeated from time to time), then one whitespace-aligned row per GPU per
interval, ``-`` where a value is not available; ``-o D``/``-o T`` prepend ``Date``
(``YYYYMMDD``) and ``Time`` (``HH:MM:SS``). Without a time column, rows are spaced by
the interval (``-d``, 1 s by default).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

import msgspec
import numpy as np

from gpuidle.errors import CorruptInput, InputNotFound, NotATrace
from gpuidle.model import (
    GPU_METRICS,
    THROTTLE_REASONS,
    DeviceSeries,
    MonitorEnd,
    MonitorHeader,
    MonitorRecord,
    MonitorSample,
    UtilSeries,
    plausible_unix_s,
    util_series_from_records,
)
from gpuidle.sources import dcgm, prometheus
from gpuidle.sources.inflate import gunzip_whole
from gpuidle.sources.inputs import display, is_folder, is_url, read_bytes

FORMAT_CSV = "nvidia-smi-csv"
FORMAT_DMON = "nvidia-smi-dmon"

# nvidia-smi --query-gpu field -> our column. The first field present wins for each column.
CSV_FIELDS: dict[str, str] = {
    "utilization.gpu": "util_pct",
    "utilization.memory": "mem_util_pct",
    "memory.used": "mem_used_mib",
    "memory.total": "mem_total_mib",
    "clocks.sm": "sm_clock_mhz",
    "clocks.current.sm": "sm_clock_mhz",
    "clocks.gr": "sm_clock_mhz",
    "clocks.current.graphics": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "clocks.current.memory": "mem_clock_mhz",
    "power.draw": "power_w",
    "power.draw.instant": "power_w",
    "power.draw.average": "power_w",
    "enforced.power.limit": "power_limit_w",
    "power.limit": "power_limit_w",
    "temperature.gpu": "temp_c",
    "clocks_event_reasons.active": "throttle_reasons",
    "clocks_throttle_reasons.active": "throttle_reasons",
}
_REASON_BITS = {name: bit for bit, name in THROTTLE_REASONS.items()}
_REASON_BITS["user_defined_clocks"] = 0x2
_REASON_PREFIXES = ("clocks_event_reasons.", "clocks_throttle_reasons.")

DMON_COLUMNS: dict[str, str] = {
    "pwr": "power_w",
    "gtemp": "temp_c",
    "sm": "util_pct",
    "mem": "mem_util_pct",
    "mclk": "mem_clock_mhz",
    "pclk": "sm_clock_mhz",
    "fb": "mem_used_mib",
    "rxpci": "pcie_rx_mib_s",
    "txpci": "pcie_tx_mib_s",
}
"""dmon column -> our column (dmon's ``sm`` is utilization.gpu; MB there are MiB)."""

DMON_DEFAULT_INTERVAL_S = 1.0


MAX_LOG_BYTES = 1 << 30
"""The most a counter log may hold, decompressed: it is read whole (a week of one-second samples of 8 GPUs is some
0.7 GiB)."""


MAX_LOG_DEVICES = 16384
"""The most GPUs one counter log may hold: a fleet's range query, not a node's log (each GPU is summarised on its
own, so 100,000 crafted indices would take minutes)."""


def read(path: str | Path, fields: Sequence[str] | None = None, interval_s: float | None = None,
         max_bytes: int = MAX_LOG_BYTES) -> UtilSeries:
    """Any supported counter log. ``fields``: the ``--query-gpu`` list of a CSV without header;
    ``interval_s``: the ``-d`` of a dmon log without time columns; ``max_bytes``: the most it may hold, decompressed.
    """
    series = _read(path, fields, interval_s, max_bytes)
    if len(series.devices) > MAX_LOG_DEVICES:
        raise CorruptInput(f"{path}: {len(series.devices)} GPUs in one log (the limit is {MAX_LOG_DEVICES})",
                           "a damaged index column, or split the fleet's query by host")
    return series


def _read(path: str | Path, fields: Sequence[str] | None, interval_s: float | None, max_bytes: int) -> UtilSeries:
    p = path if is_url(path) else Path(path)
    if isinstance(p, Path) and not p.exists():
        raise InputNotFound(f"{p}: no such file")
    if p.is_dir() if isinstance(p, Path) else is_folder(p):
        raise InputNotFound(f"{display(p) if isinstance(p, str) else p} is a folder", "give one log file")
    with _open_text(p, max_bytes) as f:
        first = _first_line(f)
        f.seek(0)
        if first is None:
            raise NotATrace(f"{p}: empty file")
        if first.startswith("{"):
            text = f.read()
            if prometheus.looks_like(text[:4096]):
                return prometheus.read(text, str(p))
            f.seek(0)
            return read_jsonl(f, str(p))
        if first.startswith("#"):
            if dcgm.looks_like(first):
                return dcgm.read(f, str(p), interval_s)
            return read_dmon(f, str(p), interval_s)
        return read_csv(f, str(p), fields)


def _open_text(p: str | Path, max_bytes: int) -> IO[str]:
    raw = read_bytes(p, max_bytes)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_whole(raw, max_bytes, str(p))
    return io.StringIO(_decode(raw))


def _decode(raw: bytes) -> str:
    """UTF-8, with or without a byte-order mark; UTF-16 when a BOM says so (PowerShell's ``>`` writes it)."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return raw.decode("utf-16", errors="replace")
    return raw.decode("utf-8-sig", errors="replace")


def _first_line(f: IO[str]) -> str | None:
    for line in f:
        if line.strip():
            return line.lstrip("\ufeff").strip()
    return None


# ----------------------------------------------------------------------------------
# gpuidle's own JSONL
# ----------------------------------------------------------------------------------


def read_jsonl(f: IO[str], path: str) -> UtilSeries:
    """A ``gpuidle monitor``/``run`` log. A cut-off last line (the run was killed) is dropped with a note."""
    dec = msgspec.json.Decoder(MonitorRecord)
    header: MonitorHeader | None = None
    end: MonitorEnd | None = None
    samples: list[MonitorSample] = []
    bad: list[int] = []
    lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = dec.decode(line)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nesting deeper than msgspec follows
            bad.append(n)
            continue
        if isinstance(rec, MonitorHeader):
            if header is None:
                header = rec
        elif isinstance(rec, MonitorSample):
            if plausible_unix_s(rec.t):
                samples.append(rec)
            else:
                bad.append(n)
        else:
            end = rec
    if header is None:
        raise NotATrace(f"{path}: not a gpuidle monitor log (no header line)",
                        "nvidia-smi CSV and dmon logs are read too; JSON traces go to gpuidle analyze")
    notes = _in_time_order(samples)
    series = util_series_from_records(header, samples, end, path)
    series.notes.extend(notes)
    last = len(lines)
    if bad:
        cut = [n for n in bad if n == last]
        broken = [n for n in bad if n != last]
        if cut:
            series.notes.append(f"last line {last} is cut off (the run ended abruptly); ignored")
        if broken:
            series.notes.append(f"{len(broken)} unreadable line(s) ignored, first at line {broken[0]}")
    return series


def _in_time_order(samples: list[MonitorSample]) -> list[str]:
    """Sort samples by time (stable), in place; a note when the log had them out of order."""
    t = [s.t for s in samples]
    if all(a <= b for a, b in itertools.pairwise(t)):
        return []
    samples.sort(key=lambda s: s.t)
    return [UNORDERED_NOTE]


UNORDERED_NOTE = "the log's timestamps go backwards in places (a clock change?): samples were put in time order"


# ----------------------------------------------------------------------------------
# Shared: rows per device into columns
# ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Rows:
    t: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)
    name: str | None = None

    def add(self, t: float, row: dict[str, float]) -> None:
        n = len(self.t)
        self.t.append(t)
        for key, v in row.items():
            col = self.values.get(key)
            if col is None:
                col = self.values[key] = [np.nan] * n
            col.append(v)
        for col in self.values.values():
            if len(col) == n:
                col.append(np.nan)


def _series(rows: dict[int, _Rows], fmt: str, path: str, origin: float | None, interval: float | None,
            notes: list[str]) -> UtilSeries:
    """Columns per device, times from the earliest row; ``origin``: the Unix time of row time 0, when known."""
    base = min((min(r.t) for r in rows.values() if r.t), default=0.0)
    if any(a > b for r in rows.values() for a, b in itertools.pairwise(r.t)):
        notes.append(UNORDERED_NOTE)
    devices = []
    for idx in sorted(rows):
        r = rows[idx]
        order = np.argsort(np.asarray(r.t), kind="stable")
        t = np.asarray(r.t, dtype=np.float64)[order] - base
        values = {k: np.asarray(v, dtype=np.float64)[order] for k, v in r.values.items() if k in GPU_METRICS}
        devices.append(DeviceSeries(device=idx, name=r.name, t=t, values=values))
    return UtilSeries(devices=devices, host=None, format=fmt, paths=[path],
                      t0=origin + base if origin is not None else None, interval_s=interval, notes=notes)


# ----------------------------------------------------------------------------------
# nvidia-smi --query-gpu CSV
# ----------------------------------------------------------------------------------

_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")


def _field_name(cell: str) -> str:
    """``" utilization.gpu [%]"`` -> ``"utilization.gpu"``."""
    name = cell.strip().lower()
    if "[" in name:
        name = name[: name.index("[")].strip()
    return name


def _value(cell: str) -> str | None:
    """The text of a value without its unit; None for ``[N/A]``, ``N/A``, ``[Not Supported]`` and kin."""
    v = cell.strip()
    if not v or v.startswith("[") or v.upper() in ("N/A", "-"):
        return None
    return v


def _number(cell: str) -> float:
    v = _value(cell)
    if v is None:
        return np.nan
    head = v.split()[0]
    try:
        if head.lower().startswith("0x"):
            mask = int(head, 16)
            # a clock event mask has 64 bits; NVML's reasons are the low ones, which a float holds exactly
            return float(mask & 0xFFFFFFFF) if mask < 1 << 64 else np.nan
        return float(head)
    except ValueError:
        return np.nan


def _timestamp(cell: str) -> datetime | None:
    """nvidia-smi's local time, ``2024/05/02 14:03:11.105``. Kept as a datetime so differences are exact."""
    v = _value(cell)
    if v is None:
        return None
    for fmt in _TIME_FORMATS:
        try:
            return datetime.strptime(v, fmt)
        except ValueError:
            continue
    return None


def read_csv(f: IO[str], path: str, fields: Sequence[str] | None = None) -> UtilSeries:
    """nvidia-smi ``--query-gpu`` CSV, with or without header and units."""
    lines = (line.rstrip("\r\n") for line in f)
    names: list[str] | None = [_field_name(x) for x in fields] if fields else None
    rows: dict[int, _Rows] = {}
    key_of: dict[str, int] = {}
    notes: list[str] = []
    skipped = bad_index = 0
    origin: datetime | None = None
    for raw in lines:
        if not raw.strip():
            continue
        cells = [c.strip() for c in raw.split(",")]
        if _is_header(cells):
            header = [_field_name(c) for c in cells]
            if names is not None and header != names and fields is None:
                notes.append("the field list changes inside the file; later rows follow the later header")
            names = header
            continue
        if names is None:
            raise NotATrace(f"{path}: no header line, and no field list given",
                            "pass --fields with the --query-gpu list the log was recorded with")
        if len(cells) != len(names):
            skipped += 1
            continue
        rec = dict(zip(names, cells, strict=True))
        idx = _device_index(rec, key_of)
        if idx is None:
            bad_index += 1
            continue
        stamp = _timestamp(rec["timestamp"]) if "timestamp" in rec else None
        if stamp is None:
            t = float(len(rows.get(idx, _Rows()).t))
        else:
            origin = origin or stamp
            t = (stamp - origin).total_seconds()
        row = _csv_row(rec)
        r = rows.setdefault(idx, _Rows())
        if r.name is None and rec.get("name"):
            r.name = _value(rec["name"])
        r.add(t, row)
    if names is None or not rows:
        raise NotATrace(f"{path}: no nvidia-smi samples found",
                        "record with: nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,"
                        "memory.total --format=csv -lms 500 > util.csv")
    if "utilization.gpu" not in names:
        notes.append("the log has no utilization.gpu column: utilization figures are N/A")
    if origin is None:
        notes.append("no timestamp column: samples are spaced 1 s apart")
    if skipped:
        notes.append(f"{skipped} row(s) with the wrong number of fields ignored")
    if bad_index:
        notes.append(f"{bad_index} row(s) with an unreadable GPU index ignored")
    return _series(rows, FORMAT_CSV, path, origin.timestamp() if origin else None, None, notes)


def _is_header(cells: list[str]) -> bool:
    first = _field_name(cells[0])
    return first in ("timestamp", "index", "name", "uuid", "pci.bus_id", "driver_version") or \
        first in CSV_FIELDS or first.startswith(_REASON_PREFIXES)


def _device_index(rec: dict[str, str], key_of: dict[str, int]) -> int | None:
    """``index`` when logged (None when it is not a number); else the order in which each uuid or bus id
    first appears."""
    if "index" in rec:
        v = rec["index"].strip()
        # ASCII digits only ("²" passes isdigit()), and few of them: an index is small
        return int(v) if v.isascii() and v.isdigit() and len(v) <= 6 else None
    key = rec.get("uuid") or rec.get("pci.bus_id") or ""
    return key_of.setdefault(key, len(key_of))


def _csv_row(rec: dict[str, str]) -> dict[str, float]:
    row: dict[str, float] = {}
    for name, cell in rec.items():
        col = CSV_FIELDS.get(name)
        if col is not None and (col not in row or np.isnan(row[col])):
            row[col] = _number(cell)
    if "mem_used_mib" not in row and "memory.free" in rec and "memory.total" in rec:
        row["mem_used_mib"] = _number(rec["memory.total"]) - _number(rec["memory.free"])
    if "throttle_reasons" not in row:
        mask, known = 0, False
        for name, cell in rec.items():
            if name.startswith(_REASON_PREFIXES):
                bit = _REASON_BITS.get(name.split(".", 1)[1])
                v = _value(cell)
                if bit is None or v is None:
                    continue
                known = True
                if v.lower() == "active":
                    mask |= bit
        if known:
            row["throttle_reasons"] = float(mask)
    return row


# ----------------------------------------------------------------------------------
# nvidia-smi dmon
# ----------------------------------------------------------------------------------


def _split(line: str) -> list[str]:
    return [c.strip() for c in line.split(",")] if "," in line else line.split()


def read_dmon(f: IO[str], path: str, interval_s: float | None = None) -> UtilSeries:
    """``nvidia-smi dmon`` output (whitespace-aligned, or ``--format csv``)."""
    interval = interval_s or DMON_DEFAULT_INTERVAL_S
    columns: list[str] | None = None
    rows: dict[int, _Rows] = {}
    notes: list[str] = []
    day_offset = 0.0
    last_clock: float | None = None
    origin: datetime | None = None
    skipped = 0
    timed = False
    for raw in _lines(f):
        if raw.startswith("#"):
            cells = _split(raw[1:])
            if "gpu" in (c.lower() for c in cells):
                columns = [c.lower() for c in cells]
            continue
        if columns is None:
            continue
        cells = _split(raw)
        if len(cells) != len(columns):
            skipped += 1
            continue
        rec = dict(zip(columns, cells, strict=True))
        gpu = rec.get("gpu", "")
        if not (gpu.isascii() and gpu.isdigit() and len(gpu) <= 6):
            skipped += 1
            continue
        idx = int(gpu)
        r = rows.setdefault(idx, _Rows())
        stamp = _dmon_time(rec)
        if isinstance(stamp, datetime):
            timed = True
            origin = origin or stamp
            t = (stamp - origin).total_seconds()
        elif stamp is not None:
            timed = True
            if last_clock is not None and stamp + day_offset < last_clock - 43200:
                day_offset += 86400.0
            t = stamp + day_offset
            last_clock = t
        else:
            t = len(r.t) * interval
        row = {col: _number(rec[name]) for name, col in DMON_COLUMNS.items() if name in rec}
        r.add(t, row)
    if not rows:
        raise NotATrace(f"{path}: no nvidia-smi dmon rows found", "record with: nvidia-smi dmon -o DT > dmon.log")
    if not timed:
        notes.append(f"no Date/Time columns: rows are spaced {interval:g} s apart (pass --interval if dmon ran "
                     f"with another -d)")
    if skipped:
        notes.append(f"{skipped} malformed row(s) ignored")
    return _series(rows, FORMAT_DMON, path, origin.timestamp() if origin else None, None if timed else interval,
                   notes)


def _lines(f: IO[str]) -> Iterator[str]:
    for line in f:
        s = line.strip()
        if s:
            yield s


def _dmon_time(rec: dict[str, str]) -> datetime | float | None:
    """A datetime with ``-o DT``; seconds of the day with ``-o T`` alone; None without time columns."""
    date, clock = rec.get("date"), rec.get("time")
    if clock is None:
        return None
    try:
        if date is not None:
            return datetime.strptime(f"{date} {clock}", "%Y%m%d %H:%M:%S")
        h, m, s = (int(x) for x in clock.split(":"))
    except ValueError:
        return None
    return float(h * 3600 + m * 60 + s)

