"""Stream the ``traceEvents`` array of a Chrome-trace JSON file in bounded chunks.

A trace can be gigabytes once decompressed. Decoding it whole would hold the text
*and* every decoded event at once; instead the file is gunzipped as a stream and the
events array is cut into chunks of a few MiB at ``},`` + ``{`` boundaries. Each
chunk is decoded by the caller's typed decoder. A cut that fell inside an event
(a ``},{`` inside a string or a nested array) makes the chunk invalid JSON only at
its very end, where ``]`` was added; an error the decoder places before that is in the
file itself and is reported at once. After a false cut the next cut is tried, then the
chunk is doubled, so every byte is decoded a bounded number of times and a damaged file
fails as fast as it reads.

Nothing grows without bound: an event, or a run of whitespace, longer than
:data:`MAX_EVENT` is refused (a gzip bomb of spaces stops after that many bytes).

The file is opened by :func:`~gpuidle.sources.inputs.open_input`: a local path or a URL,
read the same way, block by block.

The keys around the array (``distributedInfo``, ``deviceProperties``, ...) may come
before or after it; both parts are returned as one header dict.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from typing import Any, BinaryIO, Generic, TypeVar

import msgspec

from gpuidle.errors import CorruptInput, GpuidleError, NotATrace
from gpuidle.sources.inflate import gunzipper, inflate_errors
from gpuidle.sources.inputs import is_url, open_input, opened_size, regular_size

T = TypeVar("T")

READ_BLOCK = 1 << 20
GZIP_FEED = 64 << 10
"""Compressed bytes given to the inflater at a time: some 1.3 MiB of trace JSON, about one output block. Fed a
whole 1 MiB block, it returns 1 MiB at a time and copies the rest of its input each time (``unconsumed_tail``):
half a GiB of copying for a 1 GiB trace."""
CHUNK = 2 << 20
"""The events decoded at a time. Their text and objects are the read's transient memory: at 2 MiB a 26 MiB
trace peaks 11 MiB lower than at 4 MiB, in less CPU time, and a 1 GiB one reads as fast on every core
(at 1 MiB, 7 % slower)."""
MAX_EVENT = 64 << 20
"""The most bytes one event, or one run of whitespace, may take before the file is refused."""
HEADER_LIMIT = 64 << 20
"""How far to look for the ``traceEvents`` key before calling the file not a trace."""

_KEY = b'"traceEvents"'
_WS = b" \t\r\n"
_WS_RUN = re.compile(rb"[ \t\r\n]*")
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")
_generic = msgspec.json.Decoder()
_array = msgspec.json.Decoder(list[msgspec.Raw])
"""Checks a JSON array's syntax without building its elements: where the event list ends is found with it, so
that a decoder which checks nothing (a read on every core hands the chunks on unread) finds it too."""


def _wrap(buf: bytearray, end: int) -> bytes:
    """``[`` + ``buf[:end]`` + ``]`` with a single copy."""
    return b"".join((b"[", memoryview(buf)[:end], b"]"))


AHEAD_BLOCKS = 8
"""Blocks (of up to :data:`READ_BLOCK`) :func:`_ahead` inflates before they are asked for."""


def _ahead(blocks: Generator[bytes, None, None]) -> Generator[bytes, None, None]:
    """``blocks``, made on a thread of their own up to :data:`AHEAD_BLOCKS` ahead: inflating (which holds no GIL)
    runs beside the cutting. An error of the reading or inflating comes out where its block would have; closing
    this generator stops the thread and waits for it."""
    made: queue.Queue[bytes | BaseException | None] = queue.Queue(AHEAD_BLOCKS)
    stop = threading.Event()

    def put(item: bytes | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                made.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def make() -> None:
        try:
            for block in blocks:
                if not put(block):
                    return
            put(None)
        except BaseException as err:  # handed to the consumer, raised there
            put(err)
        finally:
            blocks.close()

    thread = threading.Thread(target=make, name="gpuidle-inflate", daemon=True)
    thread.start()
    try:
        while (item := made.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _error_byte(err: msgspec.DecodeError) -> int | None:
    """Where msgspec found the error, when it says so."""
    m = _ERROR_BYTE.search(str(err))
    return int(m.group(1)) if m else None


def _ws_end(buf: bytearray, at: int) -> int:
    """The index of the first non-whitespace byte at or after ``at`` (``len(buf)`` if none)."""
    m = _WS_RUN.match(buf, at)
    return m.end() if m else at


def _is_truncation(err: msgspec.DecodeError) -> bool:
    return "truncated" in str(err)



class _Cuts:
    """Finds ``},`` + whitespace + ``{`` in a growing buffer, never scanning a byte twice."""

    def __init__(self, at: int) -> None:
        self.reset(at)

    def reset(self, at: int) -> None:
        self._scan = at
        self._brace = -1
        """A ``},`` whose whitespace run reached the end of the buffer; -1: none."""

    def skip_to(self, at: int) -> None:
        if at > self._scan:
            self.reset(at)

    def next(self, buf: bytearray) -> int | None:
        """Index just past the ``}`` of the next boundary, or None until more bytes come."""
        while True:
            if self._brace < 0:
                i = buf.find(b"},", self._scan)
                if i < 0:
                    self._scan = max(self._scan, len(buf) - 1)
                    return None
                self._brace, self._scan = i, i + 2
            j = _ws_end(buf, self._scan)
            if j == len(buf):
                self._scan = j
                return None
            brace, self._brace, self._scan = self._brace, -1, self._brace + 1
            if buf[j] == 0x7B:  # "{"
                return brace + 1


class TraceStream(Generic[T]):
    """Iterate decoded event chunks of one file; then read :attr:`header`.

    :param decode: turns ``b"[ev, ev, ...]"`` into the caller's chunk type; raises
        :class:`msgspec.DecodeError` on bad JSON, :class:`msgspec.ValidationError` on a
        value it cannot hold.
    :param progress: called with (compressed bytes read, file size) after each read.
    :param chunk: the bytes of events decoded at a time (default :data:`CHUNK`).
    :param inflate_ahead: read and inflate the file on a thread of its own, a few blocks ahead of the cutting (for
        a read on every core, where this thread's cutting is what the workers wait for).
    """

    def __init__(
        self,
        path: str,
        decode: Callable[[bytes], T],
        progress: Callable[[int, int], None] | None = None,
        chunk: int | None = None,
        inflate_ahead: bool = False,
    ) -> None:
        self.path = path
        self.header: dict[str, Any] = {}
        self._decode = decode
        self._progress = progress
        self._chunk = chunk
        self._ahead = inflate_ahead
        self._size = 0 if is_url(path) else regular_size(path)  # a FIFO or a device: refused before any read

    # -- raw bytes ---------------------------------------------------------------
    def _raw(self, f: BinaryIO) -> Iterator[bytes]:
        done = 0
        while True:
            try:
                block = f.read(READ_BLOCK)
            except OSError as err:
                raise CorruptInput(f"{self.path}: cannot read ({err.strerror})") from None
            if not block:
                return
            done += len(block)
            if self._progress:
                self._progress(done, self._size)
            yield block

    def _blocks(self, f: BinaryIO) -> Generator[bytes, None, None]:
        """The file's bytes, gunzipped when gzip (any number of members), at most READ_BLOCK at a time."""
        raw = self._raw(f)
        first = next(raw, b"")
        if first[:2] != b"\x1f\x8b":
            if first:
                yield first
            yield from raw
            return
        inflater = gunzipper()
        block, at = first, 0
        try:
            while True:
                if at == len(block):
                    block, at = next(raw, b""), 0
                    if not block:
                        break
                if inflater.eof:  # a multi-member gzip: the next member starts here
                    inflater = gunzipper()
                fed = memoryview(block)[at:at + GZIP_FEED]
                out = inflater.decompress(fed, READ_BLOCK)
                at += len(fed) - (len(inflater.unconsumed_tail) or len(inflater.unused_data))
                if out:
                    yield out
        except inflate_errors() as err:
            raise CorruptInput(
                f"{self.path}: damaged gzip data ({err})", "re-copy or re-export the trace"
            ) from None
        if not inflater.eof:
            raise CorruptInput(
                f"{self.path}: the gzip stream is truncated",
                "the file was cut off while being written or copied; export it again",
            )

    # -- events --------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        with open_input(self.path) as f:
            self._size = opened_size(f)
            blocks = _ahead(self._blocks(f)) if self._ahead else self._blocks(f)
            with closing(blocks):  # before the file closes: the thread reading it ahead has stopped
                yield from self._events(blocks)

    def _events(self, blocks: Iterator[bytes]) -> Iterator[T]:
        buf = self._skip_header(blocks)
        offset = 0  # bytes of the event list already decoded and dropped
        chunk_size = self._chunk or CHUNK
        target, misses = chunk_size, 0
        cuts = _Cuts(target)
        for block in blocks:
            buf += block
            while len(buf) > target:
                cut = cuts.next(buf)
                if cut is None:
                    break
                chunk = self._decode_at(buf, cut, offset)
                if chunk is None:  # the cut was inside an event: try the next one, then twice as far
                    misses += 1
                    target = cut + 1 if misses == 1 else 2 * cut
                    cuts.skip_to(target)
                    continue
                yield chunk
                nxt = buf.find(b"{", cut)
                del buf[:nxt]
                offset += nxt
                target, misses = chunk_size, 0
                cuts.reset(target)
            if len(buf) > chunk_size + MAX_EVENT:
                raise CorruptInput(
                    f"{self.path}: no event ends within {MAX_EVENT >> 20} MiB (from byte {offset} of the "
                    "event list)", "an event, a run of whitespace or an unclosed bracket that large "
                    "is not a profiler trace")
        yield from self._finish(buf, offset)

    def _skip_header(self, blocks: Iterator[bytes]) -> bytearray:
        """Read up to the ``[`` opening the events array; return what follows it."""
        buf = bytearray()
        searched = 0
        for block in blocks:
            buf += block
            start, searched = self._find_events(buf, searched)
            if start is not None:
                del buf[:start]
                return buf
            if len(buf) > HEADER_LIMIT:
                if not _WS_RUN.fullmatch(buf):  # something else than whitespace: say what
                    raise self._not_a_trace(bytes(buf[:4096]))
                raise CorruptInput(f"{self.path}: only whitespace in its first {HEADER_LIMIT >> 20} MiB",
                                   "not a profiler trace: give a PyTorch profiler trace, .json or .json.gz")
        raise self._not_a_trace(bytes(buf))

    def _find_events(self, buf: bytearray, searched: int) -> tuple[int | None, int]:
        """Offset just after the ``[`` that opens the events array once it is in ``buf``, and where
        to search from when more bytes come."""
        lead = bytes(buf[:4096]).lstrip(_WS)[:1]
        if lead == b"[":  # the bare-array form of the Chrome trace format
            return buf.find(b"[") + 1, 0
        if lead and lead != b"{":
            raise CorruptInput(f"{self.path}: not JSON (starts with {bytes(lead)!r})",
                               "give a PyTorch profiler trace, .json or .json.gz")
        key = buf.find(_KEY, searched)
        if key < 0:
            return None, max(0, len(buf) - len(_KEY))
        colon = _ws_end(buf, key + len(_KEY))
        value = _ws_end(buf, colon + 1)
        if value >= len(buf):
            return None, key
        if buf[colon:colon + 1] != b":" or buf[value] != 0x5B:  # "["
            raise NotATrace(f"{self.path}: 'traceEvents' is not an array", "is this a Chrome trace?")
        self._merge_header(bytes(buf[:key]) + b'"traceEvents":null}')
        return value + 1, key

    def _decode_at(self, buf: bytearray, cut: int, offset: int) -> T | None:
        """The events before ``cut``; None when the cut may have fallen inside an event."""
        try:
            return self._decode(_wrap(buf, cut))
        except (msgspec.ValidationError, RecursionError) as err:  # a value, not the cut: the file is bad
            raise self._invalid(err, offset, None) from None
        except msgspec.DecodeError as err:
            at = _error_byte(err)
            if _is_truncation(err) or (at is not None and at >= cut):
                return None
            raise self._invalid(err, offset, at) from None

    def _invalid(self, err: Exception, offset: int, at: int | None) -> GpuidleError:
        """The error for bad bytes in the event list; ``at`` counts the ``[`` added before the chunk."""
        where = f"at byte {offset + at - 1} of the event list" if at is not None else \
            f"in the event list after byte {offset}"
        if isinstance(err, RecursionError):
            return CorruptInput(f"{self.path}: JSON nested too deeply {where}",
                                "a profiler trace nests a few levels; the file is damaged or not a trace")
        reason = str(err).removeprefix("JSON is malformed: ")
        reason = _ERROR_BYTE.sub("", reason).strip()
        return CorruptInput(f"{self.path}: invalid JSON {where} ({reason})", "the file is damaged or truncated")

    def _finish(self, buf: bytearray, offset: int) -> Iterator[T]:
        """Decode the last chunk: find the ``]`` closing the array and the header tail.

        Usually the last ``]`` closes the array; if not (a ``]`` in a key after it, bad bytes), the rest is read as
        an array, which stops where the event list ends. Both are judged by the array's syntax before the
        caller's decoder sees the chunk.
        """
        close = buf.rfind(b"]")
        if close >= 0:
            tail = self._tail(bytes(buf[close + 1:]).strip(_WS))
            if tail is not None:
                text = _wrap(buf, close)
                try:
                    _array.decode(text)
                    last = self._decode(text)
                except (msgspec.ValidationError, RecursionError) as err:
                    raise self._invalid(err, offset, None) from None
                except msgspec.DecodeError:
                    pass  # that "]" was not the array's end
                else:
                    self.header.update(tail)
                    yield last
                    return
        try:
            text = b"".join((b"[", buf))  # a bare-array trace: the array is the rest
            _array.decode(text)
            whole = self._decode(text)
        except (msgspec.ValidationError, RecursionError) as err:
            raise self._invalid(err, offset, None) from None
        except msgspec.DecodeError as err:
            at = _error_byte(err)
            if _is_truncation(err):
                raise CorruptInput(f"{self.path}: the trace ends before its event list is closed",
                                   "the file is truncated; export it again") from None
            if at is None or "trailing characters" not in str(err):
                raise self._invalid(err, offset, at) from None
            close = buf.rfind(b"]", 0, at - 2)  # buf[at - 2] is the first character after the array
        else:
            yield whole
            return
        tail = self._tail(bytes(buf[close + 1:]).strip(_WS))
        if tail is None:
            raise CorruptInput(f"{self.path}: invalid JSON after the event list",
                               "the file is damaged or truncated")
        try:
            last = self._decode(_wrap(buf, close))
        except (msgspec.DecodeError, RecursionError) as err:
            raise self._invalid(err, offset, None) from None
        self.header.update(tail)
        yield last

    @staticmethod
    def _tail(tail: bytes) -> dict[str, Any] | None:
        """The keys after the events array, or None if ``tail`` cannot be that."""
        if tail in (b"", b"}"):
            return {}
        if not (tail.startswith(b",") and tail.endswith(b"}")):
            return None
        try:
            obj = _generic.decode(b"{" + tail[1:])
        except (msgspec.DecodeError, RecursionError):
            return None
        return obj if isinstance(obj, dict) else None

    def _merge_header(self, text: bytes) -> None:
        try:
            obj = _generic.decode(text)
        except msgspec.DecodeError as err:
            raise CorruptInput(f"{self.path}: invalid JSON before the event list ({err})") from None
        except RecursionError:
            raise CorruptInput(f"{self.path}: JSON nested too deeply before the event list") from None
        if not isinstance(obj, dict):
            raise NotATrace(f"{self.path}: the top level is not a JSON object")
        obj.pop("traceEvents", None)
        self.header.update(obj)

    def _not_a_trace(self, head: bytes) -> GpuidleError:
        if not head.strip(_WS):
            return CorruptInput(f"{self.path}: the file is empty", "the profiler did not finish writing it")
        try:
            obj = _generic.decode(head)
        except (msgspec.DecodeError, RecursionError):
            if len(head) < HEADER_LIMIT:
                return CorruptInput(f"{self.path}: not valid JSON",
                                    "give a PyTorch profiler trace, .json or .json.gz")
            obj = None
        if isinstance(obj, dict) and "nodes" in obj and "schema" in obj:
            return NotATrace(
                f"{self.path}: this is a PyTorch execution trace (a graph of nodes), not a profiler trace",
                "export with torch.profiler.profile(...).export_chrome_trace() or tensorboard_trace_handler",
            )
        return NotATrace(f"{self.path}: JSON without 'traceEvents'",
                         "give a PyTorch profiler (Kineto) Chrome trace")
