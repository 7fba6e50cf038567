"""Read JAX and TensorFlow profiles (XSpace) into a :class:`~gpuidle.model.Timeline`.

One ``<host>.xplane.pb`` is one rank: its ``/device:GPU:N`` planes are the devices (CUDA
and ROCm alike), its ``/host:CPU`` plane the host threads. A run folder with several hosts'
files is one job, ranks numbered in host-name order. What each part becomes:

- device lines ``Stream #N(Kernel|MemcpyH2D|...)``: kernels, copies (``Memcpy*``, or a
  ``memcpy_details`` stat) and sets; NCCL/RCCL kernels and XLA collectives (``hlo_op``
  ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``, ``collective-permute``,
  their ``-start``/``-done``) are communication. Derived lines (``XLA Ops``) are skipped, except ``Steps``.
- host lines: one thread each. Driver/runtime calls (``cuLaunchKernel``, ``hipMemcpy*``...,
  any event with a ``correlation_id``) are runtime calls linked to their device work; a line
  holding only such calls is the API view of a thread whose TraceMe events lie on another
  line, and is merged into it when that line's events contain its calls. Dispatch of a
  compiled program (``PjitFunction(...)``, ``EagerExecute``...) and waits
  (``BlockHostUntilReady``, ``block_until_ready``) are runtime calls too; Python-tracer frames
  (``$file.py:N fn``) are dropped except those that load data or wait. Flows (``_p``/``_c``
  stats) from one thread to another are the timeline's handoffs; without flows (the trace JSON
  has none), each thread dispatching compiled programs hands work to each launching thread.
- steps: the ``Steps`` line of the device planes, where the profiler wrote one; else ``step_num``
  markers (``jax.profiler.StepTraceAnnotation``, ``tf.profiler.experimental.Trace(..., step_num=N,
  _r=1)``); without either, the repeated calls of the longest-running compiled program, with a note.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpuidle.errors import CorruptInput, NoGpuActivity, NotATrace
from gpuidle.model import (
    HOST_RANK_NOTE,
    I64,
    XLA_DISPATCH,
    XSPACE_FORMAT,
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
from gpuidle.model.name_search import found_any
from gpuidle.sources import step_markers, xplanes
from gpuidle.sources.kineto_columns import check_span
from gpuidle.sources.kineto_events import I32_MAX
from gpuidle.sources.xplanes import Line, Plane, Space
from gpuidle.sources.xspace_files import PB_SUFFIX

FORMAT = XSPACE_FORMAT
JSON_SUFFIX = ".trace.json.gz"

_GPU_PLANE = re.compile(r"^/device:GPU:(\d+)")
_FOREIGN_PLANE = re.compile(r"^/device:(TPU|CUSTOM|XPU|NPU)", re.IGNORECASE)
_STREAM = re.compile(r"^Stream #(\d+)")
STEPS_LINE = "Steps"
"""The device plane's line of steps, derived by the profiler from its step grouping (TensorFlow, JAX)."""
_XLA_COLLECTIVE = re.compile(
    r"^%?(ragged-)?(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast)"
    r"(-start|-done)?([.\d]*)$"
)
API_CALL = re.compile(r"^(cu|cuda|hip|hsa|nccl|rccl)[A-Z]")
SYNC = re.compile(r"BlockHostUntilReady|block_until_ready|^TFE_TensorHandleResolve$|ToLiteral")
"""Waits for device work (the same names ``analysis.names.SYNC_CALLS`` treats as syncs)."""
DATA = re.compile(r"IteratorGetNext|Iterator::GetNext|device_put|DevicePut|\bgrain\b", re.IGNORECASE)
"""Input: tf.data's GetNext, JAX's device_put of a batch, grain (as ``analysis.names.DATA_LOADING``)."""
DISPATCH = re.compile(XLA_DISPATCH)
"""A compiled program (or eager op) handed to the runtime: the framework's launch path."""
_PROGRAM = [re.compile(r"^PjitFunction\((.+)\)$"), re.compile(r"^EagerLocalExecute: __inference_(.+?)_\d+$"),
            re.compile(r"^(.+):XLA GPU module$")]
_INPUT_THREAD = re.compile(r"^tf_data")
_TENSORFLOW = re.compile(r"^EagerExecute$|^TFE_|^ExecutorState::Process$|__inference_|^IteratorGetNextOp")
_JAX = re.compile(r"^PjitFunction\(|^\$.*\bjax\b|^\$api\.py|^jit_|^pmap_")
_DROP, _OP, _RUNTIME, _ANNOTATION = -1, int(HostKind.OP), int(HostKind.RUNTIME), int(HostKind.ANNOTATION)


def read(path: str, progress: Callable[[int, int], None] | None = None) -> Timeline:
    """Read one host's profile: ``*.xplane.pb`` or the ``*.json[.gz]`` trace written from one.

    :raises CorruptInput: a truncated or foreign protobuf.
    :raises NotATrace: no XSpace planes, or a TPU profile.
    :raises NoGpuActivity: no GPU plane with kernels or copies (a CPU-only profile).
    """
    space = xplanes.read_pb(path) if path.endswith(".pb") else xplanes.read_json(path)
    if progress:
        size = Path(path).stat().st_size
        progress(size, size)
    return build(space, path)


def build(space: Space, path: str) -> Timeline:
    gpu = [(int(m.group(1)), p) for p in space.planes if (m := _GPU_PLANE.match(p.name))]
    _check_ids(path, gpu)
    host_planes = [p for p in space.planes if p.name.startswith("/host:") and p.name != "/host:metadata"]
    host_events = sum(ln.start.size for p in host_planes for ln in p.lines)
    if not gpu:
        foreign = sorted({p.name for p in space.planes if _FOREIGN_PLANE.match(p.name)})
        if foreign:
            raise NotATrace(f"{path}: a profile of a non-GPU accelerator ({', '.join(foreign[:3])}): unsupported",
                            "gpuidle's busy/idle model reads GPU streams (CUDA, ROCm)")
        raise NoGpuActivity(
            f"{path}: no GPU activity in this profile (CPU-only: {host_events} host events, no /device:GPU plane)",
            "profile a run that uses the GPU (jax.profiler.trace / tf.profiler.experimental.start)")
    strings = list(space.strings)
    dev = _device_columns(gpu, strings)
    if dev["start"].size == 0:
        raise NoGpuActivity(f"{path}: GPU planes without kernels or copies ({host_events} host events)",
                            "profile steps that run on the GPU")
    threads, host, handoffs = _host_columns(host_planes, space.hostnames or [Path(path).name.split(".")[0]], strings)
    t0 = int(min(dev["start"].min(), host["start"].min() if host["start"].size else dev["start"].min()))
    check_span(path, t0, max(int(dev["end"].max()), int(host["end"].max()) if host["end"].size else t0))
    device_ops = _device_ops(dev, strings, t0)
    host_ev = HostEvents(start=host["start"] - t0, end=host["end"] - t0, thread=host["thread"].astype(np.int32),
                         kind=host["kind"].astype(np.int8), name=host["name"].astype(np.int32),
                         correlation=np.where(host["kind"] == _RUNTIME, host["corr"], -1).astype(np.int64))
    meta = TraceMeta(path=path, format=FORMAT, t0_ns=t0, notes=list(space.notes))
    per_gpu = _device_steps(gpu, strings, t0)
    apart = _apart(per_gpu)
    busiest = _busiest(dev) if apart else -1
    merged = per_gpu[busiest] if apart else _together(per_gpu)
    steps = step_markers.first_sound((merged, _marked_steps(host, t0)), meta.notes)
    device_steps = per_gpu if apart and steps is merged else {}
    if device_steps:
        meta.notes.append(_apart_note(per_gpu, busiest))
    if len(steps) == 0:
        steps, note = _program_steps(host, strings, t0)
        meta.notes.append(note)
    _device_meta(meta, gpu)
    _rank(meta, path)
    meta.framework = detect_framework(strings)
    empty = np.zeros(0, dtype=np.int64)
    collectives = CollectiveCalls(empty, [], [], empty, empty, np.zeros(0, dtype=np.int32))
    return Timeline(strings=strings, threads=threads, device_ops=device_ops, host=host_ev,
                    collectives=collectives, steps=steps, meta=meta, handoffs=handoffs, device_steps=device_steps)


def detect_framework(strings: list[str]) -> str | None:
    """``tensorflow`` or ``jax`` from the names the profile holds; None when it says neither."""
    if any(_TENSORFLOW.search(s) for s in strings):
        return "tensorflow"
    if any(_JAX.search(s) for s in strings):
        return "jax"
    return None


# ----------------------------------------------------------------------------------
# Device planes
# ----------------------------------------------------------------------------------


def _check_ids(path: str, gpu: list[tuple[int, Plane]]) -> None:
    """Raise where a GPU plane's ordinal or a stream line's number is past int32 (the model's width)."""
    for ordinal, plane in gpu:
        streams = [int(m.group(1)) for ln in plane.lines if (m := _STREAM.match(ln.name))]
        if ordinal > I32_MAX or any(n > I32_MAX for n in streams):
            raise CorruptInput(f"{path}: plane '{plane.name[:60]}' numbers a GPU or a stream past 32 bits",
                               "a damaged profile; record it again")


def _device_columns(gpu: list[tuple[int, Plane]], strings: list[str]) -> dict[str, I64]:
    parts: dict[str, list[I64]] = {k: [] for k in ("start", "end", "device", "stream", "name", "corr", "op", "bytes")}
    for ordinal, plane in gpu:
        for ln in plane.lines:
            m = _STREAM.match(ln.name)
            if not m or ln.start.size == 0:
                continue
            n = ln.start.size
            for key, col in (("start", ln.start), ("end", ln.end), ("name", ln.name_id), ("corr", ln.correlation),
                             ("op", ln.hlo_op), ("bytes", ln.nbytes)):
                parts[key].append(col)
            parts["device"].append(np.full(n, ordinal, dtype=np.int64))
            parts["stream"].append(np.full(n, int(m.group(1)), dtype=np.int64))
    return {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in parts.items()}


def copy_kind(name: str) -> CopyKind:
    """XSpace names copies ``MemcpyH2D``, ``MemcpyD2H``, ``MemcpyD2D``, ``MemcpyP2P`` (CUPTI's kinds)."""
    if re.search(r"H2D|HtoD", name):
        return CopyKind.HTOD_PAGEABLE if "ageable" in name else CopyKind.HTOD
    if re.search(r"D2H|DtoH", name):
        return CopyKind.DTOH_PAGEABLE if "ageable" in name else CopyKind.OTHER
    if re.search(r"D2D|DtoD|P2P|PtoP", name):
        return CopyKind.DTOD
    return CopyKind.OTHER


def _device_ops(d: dict[str, I64], strings: list[str], t0: int) -> DeviceOps:
    n = len(strings)
    is_copy = np.fromiter((bool(re.match(r"(?i)memcpy", s)) for s in strings), dtype=bool, count=n)
    is_set = np.fromiter((bool(re.match(r"(?i)memset", s)) for s in strings), dtype=bool, count=n)
    nccl = found_any(strings, COLLECTIVE_KERNEL)
    xla_coll = np.fromiter((bool(_XLA_COLLECTIVE.match(s)) for s in strings), dtype=bool, count=n)
    copies = np.fromiter((copy_kind(s) for s in strings), dtype=np.int8, count=n)
    name, op = d["name"], d["op"]
    kind = np.full(name.size, DeviceOpKind.KERNEL, dtype=np.int8)
    kind[is_set[name]] = DeviceOpKind.MEMSET
    copy_rows = is_copy[name] | ((d["bytes"] >= 0) & ~is_set[name])
    kind[copy_rows] = DeviceOpKind.MEMCPY
    collective = (kind == DeviceOpKind.KERNEL) & (nccl[name] | ((op >= 0) & xla_coll[np.maximum(op, 0)]))
    kind[collective] = DeviceOpKind.COLLECTIVE
    order = np.lexsort((d["start"], d["device"]))
    return DeviceOps(
        start=(d["start"] - t0)[order], end=(np.maximum(d["end"], d["start"]) - t0)[order],
        device=d["device"][order].astype(np.int32), stream=d["stream"][order].astype(np.int32),
        kind=kind[order], name=name[order].astype(np.int32), correlation=d["corr"][order],
        copy_kind=np.where(kind == DeviceOpKind.MEMCPY, copies[name], CopyKind.NONE).astype(np.int8)[order],
        nbytes=d["bytes"][order],
    )


def _device_meta(meta: TraceMeta, gpu: list[tuple[int, Plane]]) -> None:
    for ordinal, plane in gpu:
        st = plane.stats
        vendor = str(st.get("device_vendor") or "")
        model = st.get("device_name") or st.get("device_type_string")
        meta.device_names[ordinal] = str(model) if model else f"{vendor} GPU".strip()
        major, minor = st.get("compute_cap_major"), st.get("compute_cap_minor")
        if isinstance(major, int) and isinstance(minor, int):
            meta.device_capability[ordinal] = f"{major}.{minor}"


def _rank(meta: TraceMeta, path: str) -> None:
    """Hosts are ranks: this file's place among the run's ``*.xplane.pb``, in host-name order."""
    p = Path(path)
    siblings = sorted(f.name for f in p.parent.glob(f"*{PB_SUFFIX}")) if p.name.endswith(PB_SUFFIX) else []
    if p.name in siblings and len(siblings) > 1:
        meta.rank, meta.world_size = siblings.index(p.name), len(siblings)
    else:
        meta.rank, meta.world_size = 0, 1
    meta.notes.append(f"{HOST_RANK_NOTE} {p.name} is rank {meta.rank} of {meta.world_size} host(s) in its folder")


# ----------------------------------------------------------------------------------
# Host plane
# ----------------------------------------------------------------------------------


def _name_kinds(strings: list[str]) -> np.ndarray:
    """Host kind per distinct name (see the module docstring); -1: dropped."""

    def kind(s: str) -> int:
        if API_CALL.match(s):
            return _RUNTIME
        if DATA.search(s):
            return _OP
        if SYNC.search(s) or DISPATCH.search(s):
            return _RUNTIME
        return _DROP if s.startswith("$") else _OP

    return np.fromiter((kind(s) for s in strings), dtype=np.int8, count=len(strings))


def _host_columns(
    planes: list[Plane], hostnames: list[str], strings: list[str],
) -> tuple[list[tuple[str, str]], dict[str, I64], list[tuple[int, int]]]:
    lines = [ln for p in planes for ln in p.lines if ln.start.size]
    host = hostnames[0] if hostnames else "host"
    thread_of = _merge_api_lines(lines, strings)
    names: dict[str, int] = {}
    for i in range(len(lines)):
        names.setdefault(lines[thread_of[i]].name, len(names))
    threads = [(host, n) for n in names]
    kinds = _name_kinds(strings)
    parts: dict[str, list[I64]] = {k: [] for k in ("start", "end", "thread", "kind", "name", "corr", "step",
                                                   "producer", "consumer")}
    for i, ln in enumerate(lines):
        k = kinds[ln.name_id].astype(np.int64)
        k[ln.correlation >= 0] = _RUNTIME
        k[ln.step >= 0] = _ANNOTATION
        t = names[lines[thread_of[i]].name]
        for key, col in (("start", ln.start), ("end", ln.end), ("kind", k), ("name", ln.name_id),
                         ("corr", ln.correlation), ("step", ln.step), ("producer", ln.producer),
                         ("consumer", ln.consumer)):
            parts[key].append(col)
        parts["thread"].append(np.full(ln.start.size, t, dtype=np.int64))
    cols = {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in parts.items()}
    handoffs = _handoffs(cols, threads, strings)
    keep = (cols["kind"] != _DROP) & (cols["end"] > cols["start"])
    cols = {k: v[keep] for k, v in cols.items()}
    order = np.lexsort((-cols["end"], cols["start"]))
    return threads, {k: v[order] for k, v in cols.items()}, handoffs


def _merge_api_lines(lines: list[Line], strings: list[str]) -> list[int]:
    """For each line, the line whose thread it is: a line of runtime calls only (the profiler's API
    view of a thread) maps to the TraceMe line whose events contain most of its calls."""
    api = np.fromiter((bool(API_CALL.match(s)) for s in strings), dtype=bool, count=len(strings))
    is_api = [bool(api[ln.name_id].all()) for ln in lines]
    out = list(range(len(lines)))
    spans = {j: _union(ln.start, ln.end) for j, ln in enumerate(lines) if not is_api[j]}
    for i, ln in enumerate(lines):
        if not is_api[i]:
            continue
        best, hits = i, 0
        for j, (us, ue) in spans.items():
            k = np.searchsorted(us, ln.start, side="right") - 1
            inside = int(((k >= 0) & (ue[np.maximum(k, 0)] >= ln.end)).sum())
            if inside > hits:
                best, hits = j, inside
        if 2 * hits >= ln.start.size:
            out[i] = best
    return out


def _union(start: I64, end: I64) -> tuple[I64, I64]:
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx) if idx.size else e[:0]


def _handoffs(cols: dict[str, I64], threads: list[tuple[str, str]], strings: list[str]) -> list[tuple[int, int]]:
    """(producer thread, consumer thread) of every flow between two threads; input-pipeline threads
    (``tf_data*``) hand batches, not device work, and are left out. A profile without flows (the
    trace JSON drops them) hands work from each thread that dispatches compiled programs to each
    thread that launches device work."""
    prod, cons = cols["producer"] >= 0, cols["consumer"] >= 0
    if prod.any() and cons.any():
        by_flow = dict(zip(cols["producer"][prod].tolist(), cols["thread"][prod].tolist(), strict=True))
        pairs = {(by_flow[f], t) for f, t in zip(cols["consumer"][cons].tolist(), cols["thread"][cons].tolist(),
                                                 strict=True) if f in by_flow}
    else:
        dispatch = np.fromiter((bool(DISPATCH.search(s)) for s in strings), dtype=bool, count=len(strings))
        senders = distinct(cols["thread"][dispatch[cols["name"]]]).tolist()
        launchers = distinct(cols["thread"][cols["corr"] >= 0]).tolist()
        pairs = {(a, b) for a in senders for b in launchers}
    return sorted((a, b) for a, b in pairs if a != b and not _INPUT_THREAD.match(threads[a][1]))


# ----------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------


def _device_steps(gpu: list[tuple[int, Plane]], strings: list[str], t0: int) -> dict[int, Steps]:
    """The ``Steps`` line the profiler derives on each GPU plane (one range per step, named by its number, over the
    device work of that step), per GPU."""
    numbered = np.array([int(s) if s.isdecimal() and len(s) <= 18 else -1 for s in strings], dtype=np.int64)
    out: dict[int, Steps] = {}
    for ordinal, plane in gpu:
        lines = [ln for ln in plane.lines if ln.name == STEPS_LINE and ln.start.size]
        if not lines:
            continue
        number = np.concatenate([numbered[ln.name_id] for ln in lines])
        start = np.concatenate([ln.start for ln in lines])
        end = np.concatenate([ln.end for ln in lines])
        ok = number >= 0
        if ok.any():
            out[ordinal] = step_markers.merged_spans(number[ok], start[ok] - t0, end[ok] - t0,
                                                     step_markers.DEVICE_STEPS)
    return out


def _together(per_gpu: dict[int, Steps]) -> Steps:
    """A step as its ranges on every GPU together, from the first start to the last end."""
    if not per_gpu:
        return step_markers.none()
    parts = list(per_gpu.values())
    return step_markers.merged_spans(np.concatenate([x.number for x in parts]),
                                     np.concatenate([x.start for x in parts]),
                                     np.concatenate([x.end for x in parts]), step_markers.DEVICE_STEPS)


def _apart(per_gpu: dict[int, Steps]) -> bool:
    """Whether the GPUs run their steps apart: a step number whose ranges on two GPUs do not overlap (each GPU's
    burst of one step far from the other's). A step is then each GPU's own, never one window across both."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for steps in per_gpu.values():
        for n, a, b in zip(steps.number.tolist(), steps.start.tolist(), steps.end.tolist(), strict=True):
            spans.setdefault(n, []).append((a, b))
    return any(max(a for a, _ in ranges) >= min(b for _, b in ranges) for ranges in spans.values() if len(ranges) > 1)


def _busiest(dev: dict[str, I64]) -> int:
    """The GPU with the most device time: whose steps are the rank's."""
    ordinals = distinct(dev["device"])
    time = [int((dev["end"] - dev["start"])[dev["device"] == d].sum()) for d in ordinals.tolist()]
    return int(ordinals[int(np.argmax(time))])


def _apart_note(per_gpu: dict[int, Steps], busiest: int) -> str:
    first = {g: (int(s.start[0]), int(s.end[0] - s.start[0])) for g, s in sorted(per_gpu.items())}
    each = "; ".join(f"GPU {g} at {a / 1e6:,.1f} ms for {d / 1e6:,.1f} ms" for g, (a, d) in first.items())
    return (f"the GPUs run their steps apart (first step: {each}): each GPU's figures are over its own steps; the "
            f"rank's steps are GPU {busiest}'s, the busiest")


def _marked_steps(host: dict[str, I64], t0: int) -> Steps:
    """``step_num`` markers: of the marker names, the one with the most steps; one range per step number."""
    rows = np.flatnonzero(host["step"] >= 0)
    if rows.size == 0:
        return step_markers.none()
    names = distinct(host["name"][rows])
    best = max(names, key=lambda n: (distinct(host["step"][rows[host["name"][rows] == n]]).size, -n))
    rows = rows[host["name"][rows] == best]
    rows = rows[np.argsort(host["start"][rows], kind="stable")]
    number = host["step"][rows]
    _, first = np.unique(number, return_index=True)
    rows = rows[np.sort(first)]
    return Steps(host["step"][rows].copy(), host["start"][rows] - t0, host["end"][rows] - t0,
                 step_markers.PROFILER_STEP)


def _program_steps(host: dict[str, I64], strings: list[str], t0: int) -> tuple[Steps, str]:
    """Steps as the calls of the compiled program with the most host time among those called at least twice."""
    empty = np.zeros(0, dtype=np.int64)
    hint = "mark steps with jax.profiler.StepTraceAnnotation('train', step_num=i) or " \
           "tf.profiler.experimental.Trace('train', step_num=i, _r=1)"
    best: tuple[int, str, I64] | None = None
    for pattern in _PROGRAM:
        programs: dict[str, list[int]] = {}
        for i, s in enumerate(strings):
            if m := pattern.match(s):
                programs.setdefault(m.group(1), []).append(i)
        for program, ids in programs.items():
            rows = np.flatnonzero(np.isin(host["name"], ids))
            if rows.size < 2:
                continue
            threads, counts = np.unique(host["thread"][rows], return_counts=True)
            rows = rows[host["thread"][rows] == threads[np.argmax(counts)]]
            rows = _outermost(host, rows)
            total = int((host["end"][rows] - host["start"][rows]).sum())
            if rows.size >= 2 and (best is None or total > best[0]):
                best = (total, program, rows)
        if best is not None:
            break
    if best is None:
        return Steps(empty, empty, empty, "none"), f"no step markers and no repeated compiled program: {hint}"
    _, program, rows = best
    starts = np.sort(host["start"][rows]) - t0
    ends = np.append(starts[1:], int(host["end"][rows].max()) - t0)
    note = f"no step markers: steps inferred from the {rows.size} calls of {program} ({hint})"
    return Steps(np.arange(starts.size, dtype=np.int64), starts, ends, "inferred:xla_program"), note


def _outermost(host: dict[str, I64], rows: I64) -> I64:
    """Rows not inside an earlier one (a call traced twice, nested, counts once)."""
    rows = rows[np.lexsort((-host["end"][rows], host["start"][rows]))]
    reach = np.maximum.accumulate(host["end"][rows])
    top = np.ones(rows.size, dtype=bool)
    top[1:] = host["start"][rows][1:] >= reach[:-1]
    return rows[top]
