"""The cluster as users run it: ``dask scheduler`` and ``dask worker`` started from the command line with the
CLI pointed at them, and traces in S3 (the local moto server) read by the workers themselves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA
from gpuidle import api
from remote_servers import S3Server, free_port, s3_server

distributed = pytest.importorskip("distributed")
s3fs = pytest.importorskip("s3fs")

PAIR = [DATA / f"trace_filter__sampled_rank-{r}.json.gz" for r in (0, 1)]
ALEXNET = DATA / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
BUCKET = "cluster-traces"


def _start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A scheduler and two single-thread workers, each its own ``dask`` command."""
    address = f"tcp://127.0.0.1:{free_port()}"
    started = [_start("scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1], "--no-dashboard")]
    try:
        started += [_start("worker", address, "--nthreads", "1", "--no-dashboard", "--name", f"w{i}")
                    for i in range(2)]
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for proc in reversed(started):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


def _gpuidle(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuidle", "analyze", "--no-ledger", *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, **env))


def test_cli_on_dask_command_line_cluster(scheduler: str, tmp_path: Path) -> None:
    for f in PAIR:
        shutil.copy(f, tmp_path)
    local = _gpuidle("--json", str(tmp_path))
    remote = _gpuidle("--json", "--scheduler", scheduler, str(tmp_path))
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    assert remote.stderr == ""


def test_scheduler_from_dask_environment_variable(scheduler: str, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for f in PAIR:
        shutil.copy(f, tmp_path / "a")
    shutil.copy(ALEXNET, tmp_path / "b")
    local = _gpuidle("--json", str(tmp_path))
    remote = _gpuidle("--json", str(tmp_path), DASK_SCHEDULER_ADDRESS=scheduler)
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    assert [j["name"] for j in json.loads(remote.stdout)["jobs"]] == ["a", "b"]


def test_scheduler_from_dask_config_file(tmp_path: Path) -> None:
    """``scheduler-address`` in a Dask config file is used: here it names a closed port, so the run says so."""
    config = tmp_path / "dask"
    config.mkdir()
    address = f"tcp://127.0.0.1:{free_port()}"
    (config / "gpuidle.yaml").write_text(f"scheduler-address: {address}\n")
    proc = _gpuidle(str(PAIR[0]), DASK_CONFIG=str(config))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert f"cannot reach the Dask scheduler at {address}" in line


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        client: Any = server.client()
        client.create_bucket(Bucket=BUCKET)
        for f in PAIR:
            client.put_object(Bucket=BUCKET, Key=f"job/{f.name}", Body=f.read_bytes())
            client.put_object(Bucket=BUCKET, Key=f"jobs/ddp/{f.name}", Body=f.read_bytes())
        client.put_object(Bucket=BUCKET, Key=f"jobs/alexnet/{ALEXNET.name}", Body=ALEXNET.read_bytes())
        client.put_object(Bucket=BUCKET, Key="jobs/alexnet/rank1.json", Body=b"not a trace")
        yield server


@pytest.fixture
def s3_cluster(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """Workers started with the bucket's endpoint and reader's credentials in their environment."""
    for name in [k for k in os.environ if k.startswith(("AWS_", "FSSPEC_"))]:
        monkeypatch.delenv(name)
    for name, value in {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                        "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": s3.endpoint,
                        "AWS_ACCESS_KEY_ID": s3.reader[0], "AWS_SECRET_ACCESS_KEY": s3.reader[1]}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        yield cluster.scheduler_address
    s3fs.S3FileSystem.clear_instance_cache()


def test_workers_read_s3(s3_cluster: str) -> None:
    url = f"s3://{BUCKET}/job/"
    remote = api.analyze([url], scheduler=s3_cluster)
    assert [r.path for r in remote.ranks] == [f"s3://{BUCKET}/job/{f.name}" for f in PAIR]
    assert remote.to_json() == api.analyze([url]).to_json()


def test_fleet_of_s3_prefixes_on_the_cluster(s3_cluster: str) -> None:
    url = f"s3://{BUCKET}/jobs/"
    remote = api.analyze_jobs([url], scheduler=s3_cluster)
    assert remote.fleet
    assert [j.name for j in remote.results] == ["alexnet", "ddp"]
    alexnet = remote.results[0].report
    assert alexnet is not None
    (skipped,) = alexnet.source.skipped
    assert "rank1.json" in skipped
    local = api.analyze_jobs([url])
    assert api.fleet_report(remote.results, [url]).to_json() == api.fleet_report(local.results, [url]).to_json()
