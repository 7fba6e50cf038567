"""Reading a Kineto trace's events into columns: in this process, or on every core for a big trace.

The reader's stream (:mod:`gpuidle.sources.jsonstream`) cuts the event list into chunks of a few
MiB. A small trace's chunks are read into columns here, one at a time. A big one's are only
inflated and cut here, then read into columns by workers, a few chunks in flight: threads where the
compiled scanner is built (it reads without the GIL), else processes, to which only the chunk's text
goes and from which only its arrays come back. The columns come back in the file's order and are
merged: names and threads re-interned, so the ids are those a serial read gives. The cuts are taken
on trust (a ``},{`` inside a string or a nested object is not an event's end): a chunk that does not
decode starts the read again with each cut checked here for its syntax (a scan that creates no
objects, and fails exactly where the typed decoder would), so a cut inside an event, and bad bytes,
are found and worded as a serial read finds and words them.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from gpuidle.errors import CorruptInput, GpuidleError
from gpuidle.model.cores import fork_hazard, in_worker_process, usable_cores
from gpuidle.sources.inputs import is_url
from gpuidle.sources.jsonstream import TraceStream
from gpuidle.sources.kineto_columns import Columns
from gpuidle.sources.kineto_events import decode_chunk
from gpuidle.sources.kineto_scan import SCANNER_BUILT, scan_or_decode

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future


def columns_of(text: bytes) -> Columns:
    """One chunk's columns (a worker's task): the chunk's own ids, merged in order by :meth:`Columns.merge`."""
    cols = Columns()
    cols.add(scan_or_decode(text))
    cols.done_adding()
    return cols


PARALLEL_FROM = 32 << 20
"""File bytes from which a trace is read on every core (a gzip trace of that size holds some 200 to 400 MiB
of JSON): below, starting the workers costs about what they save."""
THREAD_CHUNK = 8 << 20
"""The bytes of events one reader thread scans at a time: four times the stream's serial chunk, so that each
chunk's fixed costs (its columns' many small array operations, and its merge here) are paid a quarter as often;
a 1 GiB trace reads some 0.4 s faster on two cores than in 2 MiB chunks."""
WORKERS_ENV = "GPUIDLE_READ_WORKERS"
"""Processes to decode one trace with, whatever its size (1: in this process); worker processes never fan out."""
_SYNTAX = msgspec.json.Decoder(list[msgspec.Raw])


def read_workers(path: str) -> int:
    """Processes to decode ``path`` with: every core for a big local trace on Linux; 1 (this process) for a
    small one, a remote one (its size would cost a request of its own), elsewhere than Linux, or when this is
    itself a worker (a rank of a job, a Dask task). The process pool's modules load only when a pool is used."""
    if sys.platform != "linux":  # workers are forked: safe on Linux only
        return 1
    given = os.environ.get(WORKERS_ENV, "").strip()
    if given:
        try:
            workers = max(1, int(given))
        except ValueError:
            raise GpuidleError(f"{WORKERS_ENV}={given!r} is not a number of processes",
                               "unset it, or give a whole number (1: read in this process)") from None
    else:
        try:
            if is_url(path) or os.path.getsize(path) < PARALLEL_FROM:
                return 1
        except OSError:  # missing or unreadable: the stream says so in its own words
            return 1
        workers = usable_cores()
    if workers > 1 and in_worker_process():  # a worker forking workers of its own could deadlock
        return 1
    if workers > 1 and not SCANNER_BUILT and fork_hazard():  # the decoders are forked processes: read here
        return 1
    return workers


def _checked(text: bytes) -> bytes:
    """The chunk itself once its syntax holds; else the typed decoder's own error, as a serial read gives it."""
    try:
        _SYNTAX.decode(text)
    except msgspec.DecodeError:
        decode_chunk(text)  # raises the same error, worded as the typed decoder words it
        raise
    return text


def _unchecked(text: bytes) -> bytes:
    return text


class _Recheck(Exception):
    """A worker could not decode its chunk: a cut inside an event, or bad bytes. Read again, checking each cut."""


def read_columns(path: str, progress: Callable[[int, int], None] | None = None) -> tuple[Columns, dict[str, Any]]:
    """Every chunk's columns, merged in the file's order, and the file's header.

    On every core the cuts are first taken on trust: this process only inflates and cuts, and the workers decode.
    A chunk a worker cannot decode (its cut fell inside an event, or the file is damaged) sends the read back to
    the start with every cut checked here before it is sent: the reading, cuts and errors of a serial read.
    """
    workers = read_workers(path)
    if workers == 1:
        stream: TraceStream[Any] = TraceStream(path, scan_or_decode, progress)
        cols = Columns()
        for events in stream:
            cols.add(events)
        return cols, stream.header
    chunk = THREAD_CHUNK if SCANNER_BUILT else None
    try:
        return _read_on(workers, TraceStream(path, _unchecked, progress, chunk, inflate_ahead=True), path, trusted=True)
    except _Recheck:
        return _read_on(workers, TraceStream(path, _checked, progress, chunk, inflate_ahead=True), path, trusted=False)


def _read_on(workers: int, stream: TraceStream[bytes], path: str, trusted: bool) -> tuple[Columns, dict[str, Any]]:
    cols = Columns()
    for part in _in_order(stream, workers, path, trusted):
        cols.merge(part)
    return cols, stream.header


def _in_order(texts: Iterable[bytes], workers: int, path: str, trusted: bool) -> Iterator[Columns]:
    """The chunks' columns from a pool of ``workers`` threads or processes, two chunks in flight per worker.

    ``trusted``: the chunks' cuts were not checked; a chunk that does not decode raises :class:`_Recheck`, and so
    does an error of the stream itself while a chunk before it does not decode (the serial read meets that first).
    """
    pool = _pool(workers)
    pending: deque[Future[Columns]] = deque()
    try:
        try:
            for text in texts:
                pending.append(pool.submit(columns_of, text))
                if len(pending) >= 2 * workers:
                    yield _result(pending.popleft(), path, trusted)
        except GpuidleError:
            for future in pending:  # an earlier chunk's own error comes first in the file
                _result(future, path, trusted)
            raise
        while pending:
            yield _result(pending.popleft(), path, trusted)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _pool(workers: int) -> Executor:
    """Threads where the scanner is built: it reads a chunk without the GIL, and the chunk and its columns then
    need not cross a process. Else processes, forked: they start at once with this module loaded, and need no
    ``if __name__ == "__main__"`` guard in the caller's script (spawn and forkserver import it again)."""
    if SCANNER_BUILT:
        from concurrent.futures import ThreadPoolExecutor

        return ThreadPoolExecutor(workers, thread_name_prefix="gpuidle-read")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))


def _result(future: Future[Columns], path: str, trusted: bool) -> Columns:
    try:
        return future.result()
    except (msgspec.DecodeError, RecursionError) as err:
        if trusted:
            raise _Recheck from None
        raise CorruptInput(f"{path}: invalid JSON in the event list ({err})",
                           "the file is damaged or truncated") from None
