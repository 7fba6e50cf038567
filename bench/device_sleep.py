"""A GPU stand-in for JAX on the CPU: ``device_wait(x, ms)`` inside a jitted function sleeps on XLA's thread.

A GPU kernel takes time on the device while the host's thread and the interpreter's lock stay free, and the
host dispatches ahead of it. On JAX's CPU backend, a ``jax.pure_callback`` that sleeps is no such stand-in: it
runs Python, so it waits for the interpreter's lock, which the training loop's (and a tracker's) Python holds.
This is an XLA FFI call written in C++ (``device_sleep.cc``) that sleeps without the lock. Built once with
``g++`` against the headers jaxlib ships (``jax.ffi.include_dir()``) into ``/tmp/gpuidle-bench/``.

XLA's CPU client runs a computation of no arithmetic ("cheap") inline on the calling thread: a jitted
function that calls ``device_wait`` must also compute something (a small matmul is enough) to be dispatched
asynchronously, as on a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import subprocess
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

SOURCE = Path(__file__).with_name("device_sleep.cc")
TARGET = "gpuidle_bench_sleep"


def build(work: Path = Path("/tmp/gpuidle-bench")) -> Path:
    """The shared library, rebuilt when the source or JAX changed."""
    key = hashlib.sha256(SOURCE.read_bytes() + jax.__version__.encode()).hexdigest()[:12]
    lib = work / f"device_sleep-{key}.so"
    if not lib.exists():
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-w", f"-I{jax.ffi.include_dir()}",
                        str(SOURCE), "-o", str(lib)], check=True)
    return lib


@functools.cache
def _register() -> None:
    """The library loaded and its handler known to XLA, once a process."""
    handler = ctypes.cdll.LoadLibrary(str(build())).GpuidleBenchSleep
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler), platform="cpu")


def device_wait_fn() -> Callable[[jax.Array, float], jax.Array]:
    """``device_wait(x, ms)``: ``x`` (float32) after ``ms`` milliseconds of the device's time."""
    _register()

    def device_wait(x: jax.Array, ms: float) -> jax.Array:
        out: jax.Array = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype))(x, ms=np.float32(ms))
        return out

    return device_wait
