"""Hand-built XSpace profiles with steps: a GPU plane of one kernel per step, the host's ``step_num`` markers, and
the ``Steps`` line the profiler derives on the GPU plane. Times in µs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STEP_US = 1_000
KERNEL_US = 600


def add_stat(plane: Any, event: Any, name: str, **value: object) -> None:
    """Add stat ``name`` to ``event``, registering its metadata in ``plane``."""
    ids = {m.name: i for i, m in plane.stat_metadata.items()}
    sid = ids.get(name, len(ids) + 1)
    plane.stat_metadata[sid].id = sid
    plane.stat_metadata[sid].name = name
    event.stats.add(metadata_id=sid, **value)


def profile(path: Path, steps: int = 6, step_num: dict[str, Any] | None = None, steps_line: bool = False,
            late_ps: int = 0, apart_ps: int = 0, gpu_id: int = 0, stream_id: int = 5) -> Path:
    """``steps`` steps of :data:`STEP_US`, each one kernel of :data:`KERNEL_US` launched at its start.
    ``step_num``: the stat value of the first marker (``{"double_value": inf}``); ``steps_line``: write the GPU
    plane's ``Steps`` line; ``late_ps``: move the last step (its marker, or its ``Steps`` event) that much later;
    ``apart_ps``: move the kernels and their launches that much later than every step; ``gpu_id``, ``stream_id``:
    the numbers in the GPU plane's and the stream line's names."""
    from gpuidle.sources.xplane import xplane_pb2

    space = xplane_pb2.XSpace(hostnames=["node-a"])
    gpu = space.planes.add(id=1, name=f"/device:GPU:{gpu_id}")
    gpu.event_metadata[1].id, gpu.event_metadata[1].name = 1, "fusion_kernel"
    stream = gpu.lines.add(id=5, name=f"Stream #{stream_id}(Kernel)", timestamp_ns=1_000)
    host = space.planes.add(id=2, name="/host:CPU")
    host.event_metadata[1].id, host.event_metadata[1].name = 1, "cuLaunchKernel"
    host.event_metadata[2].id, host.event_metadata[2].name = 2, "train"
    api = host.lines.add(id=77, name="python", timestamp_ns=1_000)
    marks = host.lines.add(id=78, name="steps", timestamp_ns=1_000)
    line = gpu.lines.add(id=9, name="Steps", timestamp_ns=1_000) if steps_line else None
    for n in range(steps):
        at = n * STEP_US * 1_000_000
        late = late_ps if n == steps - 1 else 0
        k = stream.events.add(metadata_id=1, offset_ps=apart_ps + at + 20_000_000, duration_ps=KERNEL_US * 1_000_000)
        add_stat(gpu, k, "correlation_id", uint64_value=100 + n)
        launch = api.events.add(metadata_id=1, offset_ps=apart_ps + at + 5_000_000, duration_ps=3_000_000)
        add_stat(host, launch, "correlation_id", uint64_value=100 + n)
        mark = marks.events.add(metadata_id=2, offset_ps=at + (0 if line else late), duration_ps=STEP_US * 1_000_000)
        add_stat(host, mark, "step_num", **(step_num if step_num and n == 0 else {"int64_value": n}))
        if line is not None:
            gpu.event_metadata[10 + n].id, gpu.event_metadata[10 + n].name = 10 + n, str(n)
            line.events.add(metadata_id=10 + n, offset_ps=at + late, duration_ps=STEP_US * 1_000_000)
    path.write_bytes(space.SerializeToString())
    return path


def xprof_json(path: Path, first_ts_us: float = 0.0) -> Path:
    """The Chrome-trace JSON xprof writes from an XSpace: five 1 ms ``train`` markers over 600 µs kernels; the
    first marker at ``first_ts_us``."""
    import gzip
    import json

    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 5, "args": {"name": "Stream #5(Kernel)"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 7, "args": {"name": "python"}}]
    for n in range(5):
        events.append({"ph": "X", "name": "fusion_kernel", "pid": 1, "tid": 5, "ts": STEP_US * n + 20.0,
                       "dur": float(KERNEL_US)})
        events.append({"ph": "X", "name": "train", "pid": 2, "tid": 7, "ts": first_ts_us if n == 0 else STEP_US * n,
                       "dur": float(STEP_US), "args": {"step_num": n}})
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path
