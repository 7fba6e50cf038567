"""Hand-built Kineto traces with exactly known numbers. Times are in µs, as Kineto writes them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

PID = 100
MAIN = 1
BWD = 2


class Trace:
    """Collects events; each launch gets a fresh correlation id linking host call and kernel."""

    def __init__(self, rank: int | None = 0, world: int | None = None,
                 groups: list[dict[str, Any]] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.rank, self.world, self.groups = rank, world, groups
        self._corr = 1000

    def x(self, cat: str, name: str, ts: float, dur: float, pid: Any = PID, tid: Any = MAIN, **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})

    def step(self, n: int, ts: float, dur: float) -> None:
        self.x("user_annotation", f"ProfilerStep#{n}", ts, dur)

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN, **args: Any) -> None:
        self.x("cpu_op", name, ts, dur, tid=tid, **args)

    def annotation(self, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.x("user_annotation", name, ts, dur, tid=tid)

    def runtime(self, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.x("cuda_runtime", name, ts, dur, tid=tid)

    def launch(self, at: float, call_dur: float, start: float, dur: float, name: str = "volta_sgemm_128x64_nn",
               kind: str = "kernel", call: str = "cudaLaunchKernel", tid: int = MAIN, stream: int = 7,
               device: int = 0, **dev_args: Any) -> int:
        """A runtime call at ``at`` launching device work that runs ``[start, start + dur)``."""
        self._corr += 1
        c = self._corr
        self.x("cuda_runtime", call, at, call_dur, tid=tid, correlation=c)
        self.x(kind, name, start, dur, pid=device, tid=stream, device=device, stream=stream, correlation=c,
               **dev_args)
        return c

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Test GPU"}]}
        if self.rank is not None:
            info: dict[str, Any] = {"backend": "nccl", "rank": self.rank}
            if self.world is not None:
                info["world_size"] = self.world
            if self.groups is not None:
                info["pg_config"] = self.groups
            doc["distributedInfo"] = info
        doc["traceEvents"] = self.events
        return doc

    def write(self, path: Path, gz: bool = True) -> Path:
        data = json.dumps(self.to_dict()).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path
