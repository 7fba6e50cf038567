"""Workers in fresh interpreters, for a caller that must not fork (see :func:`~gpuidle.model.cores.fork_hazard`).

``python -m gpuidle.jobs.fresh`` imports the per-rank work and nothing of the caller: multiprocessing's spawn and
forkserver would run the caller's main module again in every worker, which breaks a script that calls
:func:`gpuidle.analyze` without an ``if __name__ == "__main__"`` guard. Each worker reads paths and writes
outcomes as length-prefixed pickles on its own pipes; it prints nothing else there (its stdout goes to stderr).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from typing import IO, Any

from gpuidle.jobs.contract import Progress
from gpuidle.jobs.rank import RankOutcome, analyze_file, failed, internal_error
from gpuidle.model.cores import WORKER_ENV

_LENGTH = struct.Struct("<Q")
DIED = "the worker reading it died or could not start (out of memory, or killed)"


def _send(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next value; EOFError where the other end is gone."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _worker_command() -> list[str]:
    return [sys.executable, "-m", "gpuidle.jobs.fresh"]


class _Worker:
    def __init__(self) -> None:
        env = os.environ | {WORKER_ENV: "1"}
        self.proc = subprocess.Popen(_worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def analyze(self, path: str) -> list[RankOutcome]:
        """The file's outcomes; EOFError (or a broken pipe) where the worker died."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        _send(self.proc.stdin, path)
        outcomes: list[RankOutcome] = _receive(self.proc.stdout)
        return outcomes

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):  # already gone with its worker
                self.proc.stdin.close()
        self.proc.wait()


class FreshPool:
    """At most ``workers`` fresh interpreters, each analysing file after file; one that dies loses only the file
    it was reading, and another takes its place."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def run(self, files: Sequence[str], progress: Progress | None = None) -> list[RankOutcome]:
        todo = deque(files)
        lock = threading.Lock()
        finished: queue.Queue[tuple[str, list[RankOutcome] | None]] = queue.Queue()  # None: its worker died

        def serve() -> None:
            worker: _Worker | None = None
            while True:
                with lock:
                    if not todo:
                        break
                    path = todo.popleft()
                worker, outcomes = _analyze(worker, path)
                finished.put((path, outcomes))
            if worker is not None:
                worker.close()

        threads = [threading.Thread(target=serve, name="gpuidle-fresh-pool", daemon=True)
                   for _ in range(max(1, min(self.workers, len(files))))]
        for t in threads:
            t.start()
        out: list[RankOutcome] = []
        lost: list[str] = []
        for done in range(1, len(files) + 1):
            path, outcomes = finished.get()
            if outcomes is None:
                lost.append(path)
            else:
                out.extend(outcomes)
            if progress:
                progress("ranks", done, len(files))
        for t in threads:
            t.join()
        for path in sorted(lost):  # alone, in a worker of its own: it may have died for its siblings' memory
            worker, outcomes = _analyze(None, path)
            if worker is not None:
                worker.close()
            out.extend(outcomes if outcomes is not None else [failed(path, DIED)])
        return out


def _analyze(worker: _Worker | None, path: str) -> tuple[_Worker | None, list[RankOutcome] | None]:
    """``path`` by ``worker`` (started if None): the worker still alive, and the outcomes (None: it died)."""
    try:
        worker = worker or _Worker()
        return worker, worker.analyze(path)
    except (EOFError, OSError):
        if worker is not None:
            worker.close()
        return None, None
    except Exception as err:  # an outcome that would not unpickle: that file's, the stream is still in step
        return worker, [internal_error(path, err)]


def main() -> None:
    """A worker: a path in, its outcomes out, until the caller closes the pipe."""
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never between the results
    requests = sys.stdin.buffer
    while True:
        try:
            path = _receive(requests)
        except EOFError:
            return
        _send(results, analyze_file(path))


if __name__ == "__main__":
    main()
