"""The cores one input's work may take: those this process may run on, unless it is itself one of many workers."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def in_worker_process() -> bool:
    """Whether this process was started by another as a worker (a rank of a job analysed in a pool, a Dask task):
    its siblings take the other cores, so its own work stays on one. ``multiprocessing`` loads only here."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def cores_for_one_input() -> int:
    """Threads or processes one big input's work may spread over: every usable core, or one in a worker."""
    cores = usable_cores()
    return 1 if cores > 1 and in_worker_process() else cores
