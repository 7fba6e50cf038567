"""Stream the ``traceEvents`` array of a Chrome-trace JSON file in bounded chunks.

A trace can be gigabytes once decompressed. Decoding it whole would hold the text
*and* every decoded event at once; instead the file is gunzipped as a stream and the
events array is cut into chunks of a few MiB at ``},`` + ``{`` boundaries. Each
chunk is decoded by the caller's typed decoder. A cut that fell inside an event
(a ``},{`` inside a string or a nested object) makes the chunk invalid JSON, so the
chunk is grown to the next cut and decoded again: the cuts are cheap guesses that
are always verified by the decoder.

The file is opened by :func:`~gpuidle.sources.inputs.open_input`: a local path or a URL,
read the same way, block by block.

The keys around the array (``distributedInfo``, ``deviceProperties``, ...) may come
before or after it; both parts are returned as one header dict.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Generic, TypeVar

import msgspec

from gpuidle.errors import CorruptInput, NotATrace
from gpuidle.sources.inputs import open_input, opened_size

T = TypeVar("T")

READ_BLOCK = 1 << 20
CHUNK = 4 << 20
HEADER_LIMIT = 256 << 20
"""How far to look for the ``traceEvents`` key before calling the file not a trace."""

_KEY = b'"traceEvents"'
_WS = b" \t\r\n"
_generic = msgspec.json.Decoder()


def _wrap(buf: bytearray, end: int) -> bytes:
    """``[`` + ``buf[:end]`` + ``]`` with a single copy."""
    return b"".join((b"[", memoryview(buf)[:end], b"]"))


class TraceStream(Generic[T]):
    """Iterate decoded event chunks of one file; then read :attr:`header`.

    :param decode: turns ``b"[ev, ev, ...]"`` into the caller's chunk type and raises
        :class:`msgspec.DecodeError` (or ``ValidationError``) on bad input.
    :param progress: called with (compressed bytes read, file size) after each read.
    """

    def __init__(
        self,
        path: str,
        decode: Callable[[bytes], T],
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = path
        self.header: dict[str, Any] = {}
        self._decode = decode
        self._progress = progress
        self._size = 0

    # -- raw bytes ---------------------------------------------------------------
    def _raw(self, f: BinaryIO) -> Iterator[bytes]:
        done = 0
        while block := f.read(READ_BLOCK):
            done += len(block)
            if self._progress:
                self._progress(done, self._size)
            yield block

    def _blocks(self, f: BinaryIO) -> Iterator[bytes]:
        """The file's bytes, gunzipped when gzip (any number of members), at most READ_BLOCK at a time."""
        raw = self._raw(f)
        first = next(raw, b"")
        if first[:2] != b"\x1f\x8b":
            if first:
                yield first
            yield from raw
            return
        inflater = zlib.decompressobj(wbits=31)
        pending = first
        try:
            while True:
                if not pending:
                    pending = next(raw, b"")
                    if not pending:
                        break
                if inflater.eof:  # a multi-member gzip: the next member starts here
                    inflater = zlib.decompressobj(wbits=31)
                out = inflater.decompress(pending, READ_BLOCK)
                pending = inflater.unconsumed_tail or inflater.unused_data
                if out:
                    yield out
        except zlib.error as err:
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
            blocks = self._blocks(f)
            buf = bytearray()
            for block in blocks:
                buf += block
                start = self._find_events(buf)
                if start is not None:
                    break
                if len(buf) > HEADER_LIMIT:
                    raise self._not_a_trace(bytes(buf[:4096]))
            else:
                raise self._not_a_trace(bytes(buf))
            del buf[:start]
            for block in blocks:
                buf += block
                while len(buf) > CHUNK:
                    cut = self._cut(buf, CHUNK)
                    if cut is None:
                        break
                    chunk = self._try_decode(buf, cut)
                    if chunk is None:  # the cut was inside an event: grow
                        grown = self._cut(buf, cut + 1)
                        while grown is not None:
                            chunk = self._try_decode(buf, grown)
                            if chunk is not None:
                                cut = grown
                                break
                            grown = self._cut(buf, grown + 1)
                        if chunk is None:
                            break  # wait for more bytes
                    yield chunk
                    nxt = buf.find(b"{", cut)
                    del buf[:nxt]
            yield from self._finish(buf)

    def _find_events(self, buf: bytearray) -> int | None:
        """Offset just after the ``[`` that opens the events array, once it is in ``buf``."""
        lead = bytes(buf[:4096]).lstrip(_WS)[:1]
        if lead == b"[":  # the bare-array form of the Chrome trace format
            return buf.find(b"[") + 1
        if lead and lead != b"{":
            raise CorruptInput(f"{self.path}: not JSON (starts with {bytes(lead)!r})",
                               "give a PyTorch profiler trace, .json or .json.gz")
        key = buf.find(_KEY)
        if key < 0:
            return None
        bracket = buf.find(b"[", key + len(_KEY))
        if bracket < 0:
            return None
        between = bytes(buf[key + len(_KEY):bracket]).strip(_WS)
        if between != b":":
            raise NotATrace(f"{self.path}: 'traceEvents' is not an array", "is this a Chrome trace?")
        self._merge_header(bytes(buf[:key]) + b'"traceEvents":null}')
        return bracket + 1

    @staticmethod
    def _cut(buf: bytearray, at: int) -> int | None:
        """Index just past a ``}`` that is followed by ``,`` and ``{``, at or after ``at``."""
        while True:
            i = buf.find(b"},", at)
            if i < 0:
                return None
            j = i + 2
            while j < len(buf) and buf[j] in _WS:
                j += 1
            if j < len(buf) and buf[j] == 0x7B:  # "{"
                return i + 1
            if j >= len(buf):
                return None
            at = i + 1

    def _try_decode(self, buf: bytearray, cut: int) -> T | None:
        try:
            return self._decode(_wrap(buf, cut))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def _finish(self, buf: bytearray) -> Iterator[T]:
        """Decode the last chunk: find the ``]`` closing the array and the header tail.

        Candidates are tried from the right; a ``]`` inside a key that follows the
        array leaves a tail that is not an object, or events that do not decode.
        """
        end = len(buf)
        last_error: Exception | None = None
        while True:
            close = buf.rfind(b"]", 0, end)
            if close < 0:
                if last_error is not None:
                    raise CorruptInput(f"{self.path}: invalid JSON in the event list ({last_error})",
                                       "the file is damaged or truncated")
                raise CorruptInput(
                    f"{self.path}: the trace ends before its event list is closed",
                    "the file is truncated; export it again",
                )
            end = close
            tail = self._tail(bytes(buf[close + 1:]).strip(_WS))
            if tail is None:
                continue
            try:
                last = self._decode(_wrap(buf, close))
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                last_error = err
                continue
            self.header.update(tail)
            yield last
            return

    @staticmethod
    def _tail(tail: bytes) -> dict[str, Any] | None:
        """The keys after the events array, or None if ``tail`` cannot be that."""
        if tail in (b"", b"}"):
            return {}
        if not (tail.startswith(b",") and tail.endswith(b"}")):
            return None
        try:
            obj = _generic.decode(b"{" + tail[1:])
        except msgspec.DecodeError:
            return None
        return obj if isinstance(obj, dict) else None

    def _merge_header(self, text: bytes) -> None:
        try:
            obj = _generic.decode(text)
        except msgspec.DecodeError as err:
            raise CorruptInput(f"{self.path}: invalid JSON before the event list ({err})") from None
        if not isinstance(obj, dict):
            raise NotATrace(f"{self.path}: the top level is not a JSON object")
        obj.pop("traceEvents", None)
        self.header.update(obj)

    def _not_a_trace(self, head: bytes) -> Exception:
        if not head.strip(_WS):
            return CorruptInput(f"{self.path}: the file is empty", "the profiler did not finish writing it")
        try:
            obj = _generic.decode(head)
        except msgspec.DecodeError:
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
