"""The step tracker for Keras 3 on TensorFlow: ``from gpuidle.keras import GpuidleCallback``.

Needs TensorFlow (``pip install 'gpuidle[tensorflow]'``); see docs/tracker-keras.md.

>>> from gpuidle.keras import GpuidleCallback
>>> callback = GpuidleCallback("gpuidle-run")                                     # doctest: +SKIP
>>> model.fit(callback.dataset(train_ds), epochs=3, callbacks=[callback])         # doctest: +SKIP
"""

from __future__ import annotations

try:
    import keras as _keras  # noqa: F401  (only to say clearly what is missing)
    import tensorflow as _tf  # noqa: F401
except ImportError as err:
    raise ImportError(f"gpuidle.keras needs TensorFlow and Keras 3 ({err}): pip install 'gpuidle[tensorflow]'") \
        from err

from gpuidle.live.tracker.keras_callback import GpuidleCallback

__all__ = ["GpuidleCallback"]
