"""The step tracker for Keras 3: ``from gpuidle.keras import GpuidleCallback``.

On the TensorFlow backend it needs TensorFlow (``pip install 'gpuidle[tensorflow]'``); on the JAX
backend, JAX (``pip install 'gpuidle[jax]' keras``). The same callback either way; see
docs/tracker-keras.md.

>>> from gpuidle.keras import GpuidleCallback
>>> callback = GpuidleCallback("gpuidle-run")                                     # doctest: +SKIP
>>> model.fit(callback.dataset(train_ds), epochs=3, callbacks=[callback])         # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import keras as _keras

    if _keras.backend.backend() == "jax":
        import jax as _jax  # noqa: F401  (only to say clearly what is missing)
    else:
        import tensorflow as _tf  # noqa: F401
except ImportError as err:
    raise ImportError(f"gpuidle.keras needs Keras 3 and its backend ({err}): pip install 'gpuidle[tensorflow]', "
                      "or 'gpuidle[jax]' keras") from err

if TYPE_CHECKING or _keras.backend.backend() != "jax":
    from gpuidle.live.tracker.keras_callback import GpuidleCallback
else:
    from gpuidle.live.tracker.keras_jax import GpuidleCallback

__all__ = ["GpuidleCallback"]
