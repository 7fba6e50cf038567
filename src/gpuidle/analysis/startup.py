"""One-time start-up costs: paid once per process, never again in steady state.

Context creation (the first ``cudaFree``/``cudaSetDevice``/device query that initialises the
driver), module loading (the first launch of a kernel, when its code object is loaded), the
first allocations of the caching allocator, stream creation and compilation (Dynamo/Inductor,
NVRTC, XLA) can take seconds. Charged to a cause they read as per-step fixes ("stop syncing",
"launch-bound, saves 6 s/step"); here they are found, and the idle under them is left out of
every step and every gain, and shown once.

A call is a start-up cost when it lasts at least :data:`STARTUP_MIN_NS` and

- ``context``: it is the first call of its name on its thread, names driver initialisation and device work follows
  it (a ``cudaFree`` after the last device work frees memory at teardown);
- ``module_load``: it is the first launch of its kernel and lasts over :data:`FIRST_LAUNCH_FACTOR`
  times the median launch (or names module loading itself);
- ``allocation``: an allocation or a free (a ``cudaFree`` after the first), no call that long in the last step
  (growth that stopped, not churn);
- ``stream``: it creates a stream or event;
- ``compile``: it is a compilation or autotuning range (Inductor's and XLA's autotuning, cuDNN's algorithm
  search), or a host range that names compiling (an NVTX range around NVRTC or nvFuser's compilation:
  ``compileFusion``, ``nvrtc: compile``; a ``Compiled Region`` runs compiled code and is not one);
- ``graph_capture``: it captures a CUDA/HIP graph, from ``cudaStreamBeginCapture`` to the ``EndCapture``
  that closes it on the same thread (the launches in between are recorded, not run: the device idles), or
  instantiates one (``cudaGraphInstantiate``).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from gpuidle.analysis import intervals as iv
from gpuidle.analysis.names import NameClasses
from gpuidle.analysis.steps import StepWindow
from gpuidle.model import I64, HostEvents, HostKind, Timeline
from gpuidle.model.arrays import distinct, median_of

STARTUP_MIN_NS = 1_000_000
"""Below 1 ms a call is not worth setting apart, whatever it is."""
FIRST_LAUNCH_FACTOR = 20.0
CONTEXT = re.compile(
    r"^(cuda|hip)Free$|^cuInit$|^cuCtx(Create|SetCurrent)|^cuDevicePrimaryCtx|^hipInit$|^(cuda|hip)SetDevice$"
    r"|^(cuda|hip)GetDevice|^(cuda|hip)DeviceGet|^(cuda|hip)RuntimeGetVersion$|^(cuda|hip)DriverGetVersion$"
)
MODULE = re.compile(r"^cuModuleLoad|^cuLibraryLoad|^hipModuleLoad|^cudaFuncGetAttributes$")
ALLOCATION = re.compile(r"^(cuda|hip)Malloc|^cuMemAlloc|^cuMemCreate|^(cuda|hip)HostAlloc$|^hipHostMalloc$"
                        r"|^hipExtMalloc|^(cuda|hip)Free(Host)?$|^cuMemFree|^cuMemRelease")
"""The allocator's growth and its frees (a caching allocator frees its cached blocks when it first runs short, or
when a cold program's first allocations settle): one-time unless as long a call comes in the last step too."""
STREAM = re.compile(r"^(cuda|hip)StreamCreate|^cuStreamCreate|^(cuda|hip)EventCreate")
BEGIN_CAPTURE = re.compile(r"^(cuda|hip)StreamBeginCapture|^cuStreamBeginCapture")
END_CAPTURE = re.compile(r"^(cuda|hip)StreamEndCapture|^cuStreamEndCapture")
INSTANTIATE = re.compile(r"^(cuda|hip)GraphInstantiate|^cuGraphInstantiate")
COMPILE = re.compile(
    r"compile_inner|compile_fx|call_user_compiler|inductor_compile|create_aot_dispatcher_function|async_compile"
    r"|^nvrtcCompileProgram$|^cuLink(Complete|Create)|^(hip|cu)rtcCompileProgram|XlaCompile|BackendCompile"
    r"|^PjRtCompile|jit_compile|autotune|^cudnnFind\w*Algorithm|benchmark_choice",
    re.IGNORECASE,
)
COMPILE_RANGE = re.compile(r"nvrtc|(?<![a-z])(re)?compil(e(?!d)|ing|ation)", re.IGNORECASE)
"""A host range (an annotation, an NVTX range), not a Python frame, that names compiling: ``compileFusion``,
``nvrtc: compile``, ``XLA compilation``. A Python frame's name is its file's path (``vllm/compilation/...``, code
that runs what was compiled)."""


class Startup(msgspec.Struct, frozen=True):
    """Start-up calls: rows in ``tl.host``, their kind, a readable name, and the span each covers (its call's
    range; a graph capture's runs from its ``BeginCapture`` row to the ``EndCapture`` that closes it)."""

    rows: I64
    kind: list[str]
    label: list[str]
    start: I64
    end: I64

    def ranges(self) -> iv.Intervals:
        return iv.union(self.start, self.end)


def find_startup(tl: Timeline, names: NameClasses, window: StepWindow, launchers: I64) -> Startup:
    host, strings = tl.host, tl.strings
    found: dict[int, tuple[str, str]] = {}
    if not strings:
        empty = np.zeros(0, dtype=np.int64)
        return Startup(empty, [], [], empty, empty)
    long = np.flatnonzero(host.end - host.start >= STARTUP_MIN_NS)  # only a long call can be start-up
    name = host.name[long]
    rt = host.kind[long] == HostKind.RUNTIME
    named = distinct(name)  # the others' names go untested
    classes = {}
    for k, p in (("context", CONTEXT), ("module_load", MODULE), ("allocation", ALLOCATION), ("stream", STREAM),
                 ("compile", COMPILE)):
        classes[k] = np.zeros(len(strings), dtype=bool)
        classes[k][named] = names.matching(p, named)
    last_work = int(tl.device_ops.start.max()) if len(tl.device_ops.start) else np.iinfo(np.int64).max
    for i in long[rt & classes["context"][name]]:
        if _first_of_name(host, int(i)) and host.start[i] < last_work:  # with no device work after it: a teardown
            found[int(i)] = ("context", strings[host.name[i]])
    for kind in ("module_load", "stream"):
        for i in long[rt & classes[kind][name]]:
            found[int(i)] = (kind, strings[host.name[i]])
    classes["compile_range"] = np.zeros(len(strings), dtype=bool)
    classes["compile_range"][named] = [COMPILE_RANGE.search(strings[i]) is not None for i in named.tolist()]
    ranged = classes["compile_range"][name] & (host.kind[long] != HostKind.PYTHON)
    for i in long[classes["compile"][name] | ranged]:
        found.setdefault(int(i), ("compile", strings[host.name[i]]))
    _allocations(tl, window, long[rt & classes["allocation"][name]], found)
    _first_launches(tl, names, launchers, found)
    ends = _graph_captures(tl, names, found)
    rows = np.array(sorted(found, key=lambda r: (int(host.start[r]), r)), dtype=np.int64)
    end = np.array([ends.get(int(r), int(host.end[r])) for r in rows], dtype=np.int64)
    return Startup(rows, [found[int(r)][0] for r in rows], [found[int(r)][1] for r in rows],
                   host.start[rows].copy(), end)


def _graph_captures(tl: Timeline, names: NameClasses, found: dict[int, tuple[str, str]]) -> dict[int, int]:
    """Graph captures and instantiations: each ``BeginCapture`` row with the end of the ``EndCapture`` that
    closes it on its thread (the whole capture is one cost, however short each call), and each instantiation of
    at least :data:`STARTUP_MIN_NS`. Returns the capture rows' span ends."""
    host, strings = tl.host, tl.strings
    ids = {kind: np.flatnonzero(names.matching(p))
           for kind, p in (("begin", BEGIN_CAPTURE), ("end", END_CAPTURE), ("instantiate", INSTANTIATE))}
    rt = host.kind == HostKind.RUNTIME
    ends: dict[int, int] = {}
    begins = np.flatnonzero(rt & np.isin(host.name, ids["begin"]))
    closes = np.flatnonzero(rt & np.isin(host.name, ids["end"]))
    for b in begins.tolist():
        mine = closes[(host.thread[closes] == host.thread[b]) & (host.start[closes] >= host.start[b])]
        if mine.size == 0:
            continue
        close = int(mine[np.argmin(host.start[mine])])
        if int(host.end[close]) - int(host.start[b]) >= STARTUP_MIN_NS:
            found[b] = ("graph_capture", f"CUDA graph capture ({strings[host.name[b]]} .. {strings[host.name[close]]})")
            ends[b] = int(host.end[close])
    for i in np.flatnonzero(rt & np.isin(host.name, ids["instantiate"])).tolist():
        if host.end[i] - host.start[i] >= STARTUP_MIN_NS:
            found.setdefault(i, ("graph_capture", strings[host.name[i]]))
    return ends


def _first_of_name(host: HostEvents, i: int) -> bool:
    same = (host.name == host.name[i]) & (host.thread == host.thread[i])
    return bool(host.start[i] <= host.start[same].min())


def _allocations(tl: Timeline, window: StepWindow, rows: I64, found: dict[int, tuple[str, str]]) -> None:
    """Long allocations (``rows``, in the host table's order) are start-up unless one comes in the last step too
    (the allocator churns every step)."""
    if rows.size == 0:
        return
    bounds = window.bounds
    if bounds.size > 2:
        last = (tl.host.start[rows] >= bounds[-2]) & (tl.host.start[rows] < bounds[-1])
        if last.any():
            return
    for i in rows:
        found.setdefault(int(i), ("allocation", tl.strings[tl.host.name[i]]))


def _first_launches(tl: Timeline, names: NameClasses, launchers: I64, found: dict[int, tuple[str, str]]) -> None:
    """The first launch of each kernel, far slower than the median launch: its module was loaded then."""
    host, ops = tl.host, tl.device_ops
    linked = np.flatnonzero(launchers >= 0)
    if linked.size == 0:
        return
    calls = launchers[linked]
    is_launch = names.launch_call[host.name[calls]]
    linked, calls = linked[is_launch], calls[is_launch]
    if calls.size == 0:
        return
    dur = host.end[calls] - host.start[calls]
    limit = max(STARTUP_MIN_NS, FIRST_LAUNCH_FACTOR * float(median_of(dur)))
    order = np.lexsort((host.start[calls], ops.name[linked]))
    first = np.ones(order.size, dtype=bool)
    first[1:] = ops.name[linked][order][1:] != ops.name[linked][order][:-1]
    for j in order[first]:
        if dur[j] >= limit:
            call = int(calls[j])
            kernel = tl.strings[int(ops.name[linked[j]])]
            found.setdefault(call, ("module_load", f"{tl.strings[host.name[call]]} (first launch of {kernel[:80]})"))
