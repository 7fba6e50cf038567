"""How the local pool starts its workers: forked where that is safe, fresh interpreters where it is not.

A forked child of a process with JAX's or TensorFlow's thread pools, a CUDA context or threads of the caller's
can hang on a lock it inherited held; spawn and forkserver would run the caller's main module again in each
worker. The fresh workers do neither, so an unguarded script with JAX and torch loaded analyses a folder as a
bare one does, with the same outcomes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.jobs import executors
from gpuidle.jobs.fresh import DIED, FreshPool
from gpuidle.model import cores

RANKS = [DATA / "trace_filter__sampled_rank-0.json.gz", DATA / "trace_filter__sampled_rank-1.json.gz"]

SCRIPT = """
import json, sys
{imports}
import gpuidle
report = gpuidle.analyze(sys.argv[1])  # no __main__ guard: a worker must not run this again
print(json.dumps({{"hazard": __import__("gpuidle.model.cores").model.cores.fork_hazard(),
                  "ranks": [r.rank for r in report.ranks],
                  "devices": [[d.busy_s, d.idle_by_cause_s] for r in report.ranks for d in r.devices]}}))
"""


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    for f in RANKS:
        (job / f.name).write_bytes(f.read_bytes())
    return job


def _analyze_in_a_script(tmp_path: Path, imports: str) -> tuple[dict[str, object], str]:
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(SCRIPT.format(imports=imports)))
    proc = subprocess.run([sys.executable, str(script), str(_job(tmp_path))], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_script_with_jax_and_torch_loaded_analyses_a_folder_without_forking(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    with_runtimes, stderr = _analyze_in_a_script(tmp_path, "import jax, jax.numpy as jnp, torch\njnp.ones(3)")
    assert with_runtimes["hazard"] == "jax is loaded"
    assert "os.fork()" not in stderr  # JAX's warning at every fork
    (tmp_path / "bare").mkdir()
    bare, _ = _analyze_in_a_script(tmp_path / "bare", "")
    assert bare["hazard"] is None
    assert with_runtimes["ranks"] == bare["ranks"] == [0, 1]
    assert with_runtimes["devices"] == bare["devices"]


def test_what_makes_forking_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("jax", "jaxlib", "tensorflow"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cores.fork_hazard() is None
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)  # a progress bar's refresh: not a hazard
    helper.start()
    assert cores.fork_hazard() is None
    caller = threading.Thread(target=stop.wait)
    caller.start()
    try:
        assert cores.fork_hazard() == "1 other thread(s) run"
    finally:
        stop.set()
        caller.join()
        helper.join()
    monkeypatch.setitem(sys.modules, "tensorflow", object())
    assert cores.fork_hazard() == "tensorflow is loaded"


def test_the_pool_uses_fresh_workers_where_forking_is_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [str(f) for f in RANKS]
    monkeypatch.setattr(executors, "fork_hazard", lambda: None)
    forked = executors.LocalPool(2).run(files)
    monkeypatch.setattr(executors, "fork_hazard", lambda: "jax is loaded")
    started: list[int] = []
    real_run = FreshPool.run

    def counted(self: FreshPool, files: list[str], progress: object = None) -> object:
        started.append(self.workers)
        return real_run(self, files, progress)  # type: ignore[arg-type]

    monkeypatch.setattr(FreshPool, "run", counted)
    fresh = executors.LocalPool(2).run(files)
    assert started == [2]
    assert [(o.path, o.error, o.analysis.report.rank if o.analysis else None) for o in fresh] == \
        [(o.path, o.error, o.analysis.report.rank if o.analysis else None) for o in forked]
    assert [o.analysis.report for o in fresh if o.analysis] == [o.analysis.report for o in forked if o.analysis]


def test_a_worker_that_dies_loses_only_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed mid-file (here: by the file itself, through a path its worker kills itself on) is that
    file's failure; the others are analysed, and progress counts every file."""
    killer = tmp_path / "kills-its-worker.json"
    killer.write_text("{}")
    monkeypatch.setenv("GPUIDLE_TEST_KILL_ON", str(killer))
    seen: list[tuple[int, int]] = []
    pool = FreshPool(2)
    import gpuidle.jobs.fresh as fresh

    monkeypatch.setattr(fresh, "_worker_command", lambda: [sys.executable, "-c", KILLING_WORKER])
    outcomes = pool.run([str(RANKS[0]), str(killer), str(RANKS[1])], lambda _w, d, t: seen.append((d, t)))
    by_path = {o.path: o for o in outcomes}
    assert by_path[str(killer)].error == DIED
    assert by_path[str(RANKS[0])].analysis is not None
    assert by_path[str(RANKS[1])].analysis is not None
    assert seen == [(1, 3), (2, 3), (3, 3)]


KILLING_WORKER = f"""
import os, signal
import gpuidle.jobs.fresh as fresh
real = fresh.analyze_file
def analyze_file(path, progress=None):
    if path == os.environ["GPUIDLE_TEST_KILL_ON"]:
        os.kill(os.getpid(), signal.{signal.SIGKILL.name})
    return real(path, progress)
fresh.analyze_file = analyze_file
fresh.main()
"""
