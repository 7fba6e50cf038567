"""The cores one input's work may take, and how workers may be started: those this process may run on, unless it
is itself one of many workers; forked only where forking is safe."""

from __future__ import annotations

import os
import sys
import threading

WORKER_ENV = "GPUIDLE_WORKER"
"""Set to 1 in the workers gpuidle starts as fresh interpreters (:mod:`gpuidle.jobs.fresh`)."""


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def in_worker_process() -> bool:
    """Whether this process was started by another as a worker (a rank of a job analysed in a pool, a Dask task):
    its siblings take the other cores, so its own work stays on one. ``multiprocessing`` loads only here."""
    if os.environ.get(WORKER_ENV) == "1":
        return True
    import multiprocessing

    return multiprocessing.parent_process() is not None


def cores_for_one_input() -> int:
    """Threads or processes one big input's work may spread over: every usable core, or one in a worker."""
    cores = usable_cores()
    return 1 if cores > 1 and in_worker_process() else cores


def fork_hazard() -> str | None:
    """Why a forked child of this process could hang or fail, or None where forking is safe.

    A child has only the thread that forked, with every lock as the other threads held it: JAX and TensorFlow run
    thread pools of their own (JAX warns at every fork), a CUDA context does not survive a fork, and the caller's
    own threads may hold the interpreter's I/O or logging locks. Daemon threads (a progress bar's refresh, a
    client's event loop) are taken to be helpers that a worker never waits on."""
    for runtime in ("jax", "jaxlib", "tensorflow"):
        if runtime in sys.modules:
            return f"{runtime} is loaded"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA is initialised"
    others = [t for t in threading.enumerate()
              if t is not threading.current_thread() and t.is_alive() and not t.daemon]
    return f"{len(others)} other thread(s) run" if others else None
