"""The JAX loop's host syncs, timed where JAX lets us see them.

A host sync is a call that waits for the device: ``float(x)``, ``int(x)``, ``x.item()``,
``np.asarray(x)``, ``jax.device_get(x)``, printing an array, ``x.block_until_ready()``,
``jax.block_until_ready(...)``. While a :class:`SyncWatch` is installed, those entry points of ``jax.Array`` (and
``jax.block_until_ready``) are wrapped: on the training loop's thread each call is timed and
reported; on any other thread (the tracker's own watcher) they pass straight through.
:meth:`SyncWatch.uninstall` puts the originals back. A JAX whose array type lacks an entry
point is not patched there (:attr:`SyncWatch.missing` names it, and the tracker says so). On the CPU
backend an array also exposes its memory as a buffer, which NumPy reads before it asks ``__array__``:
``np.asarray(x)`` there waits in C, unseen (the tracker notes it); a GPU array has no such buffer.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

METHODS = ("block_until_ready", "__array__", "item")
"""Methods of the array type that wait for the device; ``_value`` (a property) serves float(), printing, tolist()."""
PROPERTY = "_value"

_installed = threading.Lock()
"""One watch at a time: two trackers would time each sync twice."""


class SyncWatch:
    """Wraps JAX's syncing entry points; ``report(start_ns, end_ns)`` is told of each call on ``thread``."""

    def __init__(self, report: Callable[[int, int], None], clock: Callable[[], int]) -> None:
        self._report = report
        self._clock = clock
        self._thread = threading.get_ident()
        self._depth = 0
        self._saved: list[tuple[Any, str, Any]] = []
        self.missing: list[str] = []
        self.installed = False

    def install(self) -> bool:
        """Wrap the entry points; False when another watch is installed."""
        if not _installed.acquire(blocking=False):
            return False
        array_type = type(jax.numpy.zeros(()))
        for name in METHODS:
            original = array_type.__dict__.get(name)
            if original is None:
                self.missing.append(f"jax.Array.{name}")
                continue
            self._patch(array_type, name, self._timed(original))
        value = array_type.__dict__.get(PROPERTY)
        if isinstance(value, property) and value.fget is not None:
            self._patch(array_type, PROPERTY, property(self._timed(value.fget)))
        else:
            self.missing.append("float(x) and printing (jax.Array._value)")
        self._patch(jax, "block_until_ready", self._timed(jax.block_until_ready))
        self.installed = True
        return True

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        if self.installed:
            self.installed = False
            _installed.release()

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """The tracker's own waits on the loop's thread (its exchange waits for old steps, and may gather through
        JAX): not the loop's syncs."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        self._saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, wrapper)

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if watch._depth or threading.get_ident() != watch._thread:
                return original(*args, **kwargs)
            watch._depth += 1
            t0 = watch._clock()
            try:
                return original(*args, **kwargs)
            finally:
                watch._depth -= 1
                watch._report(t0, watch._clock())

        return timed
