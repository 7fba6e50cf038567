"""Remote inputs for real: an S3-compatible server (moto, with IAM checks) and a plain HTTP server, on localhost.

The remote analysis must equal the local one byte for byte apart from the paths; the reader
must stream (bounded reads and ranged fetches, never the whole object); every failure is one line.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conftest import DATA

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")
pytest.importorskip("s3fs")
pytest.importorskip("boto3")
pytest.importorskip("moto.server")

import fsspec
import s3fs

from gpuidle import api
from gpuidle.sources import inputs
from gpuidle.sources.jsonstream import READ_BLOCK
from remote_servers import S3Server, http_server, s3_server

BUCKET = "traces"
RANKS = {f"rank{r}.json.gz": f"trace_filter__sampled_rank-{r}.json.gz" for r in (0, 1)}
BIG = DATA / "negative_queue_length_values_check__rank0.json.gz"
SMI = DATA / "smi" / "query_gpu_units.csv"


def _layout(big: bytes) -> dict[str, bytes]:
    """The objects uploaded, by key; the same tree is written locally for the reference analyses."""
    files = {f"job/{name}": (DATA / src).read_bytes() for name, src in RANKS.items()}
    files["job/README.txt"] = b"not a trace"
    files["job/older/rank9.json.gz"] = (DATA / RANKS["rank0.json.gz"]).read_bytes()  # a sub-folder: not listed
    files["big/rank0.json"] = big
    files["logs/smi.csv"] = SMI.read_bytes()
    files["bad/cut.json.gz"] = (DATA / RANKS["rank0.json.gz"]).read_bytes()[:5000]
    return files


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("remote-mirror")
    for key, body in _layout(gzip.decompress(BIG.read_bytes())).items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body)
    return root


@pytest.fixture(scope="module")
def s3(local: Path) -> Iterator[S3Server]:
    with s3_server() as server:
        client: Any = server.client()
        client.create_bucket(Bucket=BUCKET)
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            client.put_object(Bucket=BUCKET, Key=f.relative_to(local).as_posix(), Body=f.read_bytes())
        yield server


def _isolated_env(env: dict[str, str], tmp: Path) -> None:
    """No credentials or endpoint from this machine's own AWS set-up."""
    for name in [k for k in env if k.startswith(("AWS_", "FSSPEC_"))]:
        del env[name]
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp / "none"), AWS_CONFIG_FILE=str(tmp / "none"),
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1")


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Server:
    """This process reads the test bucket as the reader: botocore's own endpoint variable, fresh filesystems."""
    env: dict[str, str] = {}
    _isolated_env(env, tmp_path)
    for name in [k for k in os.environ if k.startswith(("AWS_", "FSSPEC_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.reader[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.reader[1])
    s3fs.S3FileSystem.clear_instance_cache()
    return s3


def _normalised(report: Any, prefix: str) -> str:
    return msgspec.json.encode(report).decode().replace(prefix, "<job>/")


# -- the same analysis as from a local folder ----------------------------------------------------------


def test_s3_job_folder_equals_local(s3_env: S3Server, local: Path) -> None:
    remote = api.analyze([f"s3://{BUCKET}/job/"], workers=2)  # one worker process per rank
    here = api.analyze([f"{local}/job/"], workers=2)
    assert [r.path for r in remote.ranks] == [f"s3://{BUCKET}/job/rank0.json.gz", f"s3://{BUCKET}/job/rank1.json.gz"]
    assert remote.job is not None
    assert _normalised(remote, f"s3://{BUCKET}/job/") == _normalised(here, f"{local}/job/")


def test_http_folder_and_file_equal_local(local: Path) -> None:
    with http_server(local) as url:
        folder = api.analyze([f"{url}/job/"], workers=2)
        single = api.analyze([f"{url}/job/rank1.json.gz"])
    assert [r.path for r in folder.ranks] == [f"{url}/job/rank0.json.gz", f"{url}/job/rank1.json.gz"]
    assert _normalised(folder, f"{url}/job/") == _normalised(api.analyze([f"{local}/job/"], workers=2),
                                                              f"{local}/job/")
    assert _normalised(single, f"{url}/job/") == _normalised(api.analyze([f"{local}/job/rank1.json.gz"]),
                                                              f"{local}/job/")


# -- streaming: bounded reads, each byte fetched once -------------------------------------------------


def test_s3_trace_is_streamed_in_bounded_blocks(s3_env: S3Server, local: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    fetches: list[tuple[int, int]] = []
    read, fetch = fsspec.spec.AbstractBufferedFile.read, s3fs.core.S3File._fetch_range

    def counted_read(self: Any, length: int = -1) -> bytes:
        reads.append(length)
        return read(self, length)  # type: ignore[no-any-return]

    def counted_fetch(self: Any, start: int, end: int) -> bytes:
        fetches.append((start, end))
        return fetch(self, start, end)  # type: ignore[no-any-return]

    monkeypatch.setattr(fsspec.spec.AbstractBufferedFile, "read", counted_read)
    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counted_fetch)
    monkeypatch.setattr(inputs, "READ_AHEAD", 2 << 20)  # a trace many times the read-ahead, kept small here
    remote = api.analyze([f"s3://{BUCKET}/big/rank0.json"])
    size = (local / "big" / "rank0.json").stat().st_size
    assert size > 8 * (READ_BLOCK + inputs.READ_AHEAD)  # big enough for a whole-object read to show
    assert len(reads) > size // READ_BLOCK
    assert all(0 < n <= READ_BLOCK for n in reads)  # the reader never asks for everything
    assert max(end - start for start, end in fetches) <= READ_BLOCK + inputs.READ_AHEAD
    assert sum(end - start for start, end in fetches) == size  # each byte fetched once, in order
    assert [s for s, _ in fetches] == sorted(s for s, _ in fetches)
    assert _normalised(remote, f"s3://{BUCKET}/big/") == _normalised(api.analyze([f"{local}/big/rank0.json"]),
                                                                      f"{local}/big/")


# -- summarize and compare read URLs too -------------------------------------------------------------


def test_summarize_and_compare_read_urls(s3_env: S3Server, local: Path, tmp_path: Path) -> None:
    remote = api.summarize_log(f"s3://{BUCKET}/logs/smi.csv")
    assert _normalised(remote, f"s3://{BUCKET}/logs/") == _normalised(api.summarize_log(f"{local}/logs/smi.csv"),
                                                                       f"{local}/logs/")
    client: Any = s3_env.client()
    for name, src in RANKS.items():
        report = api.analyze([str(DATA / src)])
        client.put_object(Bucket=BUCKET, Key=f"reports/{name}.json", Body=msgspec.json.encode(report))
        (tmp_path / f"{name}.json").write_bytes(msgspec.json.encode(report))
    a, b = (f"reports/{name}.json" for name in RANKS)
    remote_cmp = api.compare_runs(f"s3://{BUCKET}/{a}", f"s3://{BUCKET}/{b}")
    local_cmp = api.compare_runs(str(tmp_path / Path(a).name), str(tmp_path / Path(b).name))
    assert _normalised(remote_cmp, f"s3://{BUCKET}/reports/") == _normalised(local_cmp, f"{tmp_path}/")


# -- the command line: the ledger keeps URL, size and ETag; credentials go nowhere --------------------


def gpuidle(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuidle", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def _cli_env(s3: S3Server, tmp: Path, key: tuple[str, str] | None) -> dict[str, str]:
    """The endpoint through fsspec's own variable (read when fsspec is imported)."""
    env = dict(os.environ)
    _isolated_env(env, tmp)
    env["FSSPEC_S3_ENDPOINT_URL"] = s3.endpoint
    if key is not None:
        env.update(AWS_ACCESS_KEY_ID=key[0], AWS_SECRET_ACCESS_KEY=key[1])
    return env


def test_cli_records_url_size_and_etag_and_leaves_objects_alone(s3: S3Server, local: Path, tmp_path: Path,
                                                                 private_ledger: Path) -> None:
    env = _cli_env(s3, tmp_path, s3.reader)
    proc = gpuidle(env, "analyze", f"s3://{BUCKET}/job/", "--json", "--label", "remote")
    assert proc.returncode == 0, proc.stderr
    assert [r["path"] for r in msgspec.json.decode(proc.stdout)["ranks"]] == [
        f"s3://{BUCKET}/job/{name}" for name in RANKS]
    db = sqlite3.connect(private_ledger)
    rows = db.execute("SELECT path, size, sha256, etag FROM inputs ORDER BY rowid").fetchall()
    expected = [(f"s3://{BUCKET}/job/{name}", (local / "job" / name).stat().st_size, None,
                 hashlib.md5((local / "job" / name).read_bytes()).hexdigest()) for name in RANKS]
    assert rows == expected  # a single-part upload's ETag is the MD5 of its bytes
    ledger_bytes = b"".join(p.read_bytes() for p in private_ledger.parent.iterdir() if p.is_file())
    for secret in s3.reader:
        assert secret.encode() not in ledger_bytes
        assert secret not in proc.stdout + proc.stderr
    client: Any = s3.client()
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="job/")["Contents"]
    assert {o["Key"]: o["ETag"].strip('"') for o in listed} == {
        k: hashlib.md5(v).hexdigest() for k, v in _layout(b"").items() if k.startswith("job/")}


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuidle: error: ")
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("who", "command", "url", "needles"), [
    ("reader", "analyze", f"s3://no-such-bucket-{BUCKET}/job/", ["no such bucket"]),
    ("reader", "analyze", f"s3://{BUCKET}/job/rank7.json.gz", ["no such object", "check the URL"]),
    ("reader", "analyze", f"s3://{BUCKET}/logs/", ["no trace files"]),
    ("reader", "analyze", f"s3://{BUCKET}/bad/cut.json.gz", ["truncated"]),
    ("reader", "analyze", f"s3://{BUCKET}/logs/smi.csv", ["not JSON"]),
    ("reader", "summarize", f"s3://{BUCKET}/logs", ["is a folder"]),
    ("outsider", "analyze", f"s3://{BUCKET}/job/", ["access denied", "AWS_ACCESS_KEY_ID"]),
    ("outsider", "summarize", f"s3://{BUCKET}/logs/smi.csv", ["access denied"]),
    ("bogus", "analyze", f"s3://{BUCKET}/job/", ["access denied"]),
    ("nobody", "analyze", f"s3://{BUCKET}/job/", ["no credentials found for s3://", "AWS_ACCESS_KEY_ID"]),
])
def test_s3_errors_are_one_line(s3: S3Server, tmp_path: Path, who: str, command: str, url: str,
                                needles: list[str]) -> None:
    key = {"reader": s3.reader, "outsider": s3.outsider, "bogus": ("AKIAEXAMPLEEXAMPLE00", "not-the-secret-at-all"),
           "nobody": None}[who]
    proc = gpuidle(_cli_env(s3, tmp_path, key), command, url)
    line = assert_one_line_error(proc, *needles)
    if key is not None:
        assert key[1] not in proc.stdout + proc.stderr
    assert url.split("/")[2] in line


def test_unknown_scheme_and_missing_filesystem_are_one_line(tmp_path: Path) -> None:
    env = dict(os.environ)
    assert_one_line_error(gpuidle(env, "analyze", "nosuch://bucket/trace.json"), "unknown URL scheme nosuch://")
    try:
        import adlfs  # noqa: F401
    except ImportError:
        assert_one_line_error(gpuidle(env, "analyze", "az://container/trace.json"), "not installed",
                              "pip install adlfs")


def test_http_errors_are_one_line(local: Path) -> None:
    env = dict(os.environ)
    with http_server(local) as url:
        assert_one_line_error(gpuidle(env, "analyze", f"{url}/job/rank7.json.gz"), "no such object")
        assert_one_line_error(gpuidle(env, "summarize", f"{url}/logs/none.csv"), "no such object")
        assert_one_line_error(gpuidle(env, "summarize", f"{url}/logs/"), "is a folder", "give one log file")
    # the server is gone: nothing listens on its port any more
    assert_one_line_error(gpuidle(env, "analyze", f"{url}/job/rank0.json.gz?X-Amz-Signature=secret"),
                          "cannot reach the server")
    proc = gpuidle(env, "analyze", f"{url}/job/rank0.json.gz?X-Amz-Signature=secret")
    assert "secret" not in proc.stderr


def test_urls_are_told_from_paths() -> None:
    assert [inputs.is_url(u) for u in ("s3://b/k", "simplecache::s3://b/k", "file:///x", "hf://datasets/a/b")] == [
        True] * 4
    assert [inputs.is_url(p) for p in ("run/traces", "/abs/s3://x", Path("a"), "C:\\traces")] == [False] * 4
    assert inputs.display("https://user:pw@host:8080/a/b.json?X-Amz-Signature=abc") == "https://host:8080/a/b.json"

