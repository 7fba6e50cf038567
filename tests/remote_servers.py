"""Servers on localhost for the remote-input tests: moto's S3 (with IAM checks on) and a plain HTTP server.

Nothing leaves the machine: both bind 127.0.0.1 on a free port and stop with the test session.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SETUP_ACTIONS = 5
"""IAM calls made before moto starts checking credentials: two users, a policy, two keys."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    reader: tuple[str, str]
    """Access key id and secret of a user allowed to read (and, for the set-up, write) every bucket."""
    outsider: tuple[str, str]
    """Valid credentials without any permission."""

    def client(self) -> object:
        import boto3

        key, secret = self.reader
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=key, aws_secret_access_key=secret)


def _wait_for(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """moto's standalone server, checking credentials and IAM policies after the set-up calls."""
    import boto3

    port = free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(SETUP_ACTIONS))
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="reader")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(policy))
        reader = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.create_user(UserName="outsider")
        outsider = iam.create_access_key(UserName="outsider")["AccessKey"]
        yield S3Server(endpoint, (reader["AccessKeyId"], reader["SecretAccessKey"]),
                       (outsider["AccessKeyId"], outsider["SecretAccessKey"]))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def http_server(root: Path) -> Iterator[str]:
    """Python's own HTTP server (no range requests, HTML folder listings) over ``root``; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
