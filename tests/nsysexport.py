"""Hand-built Nsight Systems SQLite exports with exactly known numbers. Times are given in µs.

The tables are created with Nsight's own schemas, in two column sets: ``new`` as Nsight
Systems 2024.5 writes them (``greenContextId``, ``mangledName``, NVTX text in ``textId``),
``old`` as 2021-era exports do (fewer columns, another order, NVTX text inline), so a
reader that reads columns by position, or needs a newer column, fails here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

PID = 100
MAIN = 1
OTHER = 2

NEW: dict[str, str] = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "META_DATA_EXPORT": "name TEXT NOT NULL, value TEXT",
    "TARGET_INFO_SYSTEM_ENV": "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, "
                              "nameEnum INTEGER NOT NULL, value TEXT NOT NULL",
    "TARGET_INFO_GPU": "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, "
                       "totalMemory INTEGER, smCount INTEGER, uuid TEXT, chipName TEXT, cuDevice INTEGER, "
                       "computeMajor INTEGER, computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
                                  "shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, "
                                  "registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, "
                                  "blockX INTEGER NOT NULL, gridId INTEGER NOT NULL, graphNodeId INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, "
                                  "copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, "
                                  "dstKind INTEGER, srcDeviceId INTEGER, dstDeviceId INTEGER, graphNodeId INTEGER, "
                                  "virtualAddress INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, "
                                  "bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
                                   "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
                                   "returnValue INTEGER NOT NULL, callchainId INTEGER",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
                                           "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
                                           "greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                           "correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL, "
                                           "eventId INTEGER NOT NULL",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
                   "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
                   "textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, "
                   "doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, "
                   "jsonTextId INTEGER, jsonText TEXT",
    "OSRT_API": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, "
                "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, nestingLevel INTEGER, "
                "callchainId INTEGER NOT NULL",
}
OLD: dict[str, str] = {
    **NEW,
    "TARGET_INFO_GPU": "id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, "
                       "totalMemory INTEGER, computeMajor INTEGER, computeMinor INTEGER, vmId INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, "
                                  "registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, "
                                  "blockX INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, "
                                  "srcKind INTEGER, dstKind INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "eventClass INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL, "
                                   "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
                                   "returnValue INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
                                           "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
                                           "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
                                           "syncType INTEGER NOT NULL, eventId INTEGER NOT NULL",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
                   "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
                   "domainId INTEGER",
}
MINIMAL: dict[str, str] = {
    **OLD,
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "streamId INTEGER NOT NULL, shortName INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, "
                                   "nameId INTEGER NOT NULL",
}
"""An export of an unknown Nsight with fewer columns: no correlation ids, no globalPid, no demangled names."""
SCHEMAS = {"new": (NEW, "3.13.2"), "old": (OLD, "2.7.1"), "minimal": (MINIMAL, "1.0")}
EVENT_SYNC, STREAM_WAIT, STREAM_SYNC, CONTEXT_SYNC = 1, 2, 3, 4
HTOD, DTOH = 1, 2
PAGEABLE, PINNED, DEVICE = 0, 1, 2
NVTX_PUSH_POP = 59


def global_tid(pid: int, tid: int) -> int:
    """Nsight's serialized thread id: pid in bits 24..47, tid in the low 24 bits."""
    return (pid << 24) | tid


def ns(us: float) -> int:
    return round(us * 1000)


class Export:
    """Collects rows; each launch gets a fresh correlation id linking runtime call and device work."""

    def __init__(self, schema: str = "new", env: dict[str, str] | None = None, version: str | None = None) -> None:
        self.tables, default_version = SCHEMAS[schema]
        self.version = version or default_version
        self.schema = schema
        self.rows: dict[str, list[dict[str, Any]]] = {name: [] for name in self.tables}
        self.strings: dict[str, int] = {}
        self.env = env or {}
        self._corr = 1000
        self.gpu(0, "NVIDIA A100-SXM4-80GB", 8, 0)

    def string(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings) + 1)

    def gpu(self, device: int, name: str, major: int, minor: int) -> None:
        self.rows["TARGET_INFO_GPU"].append({"vmId": 0, "id": device, "name": name, "computeMajor": major,
                                             "computeMinor": minor})

    def runtime(self, name: str, at: float, dur: float, pid: int = PID, tid: int = MAIN,
                corr: int | None = None) -> int:
        if corr is None:
            self._corr += 1
            corr = self._corr
        self.rows["CUPTI_ACTIVITY_KIND_RUNTIME"].append({
            "start": ns(at), "end": ns(at + dur), "eventClass": 1, "globalTid": global_tid(pid, tid),
            "correlationId": corr, "nameId": self.string(name), "returnValue": 0})
        return corr

    def kernel(self, start: float, dur: float, name: str = "volta_sgemm_128x64_nn", corr: int = -1,
               device: int = 0, stream: int = 7, pid: int = PID) -> None:
        self.rows["CUPTI_ACTIVITY_KIND_KERNEL"].append({
            "start": ns(start), "end": ns(start + dur), "deviceId": device, "contextId": 1, "streamId": stream,
            "correlationId": corr, "globalPid": global_tid(pid, 0), "demangledName": self.string(name),
            "shortName": self.string(name.split("(")[0].split("<")[0].replace("void ", "")),
            "registersPerThread": 32, "gridX": 1, "blockX": 128, "gridId": len(self.rows)})

    def launch(self, at: float, call_dur: float, start: float, dur: float, name: str = "volta_sgemm_128x64_nn",
               pid: int = PID, tid: int = MAIN, device: int = 0, stream: int = 7) -> int:
        """``cudaLaunchKernel`` at ``at`` launching a kernel that runs ``[start, start + dur)``."""
        corr = self.runtime("cudaLaunchKernel_v7000", at, call_dur, pid, tid)
        self.kernel(start, dur, name, corr, device, stream, pid)
        return corr

    def memcpy(self, at: float, call_dur: float, start: float, dur: float, nbytes: int, direction: int = HTOD,
               src: int = PAGEABLE, dst: int = DEVICE, call: str = "cudaMemcpy_v3020", pid: int = PID,
               tid: int = MAIN, device: int = 0, stream: int = 7) -> int:
        corr = self.runtime(call, at, call_dur, pid, tid)
        self.rows["CUPTI_ACTIVITY_KIND_MEMCPY"].append({
            "start": ns(start), "end": ns(start + dur), "deviceId": device, "contextId": 1, "streamId": stream,
            "correlationId": corr, "globalPid": global_tid(pid, 0), "bytes": nbytes, "copyKind": direction,
            "srcKind": src, "dstKind": dst})
        return corr

    def memset(self, at: float, call_dur: float, start: float, dur: float, nbytes: int, pid: int = PID) -> None:
        corr = self.runtime("cudaMemsetAsync_v3020", at, call_dur, pid)
        self.rows["CUPTI_ACTIVITY_KIND_MEMSET"].append({
            "start": ns(start), "end": ns(start + dur), "deviceId": 0, "contextId": 1, "streamId": 7,
            "correlationId": corr, "globalPid": global_tid(pid, 0), "value": 0, "bytes": nbytes})

    def sync(self, name: str, at: float, dur: float, sync_type: int, pid: int = PID, tid: int = MAIN) -> None:
        """A synchronizing runtime call and CUPTI's record of what it waited for."""
        corr = self.runtime(name, at, dur, pid, tid)
        self.rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"].append({
            "start": ns(at), "end": ns(at + dur), "deviceId": 0, "contextId": 1, "streamId": 7,
            "correlationId": corr, "globalPid": global_tid(pid, 0), "syncType": sync_type, "eventId": 0})

    def nvtx(self, text: str, start: float, dur: float | None, pid: int = PID, tid: int = MAIN) -> None:
        """A push/pop range (``dur`` None: a mark). New exports keep the text in StringIds."""
        row: dict[str, Any] = {"start": ns(start), "end": None if dur is None else ns(start + dur),
                               "eventType": NVTX_PUSH_POP if dur is not None else 34,
                               "globalTid": global_tid(pid, tid)}
        if self.schema == "new":
            row["textId"] = self.string(text)
        else:
            row["text"] = text
        self.rows["NVTX_EVENTS"].append(row)

    def osrt(self, name: str, start: float, dur: float, pid: int = PID, tid: int = MAIN) -> None:
        self.rows["OSRT_API"].append({"start": ns(start), "end": ns(start + dur), "eventClass": 27,
                                      "globalTid": global_tid(pid, tid), "nameId": self.string(name),
                                      "returnValue": 0, "callchainId": 0})

    def thread_name(self, name: str, pid: int = PID, tid: int = MAIN) -> None:
        self.rows["ThreadNames"].append({"nameId": self.string(name), "priority": 0,
                                         "globalTid": global_tid(pid, tid)})

    def write(self, path: Path, skip: tuple[str, ...] = ()) -> Path:
        """Write the export; ``skip`` leaves tables out (as an export without that trace does)."""
        if path.exists():
            path.unlink()
        db = sqlite3.connect(path)
        with db:
            for name, cols in self.tables.items():
                if name not in skip:
                    db.execute(f"CREATE TABLE {name} ({cols})")
            db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in self.strings.items()])
            db.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [
                ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_SCHEMA_VERSION", self.version),
                ("EXPORT_SCHEMA_VERSION_MAJOR", self.version.split(".")[0])])
            if self.env:
                env = ";".join(f"{k}={v}" for k, v in self.env.items())
                db.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'Local (CLI)', 'DeviceEnvironment', 610, ?)",
                           (env,))
            for name, rows in self.rows.items():
                if name in skip:
                    continue
                have = {r[1] for r in db.execute(f"PRAGMA table_info({name})")}
                for row in rows:
                    kept = {k: v for k, v in row.items() if k in have}  # a column this version lacks
                    db.execute(f"INSERT INTO {name} ({', '.join(kept)}) VALUES ({', '.join('?' * len(kept))})",
                               list(kept.values()))
        db.close()
        return path
