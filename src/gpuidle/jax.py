"""The step tracker for JAX: ``from gpuidle.jax import StepTracker``.

Needs JAX (``pip install 'gpuidle[jax]'``); see docs/tracker-jax.md.

>>> from gpuidle.jax import StepTracker
>>> tracker = StepTracker(out_dir="gpuidle-run")                    # doctest: +SKIP
>>> for batch in tracker.loader(batches):                         # doctest: +SKIP
...     with tracker.phase("train_step"):
...         state, loss = train_step(state, batch)
...     tracker.step(loss)
>>> tracker.close()                                               # doctest: +SKIP
"""

from __future__ import annotations

try:
    import jax as _jax  # noqa: F401  (only to say clearly what is missing)
except ImportError as err:
    raise ImportError(f"gpuidle.jax needs JAX ({err}): pip install 'gpuidle[jax]'") from err

from gpuidle.live.tracker.jax_tracker import StepTracker

__all__ = ["StepTracker"]
