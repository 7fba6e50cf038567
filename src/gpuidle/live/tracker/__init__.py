"""The in-process step tracker, by concern: clocks, phases, DDP hook timing, the exchange across
ranks, the profiled window, the outputs, and :class:`StepTracker` (``core``) that ties them.

Users import it as ``gpuidle.torch``; it needs PyTorch.
"""

from __future__ import annotations

from .clock import CudaClock, DeviceClock, HostClock, Marker
from .core import StepTracker
from .ddp import timed_hook
from .phases import COMPUTE_PHASES, DEFAULT_PHASES, batch_size

__all__ = [
    "COMPUTE_PHASES",
    "DEFAULT_PHASES",
    "CudaClock",
    "DeviceClock",
    "HostClock",
    "Marker",
    "StepTracker",
    "batch_size",
    "timed_hook",
]
