"""A timeline as Chrome trace events, for inputs that are not Chrome traces themselves (Nsight exports).

The annotated trace of such an input is this conversion plus the ``gpuidle`` idle track:
kernels, copies and sets on a process per GPU with a track per stream, and host ranges
(runtime calls, NVTX ranges) on their own process and thread, in the trace's own clock.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from gpuidle.model import DeviceOpKind, HostKind, Timeline
from gpuidle.report.annotate import us

CHUNK = 4096
_DEVICE_CAT = {DeviceOpKind.KERNEL: "kernel", DeviceOpKind.MEMCPY: "gpu_memcpy", DeviceOpKind.MEMSET: "gpu_memset",
               DeviceOpKind.COLLECTIVE: "kernel"}
_HOST_CAT = {HostKind.OP: "cpu_op", HostKind.RUNTIME: "cuda_runtime", HostKind.ANNOTATION: "user_annotation",
             HostKind.PYTHON: "python_function"}


def timeline_events(tl: Timeline) -> Iterator[list[msgspec.Raw]]:
    """Every device op and host range of ``tl`` as Chrome ``X`` events, in chunks."""
    enc = msgspec.json.encode
    t0 = tl.meta.t0_ns
    names = [enc(s).decode() for s in tl.strings]
    meta = [enc({"ph": "M", "name": "process_name", "pid": f"GPU {d}", "tid": 0,
                 "args": {"name": f"GPU {d}" + (f" ({tl.meta.device_names[d]})" if d in tl.meta.device_names
                                                 else "")}}) for d in tl.devices]
    yield [msgspec.Raw(m) for m in meta]
    ops = tl.device_ops
    batch: list[msgspec.Raw] = []
    for s, e, dev, stream, kind, name, corr in zip(ops.start.tolist(), ops.end.tolist(), ops.device.tolist(),
                                                   ops.stream.tolist(), ops.kind.tolist(), ops.name.tolist(),
                                                   ops.correlation.tolist(), strict=True):
        batch.append(msgspec.Raw(
            f'{{"ph":"X","cat":"{_DEVICE_CAT[DeviceOpKind(kind)]}","name":{names[name]},"pid":"GPU {dev}",'
            f'"tid":"stream {stream}","ts":{us(t0 + s)},"dur":{us(e - s)},'
            f'"args":{{"device":{dev},"stream":{stream},"correlation":{corr}}}}}'.encode()))
        if len(batch) >= CHUNK:
            yield batch
            batch = []
    host = tl.host
    threads = [(enc(p).decode(), enc(t).decode()) for p, t in tl.threads]
    for s, e, thread, kind, name, corr in zip(host.start.tolist(), host.end.tolist(), host.thread.tolist(),
                                              host.kind.tolist(), host.name.tolist(), host.correlation.tolist(),
                                              strict=True):
        pid, tid = threads[thread]
        batch.append(msgspec.Raw(
            f'{{"ph":"X","cat":"{_HOST_CAT[HostKind(kind)]}","name":{names[name]},"pid":{pid},"tid":{tid},'
            f'"ts":{us(t0 + s)},"dur":{us(e - s)},"args":{{"correlation":{corr}}}}}'.encode()))
        if len(batch) >= CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch
