"""The in-process step tracker, by concern: clocks, phases, DDP hook timing, the exchange across
ranks, the profiled window, the outputs, and :class:`StepTracker` (``core``) that ties them.

Users import it as ``gpuidle.torch``; it needs PyTorch.

>>> from gpuidle.torch import StepTracker
>>> tracker = StepTracker(out_dir="gpuidle-run", model=ddp_model)   # doctest: +SKIP
>>> for batch in tracker.loader(train_loader):                     # doctest: +SKIP
...     with tracker.phase("h2d"):
...         batch = batch.to(device, non_blocking=True)
...     with tracker.phase("forward"):
...         loss = model(batch)
...     with tracker.phase("backward"):
...         loss.backward()
...     with tracker.phase("optimizer"):
...         opt.step(); opt.zero_grad()
...     tracker.step()
>>> tracker.close()                                                # doctest: +SKIP
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
