"""Two executors of the per-rank work: a local process pool (the default) and a Dask cluster.

Both take the trace files of one or many jobs and return one :class:`~gpuidle.jobs.rank.RankOutcome` per
rank, sorted the same way, so the merge that follows cannot tell which ran. Dask is imported only when
a scheduler is given (``--scheduler``, ``DASK_SCHEDULER_ADDRESS``, or ``scheduler-address`` in Dask's own
configuration files), never for a local run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuidle.jobs.contract import Executor, Progress, ordered
from gpuidle.jobs.rank import RankOutcome, analyze_file, failed
from gpuidle.model.cores import fork_hazard

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
"""Dask's own variable for the scheduler to use (``dask.config`` key ``scheduler-address``)."""


class LocalPool:
    """One process per file, at most ``workers`` at once (default: the CPU count); one file runs in-process.

    Workers are forked where that is safe, else started as fresh interpreters (:mod:`.fresh`, some 0.4 s
    each): never forked from a process with JAX, TensorFlow, a CUDA context or threads of its own."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def run(self, files: Sequence[str], progress: Progress | None = None) -> list[RankOutcome]:
        if len(files) == 1:
            path = files[0]
            return analyze_file(path, (lambda done, total: progress(path, done, total)) if progress else None)
        n = max(1, min(self.workers or os.cpu_count() or 1, len(files)))
        if fork_hazard() is not None:
            from gpuidle.jobs.fresh import FreshPool

            return ordered(FreshPool(n).run(files, progress))
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        forked = multiprocessing.get_context("fork")  # at once, and without the caller's main module run again
        out: list[RankOutcome] = []
        lost: list[str] = []
        with ProcessPoolExecutor(max_workers=n, mp_context=forked) as pool:
            futures = {pool.submit(analyze_file, f): f for f in files}
            for done, fut in enumerate(as_completed(futures), 1):
                try:
                    out.extend(fut.result())
                except BrokenProcessPool:  # a worker died (killed, out of memory): every pending file fails
                    lost.append(futures[fut])
                if progress:
                    progress("ranks", done, len(files))
        for f in sorted(lost):  # alone, each in a fresh worker: only the file that kills its worker is lost
            with ProcessPoolExecutor(max_workers=1, mp_context=forked) as alone:
                try:
                    out.extend(alone.submit(analyze_file, f).result())
                except BrokenProcessPool:
                    out.append(failed(f, "the worker reading it died (out of memory, or killed)"))
        return ordered(out)


def configured_scheduler(given: str | None = None) -> str | None:
    """The Dask scheduler to run on: ``given``, else ``DASK_SCHEDULER_ADDRESS``, else ``scheduler-address``
    in Dask's configuration files; None for a local run.

    ``dask.config`` is imported only when one of its files exists (``$DASK_CONFIG``, ``~/.config/dask``,
    ``/etc/dask``, ``<prefix>/etc/dask``), so a machine without Dask's configuration never loads Dask.
    """
    if given:
        return given
    if os.environ.get(SCHEDULER_ENV):
        return os.environ[SCHEDULER_ENV]
    if not any(_has_config(d) for d in _config_dirs()):
        return None
    try:
        import dask.config
    except ImportError:
        return None  # Dask's files without Dask: a local run, as without them
    address = dask.config.get("scheduler-address", default=None)
    return str(address) if address else None


def _config_dirs() -> list[Path]:
    dirs = [Path("~/.config/dask").expanduser(), Path("/etc/dask"), Path(sys.prefix) / "etc" / "dask"]
    if os.environ.get("DASK_CONFIG"):
        dirs.insert(0, Path(os.environ["DASK_CONFIG"]).expanduser())
    return dirs


def _has_config(folder: Path) -> bool:
    try:
        return any(f.suffix in (".yaml", ".yml", ".json") for f in folder.iterdir())
    except OSError:
        return False


def executor_for(scheduler: str | None, workers: int | None = None) -> Executor:
    """The Dask executor for ``scheduler`` (see :func:`configured_scheduler`), else the local pool."""
    address = configured_scheduler(scheduler)
    if address is None:
        return LocalPool(workers)
    from gpuidle.jobs.cluster import DaskCluster

    return DaskCluster(address)
