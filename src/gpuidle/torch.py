"""The public import path of the in-process step tracker: ``from gpuidle.torch import StepTracker``.

Needs PyTorch (``pip install 'gpuidle[torch]'``). The Lightning and Hugging Face callbacks
load on first use, so their packages stay optional.
"""

from __future__ import annotations

from typing import Any

try:
    import torch as _torch  # noqa: F401  (only to say clearly what is missing)
except ImportError as err:
    raise ImportError(f"gpuidle.torch needs PyTorch ({err}): pip install 'gpuidle[torch]', "
                      "or install the torch build for your CUDA/ROCm version first") from err

from gpuidle.live import tracker as _tracker
from gpuidle.live.tracker import *  # noqa: F403  (the tracker package's public names are this module's)

__all__ = _tracker.__all__


def __getattr__(name: str) -> Any:
    if name == "GpuidleLightningCallback":
        from gpuidle.live.lightning_callback import GpuidleLightningCallback

        return GpuidleLightningCallback
    if name == "GpuidleTrainerCallback":
        from gpuidle.live.hf_callback import GpuidleTrainerCallback

        return GpuidleTrainerCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
