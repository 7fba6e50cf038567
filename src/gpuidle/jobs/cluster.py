"""The per-rank work on an existing Dask cluster (``gpuidle[dask]``: ``distributed``).

Each file is one task that runs :func:`gpuidle.jobs.rank.analyze_file` on a worker: the worker opens the
file itself (a shared filesystem path or an fsspec URL), and only the compact per-rank result comes back.
A worker that dies mid-task is Dask's to handle: the scheduler reschedules the task, up to its
``distributed.scheduler.allowed-failures``. A file given up that way is tried once more, alone (on a
crowded worker it may only have shared the fate of the file that kills workers); failing again, it
comes back as that file's one-line error. The client never waits without bound: an address where no
scheduler answers is refused by a first look with a deadline (:mod:`gpuidle.jobs.probe`), connecting gives up
after :data:`CONNECT_TIMEOUT_S`, and ranks still pending when the cluster has had no worker for
:data:`NO_WORKER_TIMEOUT_S` are reported as lost.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gpuidle.errors import GpuidleError
from gpuidle.jobs.contract import Progress, ordered
from gpuidle.jobs.probe import not_a_scheduler
from gpuidle.jobs.rank import RankOutcome, analyze_file, failed

CONNECT_TIMEOUT_S = 10.0
"""How long the client tries to reach the scheduler before saying it cannot."""
NO_WORKER_TIMEOUT_S = 60.0
"""How long the client waits for a cluster without workers (none yet, or all gone) before giving up."""
POLL_S = 1.0
"""How often the client looks at the cluster while no result arrives."""

KILLED = ("the workers reading it died (out of memory, or killed) each time it was tried, also alone: "
          "given up (distributed.scheduler.allowed-failures)")
_INSTALL = "pip install 'gpuidle[dask]' on the client and on every worker"


class DaskCluster:
    """Runs the per-rank work on the Dask scheduler at ``address`` (``tcp://host:8786``, ...)."""

    def __init__(self, address: str, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 no_worker_timeout_s: float = NO_WORKER_TIMEOUT_S) -> None:
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self.no_worker_timeout_s = no_worker_timeout_s

    def run(self, files: Sequence[str], progress: Progress | None = None) -> list[RankOutcome]:
        with _quiet_logs(), self._client() as client:
            try:
                client.wait_for_workers(1, timeout=self.no_worker_timeout_s)
            except TimeoutError:
                raise GpuidleError(f"the Dask scheduler at {self.address} has had no worker for "
                                   f"{self.no_worker_timeout_s:g} s", "start workers: dask worker ADDRESS") from None
            run = uuid.uuid4().hex[:12]
            futures = {client.submit(analyze_file, f, key=_key(run, str(i), f), pure=False): f
                       for i, f in enumerate(files)}
            with client.as_current():  # distributed.wait finds its client this way
                out, killed = self._gather(client, futures, progress)
                for i, f in enumerate(killed):  # alone, each: only the file that kills its workers is lost
                    again, lost = self._gather(client, {client.submit(analyze_file, f, key=_key(run, f"alone{i}", f),
                                                                      pure=False): f}, None)
                    out.extend(again + [failed(f, KILLED) for f in lost])
            return ordered(out)

    @contextmanager
    def _client(self) -> Iterator[Any]:
        try:
            from distributed import Client
        except ImportError:
            raise GpuidleError("running on a Dask cluster needs distributed, which is not installed",
                               _INSTALL) from None
        refused = not_a_scheduler(self.address)
        if refused is not None:  # Dask would retry a refused connection, or wait on a server that is not Dask's
            raise GpuidleError(f"cannot reach the Dask scheduler at {self.address}: {refused}",
                               "start it (dask scheduler) or give its address with --scheduler or "
                               "DASK_SCHEDULER_ADDRESS")
        try:
            client = Client(self.address, timeout=self.connect_timeout_s, set_as_default=False)  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError, ValueError) as err:
            reason = " ".join(str(err).split()) or type(err).__name__
            raise GpuidleError(f"cannot reach the Dask scheduler at {self.address} within "
                               f"{self.connect_timeout_s:g} s ({reason[:200]})",
                               "start it (dask scheduler) or give its address with --scheduler or "
                               "DASK_SCHEDULER_ADDRESS") from None
        try:
            yield client
        finally:
            client.close()  # type: ignore[no-untyped-call]

    def _gather(self, client: Any, futures: dict[Any, str],
                progress: Progress | None) -> tuple[list[RankOutcome], list[str]]:
        """The outcomes of the tasks, and the files whose workers died each time they were tried: on a
        crowded worker, a file can share the fate of the one that kills it."""
        from distributed import KilledWorker, wait

        out: list[RankOutcome] = []
        killed: list[str] = []
        pending = set(futures)
        idle_s = 0.0
        done = 0
        while pending:
            try:
                finished, pending = wait(pending, timeout=POLL_S, return_when="FIRST_COMPLETED")  # type: ignore[no-untyped-call]
            except TimeoutError:
                idle_s = idle_s + POLL_S if not self._workers(client) else 0.0
                if idle_s >= self.no_worker_timeout_s:
                    client.cancel(list(pending))
                    out.extend(failed(futures[f], f"no worker left on the cluster for {idle_s:g} s")
                               for f in pending)
                    break
                continue
            idle_s = 0.0
            for fut in finished:
                if fut.status == "error" and isinstance(fut.exception(), KilledWorker):
                    killed.append(futures[fut])
                else:
                    out.extend(_outcome(fut, futures[fut]))
                done += 1  # one at a time: tasks that finish together still count 1, 2, ...
                if progress:
                    progress("ranks", done, len(futures))
        return out, sorted(killed)

    def _workers(self, client: Any) -> int:
        try:
            return len(client.scheduler_info().get("workers", {}))
        except (OSError, TimeoutError) as err:
            raise GpuidleError(f"lost the Dask scheduler at {self.address} ({' '.join(str(err).split())[:200]})",
                               "run the analysis again once the scheduler is back") from None


def _outcome(fut: Any, path: str) -> list[RankOutcome]:
    """A task's result, or its failure as the file's one line."""
    if fut.status == "finished":
        result: list[RankOutcome] = fut.result()
        return result
    if fut.status == "cancelled":
        return [failed(path, "cancelled on the cluster")]
    err = fut.exception()
    if isinstance(err, ModuleNotFoundError) and "gpuidle" in str(err):
        raise GpuidleError("the Dask workers cannot import gpuidle", _INSTALL)
    return [failed(path, f"failed on the cluster: {type(err).__name__}: {err}")]


def _key(run: str, tag: str, path: str) -> str:
    """The task's name on the cluster: unique to this run and try, and saying which file it reads."""
    return f"gpuidle-{run}-{tag}-{os.path.basename(path)}"


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """distributed logs its connection attempts on stderr; the client says what failed in one line."""
    log = logging.getLogger("distributed")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)

