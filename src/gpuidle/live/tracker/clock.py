"""Clocks for the tracker: the host's, and markers placed in the device's work queue."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import torch


class Marker(Protocol):
    """A point in the device's work queue; complete once the device has reached it."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class DeviceClock(Protocol):
    """Places markers on the current stream and measures between them once both completed.

    CUDA events in production (:class:`CudaClock`); tests pass a fake whose markers complete later.
    """

    def mark(self) -> Marker: ...

    def elapsed_ns(self, start: Marker, end: Marker) -> int: ...

    def release(self, markers: Iterable[Marker]) -> None: ...


class Instant:
    """A host timestamp dressed as a marker: complete from the start."""

    __slots__ = ("ns",)

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class HostClock:
    """Markers that are host timestamps. Times DDP buckets when there is no device clock."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock

    def mark(self) -> Instant:
        return Instant(self._clock())

    def elapsed_ns(self, start: Marker, end: Marker) -> int:
        return cast(Instant, end).ns - cast(Instant, start).ns

    def release(self, markers: Iterable[Marker]) -> None:
        return None


class CudaClock:
    """CUDA events with timing, recorded on the current stream; reused from a pool once read."""

    def __init__(self) -> None:
        import torch

        self._event: Any = torch.cuda.Event
        self._pool: list[torch.cuda.Event] = []

    def mark(self) -> torch.cuda.Event:
        ev = self._pool.pop() if self._pool else self._event(enable_timing=True)
        ev.record()
        return cast("torch.cuda.Event", ev)

    def elapsed_ns(self, start: Marker, end: Marker) -> int:
        ms: float = cast("torch.cuda.Event", start).elapsed_time(cast("torch.cuda.Event", end))
        return round(ms * 1e6)

    def release(self, markers: Iterable[Marker]) -> None:
        self._pool.extend(cast("torch.cuda.Event", m) for m in markers if isinstance(m, self._event))
