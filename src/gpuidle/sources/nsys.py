"""Read Nsight Systems SQLite exports (``nsys export --type sqlite``) into :class:`~gpuidle.model.Timeline`\\ s.

Device work comes from ``CUPTI_ACTIVITY_KIND_KERNEL``, ``_MEMCPY`` and ``_MEMSET``; host
work from ``CUPTI_ACTIVITY_KIND_RUNTIME`` (runtime and driver calls, linked to the work
they launched by ``correlationId``), ``NVTX_EVENTS`` ranges (PyTorch's ``emit_nvtx``
operators, ``record_function`` ranges such as ``ProfilerStep#N`` and DataLoader
``__next__``, the user's own ranges) and, where traced, file reads from ``OSRT_API`` on
threads that drive the GPU. ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` says which runtime
calls blocked the host on the device. ``TARGET_INFO_GPU`` names the devices and their
compute capability.

An export whose kernel launches are there with their correlation ids and whose device tables are not (the
records lost: a full buffer, a dropped activity kind) is read for its host side, each launch a record lost.

Processes (``globalPid``) with GPU work are ranks when NVTX or the environment says so
(an NVTX range naming ``rank N``; each process running NCCL kernels on its own devices;
``RANK``/``SLURM_PROCID``/... for a one-process report); otherwise all of them are one
rank, and a note says so. Names are normalised as the analyses expect: runtime calls
lose their ABI suffix (``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``), ``emit_nvtx``
operators their ``, seq = N`` tail, and copies are named as Kineto names them
(``Memcpy HtoD (Pageable -> Device)``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuidle.errors import CorruptInput, NoGpuActivity, NotATrace
from gpuidle.model import (
    FILE_READ_CALLS,
    I64,
    LAUNCH_CALL,
    CollectiveCalls,
    CopyKind,
    DeviceOpKind,
    DeviceOps,
    HostEvents,
    HostKind,
    Steps,
    Timeline,
    TraceMeta,
)
from gpuidle.model.arrays import distinct
from gpuidle.model.comm_kernels import COLLECTIVE_KERNEL
from gpuidle.model.name_search import found_any, found_in
from gpuidle.sources import nsys_db, nsys_ranks, step_markers
from gpuidle.sources.job_facts import check_job_facts
from gpuidle.sources.kineto_columns import check_span
from gpuidle.sources.kineto_events import I32_MAX
from gpuidle.sources.nsys_db import Tables

FORMAT = "nsys"
PYTORCH = "pytorch"
CUDA = "cuda"

_ABI_SUFFIX = re.compile(r"(_ptsz|_ptds)?(_v\d+)?$")
_NVTX_OP = re.compile(r"^[A-Za-z_]\w*::")
_NVTX_TAIL = re.compile(r", (seq|op_id|sizes|input_op_ids|stashed seq) = .*$")
"""``emit_nvtx`` appends ``, seq = N, op_id = M, sizes = [...]`` to operator and ``record_function`` names."""
_PYTORCH_NVTX = re.compile(r"^(aten|c10d|autograd)::|^ProfilerStep#|DataLoader|^Optimizer\.step#")
_PYTORCH_KERNEL = re.compile(r"at::native::|at_cuda_detail")

# CUPTI enums (stable across CUDA versions): CUpti_ActivityMemcpyKind, CUpti_ActivityMemoryKind,
# CUpti_ActivitySynchronizationType.
_COPY_DIRECTION = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                   9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
_MEMORY_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device", 6: "Managed"}
_SYNC_CALL = {1: "cudaEventSynchronize", 3: "cudaStreamSynchronize", 4: "cudaDeviceSynchronize"}
"""Blocking synchronization types (CUPTI's ids; the export's ``ENUM_CUPTI_SYNC_TYPE`` wins) -> the call they
stand for. Type 2, stream-wait-event, blocks no host."""
_SYNC_ENUM = {"EVENT_SYNCHRONIZE": "cudaEventSynchronize", "STREAM_SYNCHRONIZE": "cudaStreamSynchronize",
              "CONTEXT_SYNCHRONIZE": "cudaDeviceSynchronize"}
_SYNC_NAME = re.compile(r"^(cuda|cu)(Stream|Device|Event|Ctx)Synchronize$")

_DEVICE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
"""The device activity tables, whose columns also tell an export's schema."""
_DEVICE_COLS: dict[str, tuple[str, ...]] = {
    "start": ("start",), "end": ("end",), "device": ("deviceId",), "stream": ("streamId",),
    "corr": ("correlationId",), "gpid": ("globalPid",),
}
_DEVICE_KEYS = (*_DEVICE_COLS, "name", "kind", "copy", "bytes", "proc")
"""The columns of the device rows, all of them present in an export that lost its device records (empty)."""


def copy_kind(direction: int, src: int, dst: int) -> CopyKind:
    d = _COPY_DIRECTION.get(direction, "")
    if d == "HtoD":
        return {0: CopyKind.HTOD_PAGEABLE, 1: CopyKind.HTOD_PINNED}.get(src, CopyKind.HTOD)
    if d == "DtoH":
        return {0: CopyKind.DTOH_PAGEABLE, 1: CopyKind.DTOH_PINNED}.get(dst, CopyKind.OTHER)
    return CopyKind.DTOD if d in ("DtoD", "PtoP") else CopyKind.OTHER


def copy_name(direction: int, src: int, dst: int) -> str:
    """Kineto's name for a copy, e.g. ``Memcpy HtoD (Pageable -> Device)``."""
    d = _COPY_DIRECTION.get(direction, "Unknown")
    if src in _MEMORY_KIND and dst in _MEMORY_KIND:
        return f"Memcpy {d} ({_MEMORY_KIND[src]} -> {_MEMORY_KIND[dst]})"
    return f"Memcpy {d}"


def runtime_name(name: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``: the analyses match API names exactly."""
    return _ABI_SUFFIX.sub("", name) or name


class _Names:
    """The timeline's string table, built as names are met."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def of(self, values: list[str]) -> I64:
        ids = self.ids
        return np.array([ids.setdefault(v, len(ids)) for v in values], dtype=np.int64)

    def mapped(self, raw: I64, text: dict[int, str], normalise: Callable[[str], str] = str) -> I64:
        """``StringIds`` ids -> our ids, normalising each distinct string once."""
        uniq, inverse = np.unique(raw, return_inverse=True)
        ours = self.of([normalise(text.get(int(u), f"<string {int(u)}>")) for u in uniq.tolist()])
        return ours[inverse.reshape(-1)] if raw.size else np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class _Rows:
    """Columns of one kind of event for the whole file, before the split into ranks."""

    cols: dict[str, I64]

    def __len__(self) -> int:
        return int(self.cols["start"].shape[0])

    def take(self, mask: np.ndarray) -> dict[str, I64]:
        return {k: v[mask] for k, v in self.cols.items()}


def _cat(parts: list[dict[str, I64]]) -> dict[str, I64]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def read(path: str) -> list[Timeline]:
    """Read one export (or ``.nsys-rep``, through ``nsys``): one Timeline per rank, ranks ascending.

    :raises CorruptInput: a truncated or unreadable SQLite file, or a failed ``nsys export``.
    :raises NotATrace: an SQLite file that is not an Nsight Systems export.
    :raises NoGpuActivity: an export with no CUDA kernels, copies or sets, and no kernel launch either.
    :raises MissingTool: a ``.nsys-rep`` without ``nsys`` on PATH.
    """
    import sqlite3

    with nsys_db.exported(path) as db_path:
        conn = nsys_db.connect(db_path)
        try:
            return _read(path, Tables(conn, path))
        except (sqlite3.DatabaseError, UnicodeDecodeError) as err:  # a damaged page met while reading
            raise CorruptInput(f"{path}: the export cannot be read ({err})", nsys_db.REEXPORT) from None
        finally:
            conn.close()


def _read(path: str, t: Tables) -> list[Timeline]:
    if not t.has("StringIds") or not any(t.has(n) for n in (*_DEVICE_TABLES, "CUPTI_ACTIVITY_KIND_RUNTIME",
                                                                 "TARGET_INFO_GPU", "NVTX_EVENTS")):
        raise NotATrace(f"{path}: an SQLite file, but not an Nsight Systems export (no StringIds, no CUPTI tables)",
                        "export the report with: nsys export --type sqlite REPORT.nsys-rep")
    notes = _version_notes(t)
    names = _Names()
    _refuse_unreadable(path, t)
    dev = _device_rows(t, names, notes)
    host = _host_rows(t, names)
    lost = None
    if dev is None:
        lost = _launches(host, names)
        if not lost.any():
            what = "no CUDA trace in this report" if not any(t.has(n) for n in _DEVICE_TABLES) else "0 kernels"
            raise NoGpuActivity(f"{path}: no GPU activity in this Nsight Systems export ({what})",
                                "profile with CUDA tracing on: nsys profile --trace=cuda,nvtx,osrt ...")
        dev = _Rows(dict.fromkeys(_DEVICE_KEYS, np.zeros(0, dtype=np.int64)))  # the records lost: the host side
    spans = [c for c in (dev.cols, host.cols) if c["start"].size]
    t0 = int(min(c["start"].min() for c in spans))
    check_span(path, t0, max(int(np.maximum(c["start"], c["end"]).max()) for c in spans))  # a row may end first
    framework = _framework(names, t)
    env = nsys_ranks.environment(t)
    strings = list(names.ids)
    working = distinct(dev.cols["proc"] if lost is None else host.cols["proc"][lost])
    ranks = nsys_ranks.ranks([int(p) for p in working], dev.cols, host.cols, strings, env)
    devices, capability = _devices(t)
    out = []
    for rank, procs, rank_notes in ranks:
        d = dev.take(np.isin(dev.cols["proc"], procs))
        # device work without globalPid (older exports) is one process: every host row is its own
        mine = np.isin(host.cols["proc"], procs) | (-1 in procs)
        h = host.take(mine)
        used = set(d["device"].tolist())
        world = len(ranks) if len(ranks) > 1 else nsys_ranks.env_int(env, nsys_ranks.WORLD_ENV)
        meta = TraceMeta(path=path, format=FORMAT, t0_ns=t0, rank=rank, world_size=world,
                         device_names={k: v for k, v in devices.items() if k in used},
                         device_capability={k: v for k, v in capability.items() if k in used},
                         notes=notes + rank_notes, framework=framework,
                         device_records_lost=0 if lost is None else int(lost[mine].sum()))
        check_job_facts(meta)
        out.append(_timeline(strings, d, h, t0, meta))
    return out


def _version_notes(t: Tables) -> list[str]:
    """A note only where the export's tables are not the ones this reader knows: a device activity table with its
    start, end, device, stream and correlation columns, and the string table. The version string decides nothing
    (real exports omit it, or carry a major this reader predates, with the same tables)."""
    device = [table for table in _DEVICE_TABLES if t.has(table)]  # none: no device activity, said where it shows
    if t.has("StringIds") and all(t.pick(table, *cols) for table in device
                                              for key, cols in _DEVICE_COLS.items() if key != "gpid"):
        return []
    export = t.meta("META_DATA_EXPORT")
    version = export.get("EXPORT_SCHEMA_VERSION") or "not stated"
    return [f"Nsight Systems export whose tables are not the ones this reader knows (schema {version}): read as far "
            "as its columns go"]


def _device_rows(t: Tables, names: _Names, notes: list[str]) -> _Rows | None:
    parts: list[dict[str, I64]] = []
    kern = t.ints("CUPTI_ACTIVITY_KIND_KERNEL",
                  {**_DEVICE_COLS, "name": ("demangledName", "shortName", "mangledName"),
                   "short": ("shortName", "demangledName")})
    if kern is not None and kern["start"].size:
        text = t.strings(np.concatenate([kern["name"], kern["short"]]))
        short_ids, short_of = np.unique(kern["short"], return_inverse=True)
        nccl = np.array([text.get(int(s), "").lower().startswith("nccl") for s in short_ids.tolist()], dtype=bool)
        kern["name"] = names.mapped(kern["name"], text)
        by_name = found_any(list(names.ids), COLLECTIVE_KERNEL)
        is_coll = nccl[short_of.reshape(-1)] | by_name[kern["name"]]
        kern["kind"] = np.where(is_coll, DeviceOpKind.COLLECTIVE, DeviceOpKind.KERNEL).astype(np.int64)
        kern["copy"] = np.full(kern["start"].size, CopyKind.NONE, dtype=np.int64)
        kern["bytes"] = np.full(kern["start"].size, -1, dtype=np.int64)
        del kern["short"]
        parts.append(kern)
    copy = t.ints("CUPTI_ACTIVITY_KIND_MEMCPY", {**_DEVICE_COLS, "bytes": ("bytes",), "dir": ("copyKind",),
                                                  "src": ("srcKind",), "dst": ("dstKind",)})
    if copy is not None and copy["start"].size:
        if t.pick("CUPTI_ACTIVITY_KIND_MEMCPY", "srcKind") is None:
            notes.append("copies carry no memory kind (srcKind/dstKind): pageable and pinned copies not told apart")
        triple = np.stack([copy["dir"], copy["src"], copy["dst"]], axis=1)
        uniq, inverse = np.unique(triple, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        copy["name"] = names.of([copy_name(*map(int, u)) for u in uniq])[inverse]
        copy["copy"] = np.array([copy_kind(*map(int, u)) for u in uniq], dtype=np.int64)[inverse]
        copy["kind"] = np.full(copy["start"].size, DeviceOpKind.MEMCPY, dtype=np.int64)
        for k in ("dir", "src", "dst"):
            del copy[k]
        parts.append(copy)
    mset = t.ints("CUPTI_ACTIVITY_KIND_MEMSET", {**_DEVICE_COLS, "bytes": ("bytes",)})
    if mset is not None and mset["start"].size:
        mset["name"] = names.of(["Memset (Device)"])[np.zeros(mset["start"].size, dtype=np.int64)]
        mset["copy"] = np.full(mset["start"].size, CopyKind.NONE, dtype=np.int64)
        mset["kind"] = np.full(mset["start"].size, DeviceOpKind.MEMSET, dtype=np.int64)
        parts.append(mset)
    if not parts:
        return None
    rows = _cat(parts)
    _check_ids(t.path, rows)
    if t.pick("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid") is None and kern is not None:
        notes.append("device activity carries no globalPid (older Nsight): all processes read as one")
    rows["proc"] = np.where(rows["gpid"] >= 0, rows["gpid"] >> 24, -1)
    return _Rows(rows)


def _check_ids(path: str, rows: dict[str, I64]) -> None:
    """Raise where a device or stream id of the device activity is negative or past int32 (the model's width)."""
    for key, column in (("device", "deviceId"), ("stream", "streamId")):
        bad = np.flatnonzero((rows[key] < 0) | (rows[key] > I32_MAX))
        if bad.size:
            raise CorruptInput(f"{path}: device activity with {column} {int(rows[key][bad[0]])} ({bad.size} row(s)): "
                               "not an id", nsys_db.REEXPORT)


def _refuse_unreadable(path: str, t: Tables) -> None:
    """Raise where a device table has rows but no start or end column: its records are there, unreadable (not
    lost, and not to be left out of figures that would then be wrong)."""
    for table in _DEVICE_TABLES:
        if t.has(table) and not (t.pick(table, "start") and t.pick(table, "end")) and \
                t.conn.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")').fetchone()[0]:
            raise CorruptInput(f"{path}: {table} holds device activity without a start or end column",
                               nsys_db.REEXPORT)


def _launches(host: _Rows, names: _Names) -> npt.NDArray[np.bool_]:
    """Which host rows are kernel launches that carry a correlation id: in an export without device records,
    each stands for a record lost."""
    launch = found_in(list(names.ids), LAUNCH_CALL)
    c = host.cols
    found: npt.NDArray[np.bool_] = (c["kind"] == HostKind.RUNTIME) & (c["corr"] >= 0) & launch[c["name"]]
    return found


def _host_rows(t: Tables, names: _Names) -> _Rows:
    """Runtime calls, NVTX ranges and file reads, each with its process and thread."""
    parts: list[dict[str, I64]] = []
    rt = t.ints("CUPTI_ACTIVITY_KIND_RUNTIME", {"start": ("start",), "end": ("end",), "gtid": ("globalTid",),
                                                "corr": ("correlationId",), "raw": ("nameId",)})
    if rt is not None and rt["start"].size:
        rt["name"] = names.mapped(rt["raw"], t.strings(rt["raw"]), runtime_name)
        _blocking_syncs(t, names, rt)
        rt["kind"] = np.full(rt["start"].size, HostKind.RUNTIME, dtype=np.int64)
        del rt["raw"]
        parts.append(rt)
    nvtx = _nvtx_rows(t, names)
    if nvtx is not None:
        parts.append(nvtx)
    feeding = distinct(rt["gtid"]) if rt is not None else np.zeros(0, dtype=np.int64)
    read_ids = t.string_ids(FILE_READ_CALLS) if t.pick("OSRT_API", "nameId") else []
    osrt = t.ints("OSRT_API", {"start": ("start",), "end": ("end",), "gtid": ("globalTid",), "raw": ("nameId",)},
                  where=f"nameId IN ({','.join(map(str, read_ids))})") if read_ids and feeding.size else None
    if osrt is not None and osrt["start"].size:
        osrt = {k: v[np.isin(osrt["gtid"], feeding)] for k, v in osrt.items()}
        osrt["name"] = names.mapped(osrt["raw"], t.strings(distinct(osrt["raw"])))
        osrt["corr"] = np.full(osrt["start"].size, -1, dtype=np.int64)
        osrt["kind"] = np.full(osrt["start"].size, HostKind.ANNOTATION, dtype=np.int64)
        del osrt["raw"]
        parts.append(osrt)
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return _Rows(dict.fromkeys(("start", "end", "gtid", "corr", "name", "kind", "proc"), empty))
    rows = _cat(parts)
    rows["proc"] = np.where(rows["gtid"] >= 0, rows["gtid"] >> 24, -1)
    return _Rows(rows)


def _blocking_syncs(t: Tables, names: _Names, rt: dict[str, I64]) -> None:
    """A runtime call that CUPTI recorded blocking the host on the device, and that is not named as a sync
    already, is named for the sync it did (``cudaThreadSynchronize`` -> ``cudaDeviceSynchronize``)."""
    sync = t.ints("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", {"start": ("start",), "end": ("end",),
                                                          "corr": ("correlationId",), "type": ("syncType",),
                                                          "gpid": ("globalPid",)})
    if sync is None or sync["start"].size == 0:
        return
    calls = dict(_SYNC_CALL)
    if t.pick("ENUM_CUPTI_SYNC_TYPE", "id") and t.pick("ENUM_CUPTI_SYNC_TYPE", "name"):
        enum = t.conn.execute("SELECT id, name FROM ENUM_CUPTI_SYNC_TYPE").fetchall()
        calls = {int(i): c for i, n in enum for key, c in _SYNC_ENUM.items() if str(n).endswith(key)}
    blocking = np.isin(sync["type"], list(calls)) & (sync["corr"] >= 0)
    # correlation ids are per process: match (process, id)
    _, index = np.unique(np.concatenate([sync["gpid"][blocking] >> 24, rt["gtid"] >> 24]), return_inverse=True)
    index = index.reshape(-1)
    n_sync = int(blocking.sum())
    sync_key = (index[:n_sync] << 40) | sync["corr"][blocking]
    rt_key = np.where(rt["corr"] >= 0, (index[n_sync:] << 40) | rt["corr"], -1)
    if sync["gpid"][blocking].size and (sync["gpid"][blocking] < 0).all():  # no globalPid: ids alone
        sync_key, rt_key = sync["corr"][blocking], rt["corr"]
    order = np.argsort(sync_key, kind="stable")
    corr, kind = sync_key[order], sync["type"][blocking][order]
    if corr.size == 0:
        return
    pos = np.minimum(np.searchsorted(corr, rt_key), corr.size - 1)
    named_sync = np.array([_SYNC_NAME.match(n) is not None for n in names.ids], dtype=bool)
    hit = np.flatnonzero((rt_key >= 0) & (corr[pos] == rt_key) & ~named_sync[rt["name"]])
    if hit.size:
        sync_ids = {k: int(names.of([v])[0]) for k, v in calls.items()}
        rt["name"][hit] = [sync_ids[int(k)] for k in kind[pos[hit]]]


def _nvtx_rows(t: Tables, names: _Names) -> dict[str, I64] | None:
    """NVTX ranges (marks have no end): ``emit_nvtx`` operators as operators, the rest as annotations."""
    table = "NVTX_EVENTS"
    if not t.has(table) or t.pick(table, "start") is None or t.pick(table, "end") is None:
        return None
    text_col = t.pick(table, "text")
    id_col = t.pick(table, "textId")
    tid_col = t.pick(table, "globalTid")
    text = f'COALESCE(n."{text_col}", s.value)' if text_col and id_col else \
        (f'n."{text_col}"' if text_col else "s.value")
    join = f'LEFT JOIN StringIds s ON s.id = n."{id_col}"' if id_col else ""
    sql = (f'SELECT n.start, n."end", {f"COALESCE(n.{tid_col}, -1)" if tid_col else "-1"}, {text} '
           f"FROM {table} n {join} WHERE n.\"end\" IS NOT NULL AND n.\"end\" >= n.start")
    rows = t.conn.execute(sql).fetchall()
    if not rows:
        return None
    labels = [str(r[3]) if r[3] is not None else "" for r in rows]
    uniq = sorted(set(labels))
    plain = {u: _NVTX_TAIL.sub("", u) for u in uniq}
    ops = {u for u in uniq if _NVTX_OP.match(u)}
    out = {
        "start": np.array([r[0] for r in rows], dtype=np.int64),
        "end": np.array([r[1] for r in rows], dtype=np.int64),
        "gtid": np.array([r[2] for r in rows], dtype=np.int64),
    }
    out["corr"] = np.full(len(rows), -1, dtype=np.int64)
    out["name"] = names.of([plain[lab] for lab in labels])
    out["kind"] = np.array([HostKind.OP if lab in ops else HostKind.ANNOTATION for lab in labels], dtype=np.int64)
    return out


def _framework(names: _Names, t: Tables) -> str:
    """PyTorch when its NVTX ranges (``emit_nvtx``, ``record_function``) or ATen kernels are there."""
    if any(_PYTORCH_NVTX.search(n) or _PYTORCH_KERNEL.search(n) for n in names.ids):
        return PYTORCH
    if t.has("ThreadNames"):
        threads = t.ints("ThreadNames", {"raw": ("nameId",)})
        if threads is not None and any(v == "pt_main_thread" for v in t.strings(threads["raw"]).values()):
            return PYTORCH
    return CUDA


def _devices(t: Tables) -> tuple[dict[int, str], dict[int, str]]:
    table = "TARGET_INFO_GPU"
    names: dict[int, str] = {}
    capability: dict[int, str] = {}
    id_col, name_col = t.pick(table, "id", "deviceId"), t.pick(table, "name")
    if id_col is None:
        return names, capability
    major, minor = t.pick(table, "computeMajor", "smMajor"), t.pick(table, "computeMinor", "smMinor")
    cols = [f'"{id_col}"', f'"{name_col}"' if name_col else "NULL",
            f'"{major}"' if major else "NULL", f'"{minor}"' if minor else "NULL"]
    for dev_id, name, hi, lo in t.conn.execute(f"SELECT {', '.join(cols)} FROM {table}"):
        if not isinstance(dev_id, int) or dev_id in names:
            continue
        if isinstance(name, str):
            names[dev_id] = name
        if isinstance(hi, int) and isinstance(lo, int):
            capability[dev_id] = f"{hi}.{lo}"
    return names, capability


def _timeline(strings: list[str], d: dict[str, I64], h: dict[str, I64], t0: int, meta: TraceMeta) -> Timeline:
    # correlation ids are per process: made unique across the processes of a merged rank
    procs, d_proc = np.unique(np.concatenate([d["proc"], h["proc"]]), return_inverse=True)
    d_idx, h_idx = d_proc[:d["proc"].size], d_proc[d["proc"].size:]
    d_corr = np.where(d["corr"] >= 0, (d_idx << 40) | d["corr"], -1) if procs.size > 1 else d["corr"]
    h_corr = np.where(h["corr"] >= 0, (h_idx << 40) | h["corr"], -1) if procs.size > 1 else h["corr"]
    order = np.lexsort((h["start"], h["gtid"]))
    h = {k: v[order] for k, v in h.items()}
    h_corr = h_corr[order]
    tids, thread = np.unique(h["gtid"], return_inverse=True)
    threads = [(str((int(g) >> 24) & 0xFFFFFF), str(int(g) & 0xFFFFFF)) for g in tids.tolist()]
    device_ops = DeviceOps(
        start=d["start"] - t0, end=np.maximum(d["end"], d["start"]) - t0,
        device=d["device"].astype(np.int32), stream=d["stream"].astype(np.int32),
        kind=d["kind"].astype(np.int8), name=d["name"].astype(np.int32), correlation=d_corr,
        copy_kind=d["copy"].astype(np.int8), nbytes=d["bytes"],
    )
    host = HostEvents(
        start=h["start"] - t0, end=np.maximum(h["end"], h["start"]) - t0, thread=thread.reshape(-1).astype(np.int32),
        kind=h["kind"].astype(np.int8), name=h["name"].astype(np.int32),
        correlation=np.where(h["kind"] == HostKind.RUNTIME, h_corr, -1),
    )
    empty = np.zeros(0, dtype=np.int64)
    collectives = CollectiveCalls(empty, [], [], empty, empty, np.zeros(0, dtype=np.int32))
    return Timeline(strings=strings, threads=threads, device_ops=device_ops, host=host,
                    collectives=collectives, steps=_steps(strings, host, meta.notes), meta=meta)


def _steps(strings: list[str], host: HostEvents, notes: list[str]) -> Steps:
    """``ProfilerStep#N`` ranges, else NVTX ranges named like steps (``step 12``, ``train_step#3``), else an
    engine's iteration ranges: the first sound set (:mod:`.step_markers`)."""
    return step_markers.first_sound((
        step_markers.numbered_ranges(strings, host, step_markers.PROFILER_STEP_NAME, step_markers.PROFILER_STEP,
                                     annotations_only=True),
        step_markers.numbered_ranges(strings, host, step_markers.STEP_NAME, step_markers.NAMED_RANGES,
                                     annotations_only=True),
        step_markers.engine_iterations(strings, host),
    ), notes)
