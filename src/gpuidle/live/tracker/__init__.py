"""The in-process step tracker, by concern, in layers with no circle.

Framework-neutral, importing no framework: :mod:`.exchange` (the rows of finished steps and
their exchange across ranks), :mod:`.output` (logs and summary), :mod:`.metrics` (Prometheus),
:mod:`.base` (:class:`~.base.TrackerBase`, which ties them). Below the PyTorch tracker:
:mod:`.clock`, :mod:`.phases`, :mod:`.ddp` (DDP's comm hook), :mod:`.profile`; then
:mod:`.core`, the PyTorch :class:`StepTracker`. Beside it, on the same base:
:mod:`.jax_tracker` (``gpuidle.jax``) and :mod:`.keras_callback` (``gpuidle.keras``).

The names below are the PyTorch tracker's (``gpuidle.torch``); they load on first use, so that
the JAX and Keras trackers import no PyTorch.

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

import importlib
from typing import Any

_WHERE = {
    "COMPUTE_PHASES": "phases", "DEFAULT_PHASES": "phases", "batch_size": "phases",
    "CudaClock": "clock", "DeviceClock": "clock", "HostClock": "clock", "Marker": "clock",
    "StepTracker": "core", "timed_hook": "ddp",
}
"""The PyTorch tracker's public names and their modules."""

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return [*globals(), *__all__]
