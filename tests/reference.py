"""Independent reference computations for tests: stdlib json, exact decimals, plain loops.

Nothing here imports gpuidle. It re-derives, the simple way, the numbers gpuidle reports:
window, busy and idle time per device, and the idle cause at any instant.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
HOST_CATS = {"cpu_op", "Operator", "cuda_runtime", "Runtime", "cuda_driver", "user_annotation"}
RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}
OP_CATS = {"cpu_op", "Operator"}
COLLECTIVE = re.compile(r"^(nccl|rccl)\w*kernel|^ncclDevKernel|^ncclKernel", re.I)
SYNC = re.compile(
    r"^(cuda|hip)(Stream|Device|Event|Ctx)Synchronize$|^cu(Stream|Ctx|Event)Synchronize$|^(cuda|hip)Free$"
    r"|BlockHostUntilReady|block_until_ready|^TFE_TensorHandleResolve$|ToLiteral"
)
SYNC_COPY = re.compile(r"^(cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|hipMemcpy|hipMemcpyWithStream|cuMemcpy\w*?)(_v2)?$")
DATA = re.compile(r"DataLoader|data[_ ]?load|load[_ ]?batch|get[_ ]?batch"
                  r"|IteratorGetNext|Iterator::GetNext|device_put|DevicePut|\bgrain\b", re.I)
COLL_HOST = re.compile(r"^(c10d::|nccl:|gloo:|record_param_comms$|ProcessGroup)")


def ns(us: Any) -> int:
    return int((Decimal(us) * 1000).to_integral_value(ROUND_HALF_EVEN))


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw, parse_float=Decimal)


@dataclass
class Ev:
    start: int
    end: int
    name: str
    cat: str
    thread: tuple[Any, Any]
    device: int = -1
    corr: int = -1
    htod: bool = False
    copy_name: str = ""
    index: int = 0


@dataclass
class RefTrace:
    device_ops: list[Ev] = field(default_factory=list)
    host: list[Ev] = field(default_factory=list)
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    handoffs: set[tuple[Any, Any]] = field(default_factory=set)
    """(thread, thread): the first hands work to the second (XSpace flows)."""


def parse(path: Path) -> RefTrace:
    doc = load(path)
    t = RefTrace()
    seen_steps: set[int] = set()
    for i, e in enumerate(doc["traceEvents"]):
        if e.get("ph") != "X":
            continue
        cat, name, args = e.get("cat", ""), e.get("name", ""), e.get("args") or {}
        start = ns(e["ts"])
        end = start + max(ns(e.get("dur", 0)), 0)
        if cat in DEVICE_CATS:
            dev = args.get("device", e["pid"] if isinstance(e["pid"], int) else 0)
            t.device_ops.append(Ev(start, end, name, cat, ("dev", dev), int(dev), int(args.get("correlation", -1)),
                                   htod="HtoD" in name, index=i))
        elif cat in HOST_CATS:
            corr = int(args.get("correlation", -1)) if cat in RUNTIME_CATS else -1
            t.host.append(Ev(start, end, name, cat, (e["pid"], e["tid"]), corr=corr, index=i))
            m = re.match(r"^ProfilerStep#(\d+)$", name)
            if m and int(m.group(1)) not in seen_steps:
                seen_steps.add(int(m.group(1)))
                t.steps.append((int(m.group(1)), start, end))
    t.steps.sort(key=lambda s: s[1])
    return t


def window(t: RefTrace) -> tuple[int, int]:
    if not t.steps:
        return min(o.start for o in t.device_ops), max(o.end for o in t.device_ops)
    lo, host_end = t.steps[0][1], t.steps[-1][2]
    launch = {h.corr: h.start for h in t.host if h.cat in RUNTIME_CATS and h.corr >= 0}
    end = host_end
    for o in t.device_ops:
        when = launch.get(o.corr, o.start) if o.corr >= 0 else o.start
        if lo <= when < host_end:
            end = max(end, o.end)
    return lo, end


def union_length(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Plain sorted-interval union, clipped to [lo, hi)."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def busy(t: RefTrace, device: int) -> int:
    lo, hi = window(t)
    return union_length([(o.start, o.end) for o in t.device_ops
                         if o.device == device and not COLLECTIVE.search(o.name)], lo, hi)


class Cover:
    """'Is instant t inside any of these (possibly overlapping) intervals?' by bisect + prefix max."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        spans = sorted(spans)
        self.starts = [s for s, _ in spans]
        self.reach: list[int] = []
        best = -1
        for _, e in spans:
            best = max(best, e)
            self.reach.append(best)

    def __contains__(self, t: int) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and self.reach[i] > t


def cause_at(t: RefTrace, device: int) -> Any:
    """A function ``instant -> cause`` for idle instants of ``device``, by the documented priority."""
    dev = [o for o in t.device_ops if o.device == device]
    compute = sorted((o for o in dev if not COLLECTIVE.search(o.name)), key=lambda o: (o.start, o.index))
    comm = Cover([(o.start, o.end) for o in dev if COLLECTIVE.search(o.name)])
    by_corr = {h.corr: h for h in t.host if h.cat in RUNTIME_CATS and h.corr >= 0}
    launched = {by_corr[o.corr].index: o for o in t.device_ops if o.corr in by_corr}
    feeding = {by_corr[o.corr].thread for o in dev if o.corr in by_corr} or {h.thread for h in t.host}
    feeding |= {a for a, b in t.handoffs if b in feeding}
    fh = [h for h in t.host if h.thread in feeding]

    def is_htod_call(h: Ev) -> bool:
        return h.cat in RUNTIME_CATS and re.match(r"^(cuda|hip|cu)Memcpy", h.name) is not None \
            and h.index in launched and launched[h.index].htod

    def is_blocking_copy(h: Ev) -> bool:
        if h.cat not in RUNTIME_CATS or not re.match(r"^(cuda|hip|cu)Memcpy", h.name) or is_htod_call(h):
            return False
        target = launched.get(h.index)
        return bool(SYNC_COPY.search(h.name)) or (target is not None and "DtoH" in target.name
                                                  and "Pageable" in target.name)

    launch_starts: dict[Any, list[int]] = {}
    for h in t.host:
        if h.index in launched:
            launch_starts.setdefault(h.thread, []).append(h.start)
    for v in launch_starts.values():
        v.sort()

    def launches_inside(h: Ev) -> bool:
        xs = launch_starts.get(h.thread, [])
        i = bisect.bisect_left(xs, h.start)
        return i < len(xs) and xs[i] < h.end

    loading = Cover([(h.start, h.end) for h in t.host if DATA.search(h.name) and h.cat not in RUNTIME_CATS])
    sync = Cover([(h.start, h.end) for h in fh if (h.cat in RUNTIME_CATS and SYNC.search(h.name))
                  or (h.cat in OP_CATS and h.name in ("aten::item", "aten::_local_scalar_dense"))
                  or is_blocking_copy(h)])
    copies = Cover([(h.start, h.end) for h in fh if is_htod_call(h)])
    coll_host = Cover([(h.start, h.end) for h in fh if h.cat not in RUNTIME_CATS and COLL_HOST.search(h.name)])
    plain, launching = [], []
    for h in fh:
        if h.cat in OP_CATS:
            if launches_inside(h):
                launching.append((h.start, h.end))
            elif h.name not in ("aten::item", "aten::_local_scalar_dense") and not COLL_HOST.search(h.name):
                plain.append((h.start, h.end))
        elif h.cat in RUNTIME_CATS and not (SYNC.search(h.name) or is_blocking_copy(h) or is_htod_call(h)):
            launching.append((h.start, h.end))
    plain_c, launching_c = Cover(plain), Cover(launching)
    starts = [o.start for o in compute]
    launch_of = {o.index: by_corr[o.corr] for o in compute if o.corr in by_corr}

    lo, hi = window(t)
    ends = sorted(o.end for o in compute)

    def at(instant: int) -> str:
        if instant in comm:
            return "communication"
        i = bisect.bisect_right(starts, instant)
        if i < len(compute) and compute[i].start < hi:
            g1 = compute[i].start
            first = compute[bisect.bisect_left(starts, g1)]
            call = launch_of.get(first.index)
            j = bisect.bisect_right(ends, instant)
            g0 = max(lo, ends[j - 1]) if j else lo
            if call is not None and call.start <= instant < g1 and (call.start >= g0 or g1 - call.start <= 50_000):
                return "memcpy" if first.htod else "launch_overhead"
        for cover, cause in ((loading, "data_loading"), (sync, "host_sync"), (copies, "memcpy"),
                             (coll_host, "communication"), (plain_c, "cpu_compute"),
                             (launching_c, "launch_overhead")):
            if instant in cover:
                return cause
        return "unattributed"

    return at
