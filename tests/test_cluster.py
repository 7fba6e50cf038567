"""The per-rank work on a real Dask cluster: process workers of ``distributed.LocalCluster``, a scheduler and
workers started from the command line, and traces in S3 read by the workers.

The report from the cluster must equal the local pool's, byte for byte: one per-rank function, one merge.
Faults are real too: a worker process killed during a run, and a trace whose task kills every worker that
runs it.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.cli import main
from gpuidle.errors import GpuidleError
from gpuidle.jobs.cluster import DaskCluster
from gpuidle.jobs.executors import LocalPool
from gpuidle.jobs.rank import analyze_file
from remote_servers import free_port

distributed = pytest.importorskip("distributed")
import cloudpickle  # noqa: E402  (distributed's own dependency)
import dask  # noqa: E402
from distributed.diagnostics.plugin import WorkerPlugin  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the plugins below travel to the workers

PAIR = [DATA / f"trace_filter__sampled_rank-{r}.json.gz" for r in (0, 1)]
ALEXNET = DATA / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"


def _cluster(**kwargs: Any) -> Any:
    return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                    **kwargs)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), _cluster() as c:
        yield c


@pytest.fixture
def job(tmp_path: Path) -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    for f in PAIR:
        shutil.copy(f, folder)
    return folder


def test_cluster_report_equals_local(cluster: Any, job: Path) -> None:
    local = api.analyze([job])
    remote = api.analyze([job], scheduler=cluster.scheduler_address)
    assert remote.to_json() == local.to_json()
    assert [r.rank for r in remote.ranks] == [0, 1]


def test_html_and_annotate_read_no_rank_again_on_the_client(cluster: Any, job: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's timeline (the HTML page, the annotated trace) comes from the results the cluster returned:
    the client analyses no rank again, and reads only the trace of the rank it draws."""
    local = api.analyze_jobs([job]).results[0]
    expected = api.timeline_for(local.report)  # without the results: every rank analysed again, here
    analysed: list[str] = []

    def local_run(pool: LocalPool, files: Any, progress: Any = None) -> Any:
        analysed.extend(files)
        raise AssertionError("a rank analysed again on the client")

    monkeypatch.setattr(LocalPool, "run", local_run)
    out = tmp_path / "page.html"
    code = main(["analyze", str(job), "--scheduler", cluster.scheduler_address, "--html", str(out),
                 "--annotate", str(tmp_path / "annotated.json.gz"), "--no-ledger", "--no-progress",
                 "--out", str(tmp_path / "report.json")])
    assert code == 0
    assert analysed == []
    assert "rank 1 of 2" in out.read_text() or "rank 0 of 2" in out.read_text()
    remote = api.analyze_jobs([job], scheduler=cluster.scheduler_address).results[0]
    got = api.timeline_for(remote.report, analyses=remote.analyses)
    assert (got.rank, got.note) == (expected.rank, expected.note)
    assert [d.seg_cause.tolist() for d in got.devices] == [d.seg_cause.tolist() for d in expected.devices]
    assert [d.seg_start.tolist() for d in got.devices] == [d.seg_start.tolist() for d in expected.devices]


def test_fleet_on_the_cluster_equals_local(cluster: Any, tmp_path: Path) -> None:
    for name, files in {"ddp": PAIR, "alexnet": [ALEXNET]}.items():
        (tmp_path / name).mkdir()
        for f in files:
            shutil.copy(f, tmp_path / name)
    local = api.fleet_report(api.analyze_jobs([tmp_path]).results, [str(tmp_path)])
    remote = api.fleet_report(api.analyze_jobs([tmp_path], scheduler=cluster.scheduler_address).results,
                              [str(tmp_path)])
    assert remote.to_json() == local.to_json()


def test_only_a_compact_result_comes_back(job: Path) -> None:
    """What a task returns is the rank's summary: a small part of the trace it read."""
    for f in PAIR:
        (outcome,) = analyze_file(str(f))
        assert outcome.analysis is not None
        sent = len(pickle.dumps([outcome]))
        events = len(json.loads(gzip.decompress(f.read_bytes()))["traceEvents"])
        assert sent < 100 * events  # bytes per event of the trace: its summary does not grow with the trace
        assert sent < f.stat().st_size


def test_a_bad_rank_is_its_line_and_the_others_are_analysed(cluster: Any, job: Path) -> None:
    (job / "rank2.json").write_text("[not a trace")
    warnings: list[str] = []
    report = api.analyze([job], scheduler=cluster.scheduler_address, warn=warnings.append)
    assert [r.rank for r in report.ranks] == [0, 1]
    (line,) = report.source.skipped
    assert "rank2.json" in line
    assert "\n" not in line
    assert report.source.skipped == api.analyze([job]).source.skipped  # the same line as locally


def test_progress_on_the_client(cluster: Any, job: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    api.analyze([job], scheduler=cluster.scheduler_address, progress=lambda *a: seen.append(a))
    assert seen == [("ranks", 1, 2), ("ranks", 2, 2)]


def test_tasks_that_finish_together_count_one_by_one(cluster: Any, job: Path) -> None:
    """Both ranks' tasks are done before the client looks: one wait returns them together, and progress still
    counts 1 then 2 (it once said 2/2 twice)."""
    files = sorted(str(f) for f in job.iterdir())
    seen: list[tuple[str, int, int]] = []
    with distributed.Client(cluster) as client, client.as_current():
        futures = {client.submit(analyze_file, f, pure=False): f for f in files}
        distributed.wait(list(futures))
        out, killed = DaskCluster(cluster.scheduler_address)._gather(client, futures, lambda *a: seen.append(a))
    assert seen == [("ranks", 1, 2), ("ranks", 2, 2)]
    assert sorted(o.path for o in out) == files
    assert killed == []


class KillOnce(WorkerPlugin):  # type: ignore[misc]
    """Kills the worker process that starts the first gpuidle task (once: a marker file says it was done)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing" and "gpuidle-" in str(key):
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os._exit(1)


class KillOnPoison(WorkerPlugin):  # type: ignore[misc]
    """Kills any worker process that starts the task of a file named ``poison``: a trace that crashes workers."""

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing" and "poison" in str(key):
            os._exit(1)


def test_a_worker_killed_mid_run_is_rescheduled(job: Path, tmp_path: Path) -> None:
    local = api.analyze([job])
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), _cluster() as c, \
            distributed.Client(c) as client:
        client.register_plugin(KillOnce(str(tmp_path / "killed")), name="kill-once")
        remote = api.analyze([job], scheduler=c.scheduler_address)
    assert (tmp_path / "killed").exists()  # a worker did die during the run
    assert remote.to_json() == local.to_json()


def test_a_trace_that_kills_its_workers_is_given_up(job: Path) -> None:
    shutil.copy(PAIR[0], job / "poison.json.gz")
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), _cluster() as c, \
            distributed.Client(c) as client:
        client.register_plugin(KillOnPoison(), name="kill-on-poison")
        outcomes = DaskCluster(c.scheduler_address).run(sorted(str(f) for f in job.iterdir()))
    bad = [o for o in outcomes if o.error is not None]
    assert [Path(o.path).name for o in bad] == ["poison.json.gz"]
    assert "died" in (bad[0].error or "")
    assert "allowed-failures" in (bad[0].error or "")
    assert sorted(o.analysis.report.rank for o in outcomes if o.analysis is not None) == [0, 1]


def test_unreachable_scheduler_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the port gives no answer at once (a host that drops the connection), Dask's own timeout decides: the
    first look is skipped here so that the local refusal reaches Dask."""
    from gpuidle.jobs import cluster

    monkeypatch.setattr(cluster, "not_a_scheduler", lambda address: None)
    with pytest.raises(GpuidleError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:\d+ within 1 s"):
        DaskCluster(f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=1.0).run([str(PAIR[0])])


def test_unreachable_scheduler_on_the_command_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", "--no-ledger", "--scheduler",
                           f"tcp://127.0.0.1:{free_port()}", str(PAIR[0])], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpuidle: error: cannot reach the Dask scheduler")


def test_a_real_scheduler_passes_the_first_look(cluster: Any) -> None:
    """The handshake the look reads is the one a scheduler of this distributed sends (tests/test_scheduler_probe.py:
    what is not a scheduler is refused)."""
    from gpuidle.jobs.probe import not_a_scheduler

    assert not_a_scheduler(cluster.scheduler_address) is None
    assert not_a_scheduler(cluster.scheduler_address.removeprefix("tcp://")) is None


def test_local_pool_and_cluster_sort_the_same(cluster: Any, job: Path) -> None:
    files = sorted(str(f) for f in job.iterdir())
    local = [(o.path, o.analysis.report.rank if o.analysis else None) for o in LocalPool(2).run(files)]
    remote = [(o.path, o.analysis.report.rank if o.analysis else None)
              for o in DaskCluster(cluster.scheduler_address).run(files)]
    assert remote == local


def test_a_bad_input_is_refused_the_same_way(cluster: Any, tmp_path: Path) -> None:
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [')
    errors = []
    for scheduler in (None, cluster.scheduler_address):
        with pytest.raises(GpuidleError) as err:
            api.analyze([bad], scheduler=scheduler)
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert bad.read_text() == '{"traceEvents": ['
    with pytest.raises(GpuidleError, match="no such file") as missing:
        api.analyze([tmp_path / "nothing"], scheduler=cluster.scheduler_address)
    assert "Dask" not in str(missing.value)  # refused on the client, before any task


def test_a_refused_connection_is_told_at_once_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the port: the error comes from one look at it, before Dask would retry for its whole
    timeout (14 s by default); an unknown host likewise."""
    import distributed

    def no_client(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Dask's client was started for an address that refused")

    monkeypatch.setattr(distributed, "Client", no_client)
    for address, why in ((f"tcp://127.0.0.1:{free_port()}", "connection refused"),
                         (f"127.0.0.1:{free_port()}", "connection refused"),
                         ("tcp://no-such-host.invalid:8786", "unknown host")):
        with pytest.raises(GpuidleError, match=why):
            DaskCluster(address, connect_timeout_s=30.0).run([str(PAIR[0])])
