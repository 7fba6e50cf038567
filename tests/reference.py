"""Independent reference computations for tests: stdlib json, exact decimals, plain loops.

Nothing here imports gpuidle. It re-derives, the simple way, the numbers gpuidle reports:
window, busy and idle time per device, and the idle cause at any instant.
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
HOST_CATS = {"cpu_op", "Operator", "cuda_runtime", "Runtime", "cuda_driver", "user_annotation", "python_function"}
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
LAUNCH = re.compile(r"Launch|^(cuda|hip)Memset|^cuMemset|^PjitFunction\(|ExecuteReplicated|LoadedExecutable::Execute$"
                    r"|^PJRT_LoadedExecutable_Execute$|^EagerExecute$|^EagerLocalExecute: "
                    r"|^TFE_Py_(Fast[A-Za-z]*)?Execute")
COPY_CALL = re.compile(r"^(cuda|hip|cu)Memcpy")
REGION = re.compile(r"^ProfilerStep#|^Optimizer\.\w+#|^Torch-Compiled Region|^TorchDynamo|^## .* ##$|^CompiledFxGraph"
                    r"|^DistributedDataParallel\.forward$|^FullyShardedDataParallel\.|^enumerate\(DataLoader\)")
QUEUE_NS = 50_000
DISPATCH_NS = 100_000
ONCE_NS = 1_000_000
CONTEXT = re.compile(r"^(cuda|hip)Free$|^cuInit$|^cuCtx(Create|SetCurrent)|^cuDevicePrimaryCtx|^hipInit$"
                     r"|^(cuda|hip)SetDevice$|^(cuda|hip)GetDevice|^(cuda|hip)DeviceGet|^(cuda|hip)RuntimeGetVersion$"
                     r"|^(cuda|hip)DriverGetVersion$")
MODULE_OR_STREAM = re.compile(r"^cuModuleLoad|^cuLibraryLoad|^hipModuleLoad|^cudaFuncGetAttributes$"
                              r"|^(cuda|hip)StreamCreate|^cuStreamCreate|^(cuda|hip)EventCreate")
ALLOC = re.compile(r"^(cuda|hip)Malloc|^cuMemAlloc|^cuMemCreate|^(cuda|hip)HostAlloc$|^hipHostMalloc$|^hipExtMalloc"
                   r"|^(cuda|hip)Free(Host)?$|^cuMemFree|^cuMemRelease")
COMPILING = re.compile(r"compile_inner|compile_fx|call_user_compiler|inductor_compile|create_aot_dispatcher_function"
                       r"|async_compile|^nvrtcCompileProgram$|^cuLink(Complete|Create)|^(hip|cu)rtcCompileProgram"
                       r"|XlaCompile|BackendCompile|^PjRtCompile|jit_compile", re.I)
COMPILING_RANGE = re.compile(r"nvrtc|(?<![a-z])(re)?compil(e(?!d)|ing|ation)", re.I)


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


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def step_starts(t: RefTrace) -> list[int]:
    """Where each step starts: its host marker, or, where the first work a step launches waits in the median step
    a tenth of a step or more, and 1 ms or more, before it runs (the host runs ahead), the start of that first work
    (a step that launched nothing: its marker moved by the median of the others' moves), never before the step
    before it."""
    host = [s for _, s, _ in t.steps]
    if len(t.steps) < 2:
        return host
    launch = {h.corr: h.start for h in t.host if h.cat in RUNTIME_CATS and h.corr >= 0}
    first: dict[int, tuple[int, int]] = {}  # step -> (launched, op start) of the op launched first in it
    for o in t.device_ops:
        when = launch.get(o.corr, o.start) if o.corr >= 0 else o.start
        for i, (_, s, e) in enumerate(t.steps):
            if s <= when < e and (i not in first or when < first[i][0]):
                first[i] = (when, o.start)
    if len(first) < 2:
        return host
    gaps = [host[i + 1] - host[i] for i in range(len(host) - 1)]
    if _median([o - w for w, o in first.values()]) < max(1_000_000, 0.1 * _median(gaps)):
        return host
    shift = int(_median([first[i][1] - host[i] for i in first]))
    out: list[int] = []
    for i, h in enumerate(host):
        out.append(max(first[i][1] if i in first else h + shift, out[-1] if out else -(1 << 62)))
    return out


def window(t: RefTrace) -> tuple[int, int]:
    if not t.steps:
        return min(o.start for o in t.device_ops), max(o.end for o in t.device_ops)
    lo, host_end = t.steps[0][1], t.steps[-1][2]
    launch = {h.corr: h.start for h in t.host if h.cat in RUNTIME_CATS and h.corr >= 0}
    end = host_end
    gpu_end = lo
    for o in t.device_ops:
        when = launch.get(o.corr, o.start) if o.corr >= 0 else o.start
        if lo <= when < host_end:
            end = max(end, o.end)
            gpu_end = max(gpu_end, o.end)
    starts = step_starts(t)
    # a last step outlasting the others by a tenth of a step or more, all of it past everything recorded in the
    # step, is the profile stopping: the window ends at the last recorded activity (a lone step: past half of it)
    last_start = starts[-1]
    recorded = [min(h.end, host_end) for h in t.host if t.steps[-1][1] < h.start < host_end] + [gpu_end]
    last = max(recorded)
    tail = end - last
    if last > last_start and tail > 0:
        if len(starts) > 1:
            typical = _median([b - a for a, b in itertools.pairwise(starts)])
            if tail >= 0.1 * typical and end - last_start >= 1.1 * typical:
                end = last
        elif tail > 0.5 * (end - last_start):
            end = last
    return starts[0], end


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


def startup_spans(t: RefTrace) -> list[tuple[int, int]]:
    """One-time calls, by the rules in the docs, with plain loops: long first context calls, module loads and
    stream creation, compilation, allocations when none comes in the last step, slow first launches."""
    lo, hi = window(t)
    out: list[tuple[int, int]] = []
    seen: set[tuple[Any, str]] = set()
    allocs = []
    for h in sorted(t.host, key=lambda h: (h.start, h.index)):
        long = h.end - h.start >= ONCE_NS
        if h.cat in RUNTIME_CATS:
            first = (h.thread, h.name) not in seen
            seen.add((h.thread, h.name))
            if long and ((CONTEXT.search(h.name) and first) or MODULE_OR_STREAM.search(h.name)):
                out.append((h.start, h.end))
            elif long and ALLOC.search(h.name):
                allocs.append(h)
        if long and (COMPILING.search(h.name) or (h.cat != "python_function" and COMPILING_RANGE.search(h.name))):
            out.append((h.start, h.end))
    starts = [*step_starts(t), hi] if t.steps else [lo, hi]
    if len(starts) <= 2 or not any(starts[-2] <= h.start < starts[-1] for h in allocs):
        out += [(h.start, h.end) for h in allocs]
    by_corr = {h.corr: h for h in t.host if h.cat in RUNTIME_CATS and h.corr >= 0}
    linked = [(by_corr[o.corr], o) for o in t.device_ops if o.corr in by_corr and LAUNCH.search(by_corr[o.corr].name)]
    if linked:
        durs = sorted(h.end - h.start for h, _ in linked)
        mid = len(durs) // 2
        median = durs[mid] if len(durs) % 2 else (durs[mid - 1] + durs[mid]) / 2
        first_of: dict[str, Ev] = {}
        for h, o in sorted(linked, key=lambda ho: ho[0].start):
            first_of.setdefault(o.name, h)
        out += [(h.start, h.end) for h in first_of.values() if h.end - h.start >= max(ONCE_NS, 20 * median)]
    return out


def startup_idle(t: RefTrace, device: int) -> int:
    """Window time under start-up calls with neither compute nor a collective on the device."""
    lo, hi = window(t)
    device_work = [(o.start, o.end) for o in t.device_ops if o.device == device]
    return union_length(startup_spans(t) + device_work, lo, hi) - union_length(device_work, lo, hi)


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
        return bool(SYNC_COPY.search(h.name)) or h.end - h.start > QUEUE_NS or (
            target is not None and "DtoH" in target.name and "Pageable" in target.name)

    launch_starts: dict[Any, list[int]] = {}
    for h in t.host:
        if h.index in launched:
            launch_starts.setdefault(h.thread, []).append(h.start)
    for v in launch_starts.values():
        v.sort()

    def launches_inside(h: Ev) -> int:
        xs = launch_starts.get(h.thread, [])
        return bisect.bisect_left(xs, h.end) - bisect.bisect_left(xs, h.start)

    calls_by_thread: dict[Any, list[Ev]] = {}
    for h in t.host:
        if h.cat in RUNTIME_CATS:
            calls_by_thread.setdefault(h.thread, []).append(h)

    def own_work(h: Ev) -> int:
        inside = [c.end - c.start for c in calls_by_thread.get(h.thread, []) if h.start <= c.start < h.end]
        return h.end - h.start - sum(inside)

    nested_by_thread: dict[Any, list[Ev]] = {}
    for h in fh:
        if h.cat in RUNTIME_CATS or (h.cat in OP_CATS and not REGION.search(h.name)):
            nested_by_thread.setdefault(h.thread, []).append(h)

    def self_spans(h: Ev) -> list[tuple[int, int]]:
        """The parts of ``h`` outside every range nested in it on its thread."""
        inner = sorted((c.start, c.end) for c in nested_by_thread.get(h.thread, [])
                       if c.index != h.index and h.start <= c.start and c.end <= h.end)
        out, at = [], h.start
        for s0, e0 in inner:
            if s0 > at:
                out.append((at, s0))
            at = max(at, e0)
        if at < h.end:
            out.append((at, h.end))
        return out

    loading = Cover([(h.start, h.end) for h in t.host if DATA.search(h.name) and h.cat not in RUNTIME_CATS])
    sync = Cover([(h.start, h.end) for h in fh if (h.cat in RUNTIME_CATS and SYNC.search(h.name))
                  or (h.cat in OP_CATS and h.name in ("aten::item", "aten::_local_scalar_dense"))
                  or is_blocking_copy(h)])
    copies = Cover([(h.start, h.end) for h in fh if is_htod_call(h)])
    coll_host = Cover([(h.start, h.end) for h in fh if h.cat not in RUNTIME_CATS and COLL_HOST.search(h.name)])
    plain, launching, python = [], [], []
    for h in fh:
        if h.cat in OP_CATS and not REGION.search(h.name):
            n = launches_inside(h)
            if n and own_work(h) <= n * DISPATCH_NS:
                launching.append((h.start, h.end))
            elif n:
                plain += self_spans(h)
            elif h.name not in ("aten::item", "aten::_local_scalar_dense") and not COLL_HOST.search(h.name):
                plain.append((h.start, h.end))
        elif h.cat in RUNTIME_CATS and not (SYNC.search(h.name) or is_blocking_copy(h) or is_htod_call(h)):
            (launching if LAUNCH.search(h.name) or COPY_CALL.search(h.name) else plain).append((h.start, h.end))
        elif h.cat == "python_function":
            python.append((h.start, h.end))
    plain_c, launching_c, python_c = Cover(plain), Cover(launching), Cover(python)
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
            if call is not None and call.start <= instant < g1 and (call.start >= g0 or g1 - call.start <= QUEUE_NS):
                returned = call.start if call.thread in feeding and (SYNC.search(call.name) or is_blocking_copy(call)) \
                    else call.end
                if instant < returned + QUEUE_NS:
                    return "memcpy" if first.htod else "launch_overhead"
        for cover, cause in ((loading, "data_loading"), (sync, "host_sync"), (copies, "memcpy"),
                             (coll_host, "communication"), (plain_c, "cpu_compute"),
                             (launching_c, "launch_overhead"), (python_c, "cpu_compute")):
            if instant in cover:
                return cause
        return "unattributed"

    return at
