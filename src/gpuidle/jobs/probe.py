"""The first look at a Dask scheduler's address, before Dask's client connects: is a scheduler there?

Dask's client trusts what answers: a refused port is retried until its timeout, an HTTP server (the
dashboard's port) is waited on without end, and bytes that are not Dask's framing are read as a frame's
length (``Unable to allocate 3.07 EiB``). A scheduler speaks first: as soon as a connection is accepted it
writes its handshake, one framed message (an 8-byte length, then the frames: a msgpack map naming its
``compression`` and ``pickle-protocol``). The look connects (:data:`CONNECT_S` at most) and reads that
handshake with a deadline (:data:`HANDSHAKE_S`); anything else is said in one line, so a wrong address is
refused within 10 s.
"""

from __future__ import annotations

import socket
import struct
import time

CONNECT_S = 1.0
"""How long the connection may take before Dask's own connection (and timeout) takes over: a host that does not
answer at once may be far, not wrong."""
HANDSHAKE_S = 5.0
"""How long a scheduler may take to send its handshake once connected."""
MAX_HANDSHAKE_BYTES = 1 << 16
"""A handshake is a few hundred bytes; a length beyond this is not Dask's framing."""
_MARKS = (b"compression", b"pickle-protocol")
"""Keys of every scheduler's handshake (``distributed.comm.Comm.handshake_info``), as msgpack writes them."""


def not_a_scheduler(address: str) -> str | None:
    """Why no Dask scheduler answers at a TCP address (``tcp://``, or a bare host:port), in words; None where one
    does, the host does not answer at once (Dask's own timeout then applies), or the address is of another kind
    (``tls://``: its handshake is encrypted)."""
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp"):
        return None
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None
    try:
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_S)
    except ConnectionRefusedError:
        return "connection refused (nothing listens there)"
    except socket.gaierror as err:
        return f"unknown host {host!r} ({err.strerror})"
    except OSError:  # unreachable or slow: Dask's own timeout and message
        return None
    with sock:
        return _handshake(sock, time.monotonic() + HANDSHAKE_S)


def _handshake(sock: socket.socket, deadline: float) -> str | None:
    """None where the peer's first message is a Dask handshake; else what it sent instead."""
    try:
        head = _read(sock, 8, deadline)
        if head is None or len(head) < 8:
            return _said(head, "closed the connection without a Dask handshake")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_HANDSHAKE_BYTES:
            return _said(head + _peek(sock), "answered with something other than Dask's protocol")
        body = _read(sock, size, deadline)
    except TimeoutError:
        return (f"not a Dask scheduler: no handshake within {HANDSHAKE_S:g} s (a scheduler listens on 8786 by "
                f"default; 8787 is its dashboard)")
    except OSError as err:
        return f"the connection failed during the handshake ({err.strerror or type(err).__name__})"
    if body is None or len(body) < size or not all(mark in body for mark in _MARKS):
        return _said(head + (body or b""), "answered with something other than a Dask handshake")
    return None


def _read(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    """``n`` bytes, fewer where the peer closes first, None where it sent nothing; TimeoutError at ``deadline``."""
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(min(n - len(out), 1 << 16))
        if not chunk:
            break
        out += chunk
    return bytes(out) if out else None


def _peek(sock: socket.socket) -> bytes:
    """What else is already waiting, without waiting for more: the rest of a garbage greeting's first line."""
    sock.setblocking(False)
    try:
        return sock.recv(56)
    except OSError:
        return b""


def _said(data: bytes | None, what: str) -> str:
    if not data:
        return f"not a Dask scheduler: it {what}"
    return f"not a Dask scheduler: it {what} ({data[:24]!r})"
