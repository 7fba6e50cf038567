"""Read PyTorch profiler (Kineto) Chrome traces into a :class:`~gpuidle.model.Timeline`.

Both schemas are read: the old categories (``Kernel``, ``Runtime``, ``Operator``,
``Memcpy``, ``Memset``, GPU ``tid`` like ``"stream 7"``) and the new ones (``kernel``,
``cuda_runtime``, ``cuda_driver``, ``cpu_op``, ``user_annotation``, ``gpu_memcpy``,
``gpu_memset``, and ``gpu_user_annotation``: ranges on a device's own timeline, kept apart from its work).
ROCm traces use the same categories with HIP names. Unknown categories are ignored.

Only the fields used are decoded (typed msgspec structs), chunk by chunk, straight
into numpy columns; no per-event object survives a chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuidle.errors import CorruptInput, NoGpuActivity, NotATrace
from gpuidle.model import (
    I64,
    LAUNCH_CALL,
    CollectiveCalls,
    CopyKind,
    DeviceOpKind,
    DeviceOps,
    DeviceRanges,
    HostEvents,
    Steps,
    Timeline,
    TraceMeta,
)
from gpuidle.model.arrays import distinct
from gpuidle.model.comm_kernels import COLLECTIVE_KERNEL
from gpuidle.model.name_search import found_any, found_in
from gpuidle.sources import step_markers
from gpuidle.sources.job_facts import check_job_facts
from gpuidle.sources.kernel_arch import kernel_arch_by_device
from gpuidle.sources.kineto_columns import DEVICE_RANGE, MAX_SPAN_US, Columns
from gpuidle.sources.kineto_events import I32_MAX
from gpuidle.sources.kineto_read import read_columns

FORMAT = "kineto"

def copy_kind(name: str) -> CopyKind:
    """Classify a copy from its Kineto name, e.g. ``Memcpy HtoD (Pageable -> Device)``."""
    if "HtoD" in name:
        if "Pageable" in name:
            return CopyKind.HTOD_PAGEABLE
        return CopyKind.HTOD_PINNED if "Pinned" in name else CopyKind.HTOD
    if "DtoH" in name:
        if "Pageable" in name:
            return CopyKind.DTOH_PAGEABLE
        return CopyKind.DTOH_PINNED if "Pinned" in name else CopyKind.OTHER
    if "DtoD" in name or "PtoP" in name:
        return CopyKind.DTOD
    return CopyKind.OTHER


def _launches(strings: list[str], host: dict[str, list[np.ndarray]]) -> int:
    """Launch calls that carry a correlation id: each one's device record should be in the trace."""
    if not host["name"]:
        return 0
    names = np.concatenate(host["name"]).astype(np.int64)
    corr = np.concatenate(host["corr"]).astype(np.int64)
    launch = found_in(strings, LAUNCH_CALL)
    return int((launch[names] & (corr >= 0)).sum()) if launch.size else 0


def _to_ns(us: npt.NDArray[np.float64]) -> I64:
    """µs (float, possibly fractional) to int64 ns without losing large integer parts. In place where it can be:
    a big trace's millions of times would otherwise take eight fresh arrays, not four."""
    whole = np.floor(us)
    frac = np.subtract(us, whole)
    frac *= 1000.0
    np.rint(frac, out=frac)
    ns: I64 = whole.astype(np.int64)
    ns *= 1000
    ns += frac.astype(np.int64)
    return ns


def read(path: str, progress: Callable[[int, int], None] | None = None) -> Timeline:
    """Read one Kineto trace file. A trace whose launches carry their correlation ids and whose device records are
    all missing is read for its host side: no device op, and ``meta.device_records_lost`` the launches.

    :raises CorruptInput: truncated gzip, invalid JSON.
    :raises NotATrace: JSON that is not a Chrome trace, or a trace of a non-GPU accelerator.
    :raises NoGpuActivity: a trace with no kernels, copies or sets, and no kernel launch either (CPU-only).
    """
    cols, header = read_columns(path, progress)
    skipped = [f"{n} events skipped: {reason} (first: {first})" for reason, (n, first) in cols.skipped.items()]
    d = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.dev.items()}
    work = d["kind"] != DEVICE_RANGE
    lost = 0 if work.any() else _launches_alone(path, cols, header, skipped)
    h = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.host.items()}
    strings = cols.strings
    t0_us = float(np.floor(min(d["ts"].min() if d["ts"].size else np.inf, h["ts"].min() if h["ts"].size else np.inf)))
    end_us = max(float((d["ts"] + d["dur"]).max()) if d["ts"].size else 0.0,
                 float((h["ts"] + h["dur"]).max()) if h["ts"].size else 0.0)
    if end_us - t0_us > MAX_SPAN_US:
        raise CorruptInput(f"{path}: the events span {(end_us - t0_us) / 86400e6:.0f} days "
                           f"(from ts {t0_us:.0f} to {end_us:.0f} µs)",
                           "timestamps from different clocks, or a damaged file; a profile covers seconds")
    dstart = _to_ns(d["ts"] - t0_us)
    dend = dstart + np.maximum(_to_ns(d["dur"]), 0)
    hstart = _to_ns(h["ts"] - t0_us)
    device_ranges = DeviceRanges.none()
    if not work.all():  # ranges on the devices' timelines: kept apart from the work
        marked = ~work
        device_ranges = DeviceRanges(start=dstart[marked], end=dend[marked],
                                     device=d["device"][marked].astype(np.int32),
                                     stream=d["stream"][marked].astype(np.int32),
                                     name=d["name"][marked].astype(np.int32))
        d = {k: v[work] for k, v in d.items()}
        dstart, dend = dstart[work], dend[work]
    names = d["name"].astype(np.int32)
    # per distinct name of a kernel or a copy, not per event nor per name of the trace: collectives, copy kinds
    kind = d["kind"].astype(np.int8)
    kernel_names = distinct(names[kind == DeviceOpKind.KERNEL])
    collective_name = np.zeros(len(strings), bool)
    collective_name[kernel_names] = found_any([strings[n] for n in kernel_names.tolist()], COLLECTIVE_KERNEL)
    copy_of_name = np.zeros(len(strings), np.int8)
    for n in distinct(names[kind == DeviceOpKind.MEMCPY]).tolist():
        copy_of_name[n] = copy_kind(strings[n])
    kind[(kind == DeviceOpKind.KERNEL) & collective_name[names]] = DeviceOpKind.COLLECTIVE
    device_ops = DeviceOps(
        start=dstart, end=dend,
        device=d["device"].astype(np.int32),
        stream=d["stream"].astype(np.int32),
        kind=kind,
        name=names,
        correlation=d["corr"].astype(np.int64),
        copy_kind=np.where(kind == DeviceOpKind.MEMCPY, copy_of_name[names], CopyKind.NONE).astype(np.int8),
        nbytes=d["bytes"].astype(np.int64),
    )
    host = HostEvents(
        start=hstart, end=hstart + np.maximum(_to_ns(h["dur"]), 0),
        thread=h["thread"].astype(np.int32),
        kind=h["kind"].astype(np.int8),
        name=h["name"].astype(np.int32),
        correlation=h["corr"].astype(np.int64),
    )
    c = cols.coll
    collectives = CollectiveCalls(
        host_index=np.asarray(c["host"], dtype=np.int64),
        collective=c["name"], process_group=c["group"],
        in_bytes=np.asarray(c["inb"], dtype=np.int64),
        out_bytes=np.asarray(c["outb"], dtype=np.int64),
        group_size=np.asarray(c["size"], dtype=np.int32), dtype=c["dtype"],
    )
    sizes = collectives.group_size
    meta = _meta(path, header, int(t0_us) * 1000, int(sizes.max()) if sizes.size else None)
    _match_only_device(meta, distinct(device_ops.device))
    meta.kernel_arch = kernel_arch_by_device(strings, device_ops)
    meta.notes.extend(skipped)
    meta.device_records_lost = lost
    return Timeline(
        strings=strings, threads=cols.threads, device_ops=device_ops, host=host,
        collectives=collectives, steps=_steps(strings, host, meta.notes), meta=meta, device_ranges=device_ranges,
    )


def _launches_alone(path: str, cols: Columns, header: dict[str, Any], skipped: list[str]) -> int:
    """The kernel launches of a trace without device work, where it has some (its device records were lost: its
    host side is read); else why it is no trace to analyse.

    :raises NotATrace: a trace of another accelerator, or of no event at all.
    :raises CorruptInput: every device event skipped as unreadable.
    :raises NoGpuActivity: no kernel launch either: a CPU-only trace.
    """
    if cols.foreign:
        raise NotATrace(
            f"{path}: a trace of a non-GPU accelerator ({', '.join(sorted(cols.foreign))} events)",
            "gpuidle analyses CUDA and ROCm GPU traces",
        )
    if skipped:
        raise CorruptInput(f"{path}: no usable GPU events; {'; '.join(skipped)}",
                           "the file is damaged or was not written by the profiler")
    if cols.events == 0 and not header:
        raise NotATrace(f"{path}: the trace holds no events", "was the profiler started?")
    launches = _launches(cols.strings, cols.host)
    if launches:
        return launches
    raise NoGpuActivity(
        f"{path}: no GPU activity in this trace (CPU-only: {cols.hosts} host events, 0 kernels)",
        "profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] on a GPU run",
    )


def _steps(strings: list[str], host: HostEvents, notes: list[str]) -> Steps:
    """``ProfilerStep#N`` ranges on the host (GPU-side copies of them are not host events), else an engine's
    iteration ranges, else annotations named like steps: the first sound set (:mod:`.step_markers`)."""
    return step_markers.first_sound((
        step_markers.numbered_ranges(strings, host, step_markers.PROFILER_STEP_NAME, step_markers.PROFILER_STEP),
        step_markers.engine_iterations(strings, host),
        step_markers.numbered_ranges(strings, host, step_markers.STEP_NAME, step_markers.NAMED_RANGES,
                                     annotations_only=True),
    ), notes)


def _match_only_device(meta: TraceMeta, devices: npt.NDArray[np.int32]) -> None:
    """A trace of one device whose index is not among the ``deviceProperties`` ids (a process that sees one
    GPU, numbered by the host): the properties of the only device listed, or of the only name listed, are its."""
    if devices.size != 1 or int(devices[0]) in meta.device_names or not meta.device_names:
        return
    names = set(meta.device_names.values())
    caps = set(meta.device_capability.values())
    if len(names) != 1:
        return
    d, listed = int(devices[0]), len(meta.device_names)
    meta.device_names[d] = names.pop()
    if len(caps) == 1:
        meta.device_capability[d] = caps.pop()
    meta.notes.append(f"device {d} is not among the deviceProperties ids: its properties are those of the "
                      f"{'only device' if listed == 1 else f'{listed} identical devices'} listed")


def _is_int(value: Any, least: int) -> bool:
    """A rank, world size or device id: an int (not a bool) from ``least`` up to int32."""
    return type(value) is int and least <= value <= I32_MAX


def _meta(path: str, header: dict[str, Any], t0_ns: int, largest_group: int | None = None) -> TraceMeta:
    meta = TraceMeta(path=path, format=FORMAT, t0_ns=t0_ns)
    info = header.get("distributedInfo")
    if isinstance(info, dict):
        rank, world = info.get("rank"), info.get("world_size")
        meta.rank = rank if _is_int(rank, 0) else None
        meta.world_size = world if _is_int(world, 1) else None
        for key, value, kept in (("rank", rank, meta.rank), ("world_size", world, meta.world_size)):
            if value is not None and kept is None:
                meta.notes.append(f"distributedInfo.{key} {str(value)[:40]!r} is not a count: ignored")
        backend = info.get("backend")
        meta.backend = backend if isinstance(backend, str) else None
        groups = info.get("pg_config")
        if isinstance(groups, list):
            meta.process_groups = [g for g in groups if isinstance(g, dict)]
    if meta.rank is None:
        meta.notes.append("the trace records no rank (distributedInfo.rank): taken as rank 0")
    check_job_facts(meta, largest_group)
    meta.header_flags = {k: header[k] for k in ("with_stack", "record_shapes", "profile_memory", "with_flops")
                         if isinstance(header.get(k), int | bool | str)}
    props = header.get("deviceProperties")
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and _is_int(p.get("id"), 0) and isinstance(p.get("name"), str):
                meta.device_names[p["id"]] = p["name"]
                if _is_int(p.get("computeMajor"), 0) and _is_int(p.get("computeMinor"), 0):
                    meta.device_capability[p["id"]] = f"{p['computeMajor']}.{p['computeMinor']}"
    return meta
