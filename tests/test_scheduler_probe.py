"""An address that is not a Dask scheduler is refused in one line within 10 s, never waited on.

The servers are real and local (127.0.0.1): an HTTP server (what listens on a dashboard's port), a TCP server
that greets with bytes that are not Dask's framing (which Dask read as a frame of 3.07 EiB), and one that
closes at once. A real scheduler passes the same look (``tests/test_cluster.py``).
"""

from __future__ import annotations

import http.server
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from conftest import DATA
from gpuidle.jobs.probe import HANDSHAKE_S, not_a_scheduler

PROMISED_S = 10.0


@contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"tcp://{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def http_server() -> socketserver.BaseServer:
    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)


def greeting_server(greet: Callable[[socket.socket], None]) -> socketserver.BaseServer:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            greet(self.request)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def garbage(sock: socket.socket) -> None:
    sock.sendall(b"SSH-2.0-OpenSSH_9.6\r\n" + bytes(range(256)))
    time.sleep(2)


def hang_up(sock: socket.socket) -> None:
    sock.close()


@pytest.mark.parametrize(("make", "said"), [
    (http_server, f"not a Dask scheduler: no handshake within {HANDSHAKE_S:g} s"),
    (lambda: greeting_server(garbage), "something other than Dask's protocol (b'SSH-2.0"),
    (lambda: greeting_server(hang_up), "closed the connection without a Dask handshake"),
], ids=["http", "garbage", "hang-up"])
def test_what_is_not_a_scheduler_is_told_in_time(make: Callable[[], socketserver.BaseServer], said: str) -> None:
    with serving(make()) as address:
        start = time.monotonic()
        why = not_a_scheduler(address)
        took = time.monotonic() - start
    assert why is not None
    assert said in why, why
    assert took < PROMISED_S


def test_an_http_server_on_the_command_line_is_one_line_and_exit_2() -> None:
    pytest.importorskip("distributed")
    with serving(http_server()) as address:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", "--no-ledger", "--scheduler", address,
                               str(DATA / "trace_compare__base__base.json.gz")], capture_output=True, text=True,
                              timeout=60)
        took = time.monotonic() - start
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"gpuidle: error: cannot reach the Dask scheduler at {address}: not a Dask scheduler")
    assert took < PROMISED_S
