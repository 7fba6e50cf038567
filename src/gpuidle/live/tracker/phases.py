"""A step in progress: its phases, their host time and device markers, its buckets and data.

``with tracker.phase(name):`` costs two host clock reads and, with a device clock, two
markers; nothing is read back until the step is old enough (:class:`PendingStep`). Below the
trackers: a :class:`Phase` sees its tracker as a :class:`PhaseTarget`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .clock import DeviceClock, Marker

DEFAULT_PHASES = ("h2d", "forward", "backward", "optimizer")
COMPUTE_PHASES = ("forward", "backward", "optimizer")
COPY_PHASE = "h2d"


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first array (tuples, lists and dicts searched).

    An array is anything with a ``shape`` (torch, numpy, JAX, TensorFlow).
    """
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else 1
        except (TypeError, ValueError):  # a dimension or rank unknown (a symbolic TensorFlow shape)
            return 0
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_size(item)
        if n:
            return n
    return 0


@dataclass(slots=True)
class OpenStep:
    """The step in progress: host time per phase, device markers, buckets, data."""

    host: dict[str, int] = field(default_factory=dict)
    marks: list[tuple[str, Marker, Marker]] = field(default_factory=list)
    comm: list[list[Any]] = field(default_factory=list)
    """``[ready marker, done marker or None, bytes]`` per bucket; the hook's callback fills in done."""
    data: int = 0
    samples: int = 0
    batches: int = 0

    def empty(self) -> bool:
        return not (self.host or self.marks or self.comm or self.batches)


@dataclass(slots=True)
class PendingStep:
    """A finished step whose device markers may not have completed yet."""

    step: int
    start: int
    dur: int
    work: OpenStep
    last: Marker | None
    profiled: bool

    def ready(self) -> bool:
        if self.last is not None and not self.last.query():
            return False
        return all(c[1] is not None and c[1].query() for c in self.work.comm)


class PhaseTarget(Protocol):
    """What a :class:`Phase` reads and fills in its tracker."""

    _step_start: int | None
    _clock: Callable[[], int]
    _nvtx: bool
    _dev: DeviceClock | None
    _open: OpenStep


class CommTarget(Protocol):
    """What the communication wrappers of a sharded model (:class:`~.fsdp.CommSink`) write to in their tracker."""

    _comm_clock: DeviceClock
    _open: OpenStep


class Phase:
    """``with tracker.phase(name):`` — a plain class: cheaper than a generator context manager."""

    __slots__ = ("_m0", "_name", "_t0", "_tracker")

    def __init__(self, tracker: PhaseTarget, name: str) -> None:
        self._tracker = tracker
        self._name = name

    def __enter__(self) -> None:
        t = self._tracker
        if t._step_start is None:
            t._step_start = t._clock()
        if t._nvtx:
            nvtx_push(self._name)
        self._m0 = t._dev.mark() if t._dev is not None else None
        self._t0 = t._clock()

    def __exit__(self, *exc: object) -> None:
        t = self._tracker
        t1 = t._clock()
        host = t._open.host
        host[self._name] = host.get(self._name, 0) + t1 - self._t0
        if self._m0 is not None and t._dev is not None:
            t._open.marks.append((self._name, self._m0, t._dev.mark()))
        if t._nvtx:
            nvtx_pop()


def nvtx_push(name: str) -> None:
    import torch

    torch.cuda.nvtx.range_push(name)  # type: ignore[no-untyped-call]


def nvtx_pop() -> None:
    import torch

    torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]
