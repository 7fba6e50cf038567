"""gpuidle writes only where it is told: not into the git index around it, never over an input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.cli import main
from gpuidle.ledger import Ledger

TRACE = DATA / "trace_compare__base__base.json.gz"
SMI_LOG = DATA / "smi" / "query_gpu_units.csv"


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _index(repo: Path) -> tuple[bytes, int]:
    index = repo / ".git" / "index"
    return index.read_bytes(), index.stat().st_mtime_ns


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("edit", ["touch", "change"])
def test_recording_reads_the_git_state_without_writing_the_index(tmp_path: Path, edit: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    script = repo / "train.py"
    script.write_text("lr = 0.1\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "HEAD")
    if edit == "change":
        script.write_text("lr = 0.2\n")
    later = script.stat().st_mtime_ns + 10**10  # stat data the index does not hold: git status would refresh it
    os.utime(script, ns=(later, later))
    before = _index(repo)
    monkeypatch.chdir(repo)
    path = tmp_path / "l.sqlite"
    assert main(["summarize", str(SMI_LOG), "--json", "--ledger", str(path)]) == 0
    capsys.readouterr()
    assert _index(repo) == before
    assert not (repo / ".git" / "index.lock").exists()
    with Ledger(path) as book:
        (run,) = book.runs()
    assert (run.git_commit, run.git_dirty) == (head, edit == "change")


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    return line


@pytest.mark.parametrize("flag", ["--out", "--html", "--annotate"])
def test_analyze_never_writes_over_its_trace(tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "rank0.json.gz"
    shutil.copy(TRACE, trace)
    before = trace.read_bytes()
    spelled = str(tmp_path / "sub" / ".." / "rank0.json.gz")  # the same file, another path
    (tmp_path / "sub").mkdir()
    out = spelled if flag != "--out" else str(trace)
    extra = ["--format", "html"] if flag == "--out" else []
    line = _refused(["analyze", str(trace), flag, out, *extra, "--no-ledger"], capsys)
    assert line == f"gpuidle: error: {flag} {out} would overwrite the input {trace} (give another output path)"
    assert trace.read_bytes() == before


def test_analyze_never_writes_over_a_trace_of_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz"):
        shutil.copy(DATA / name, folder / name)
    rank1 = folder / "trace_filter__sampled_rank-1.json.gz"
    before = rank1.read_bytes()
    line = _refused(["analyze", str(folder), "--html", str(rank1), "--no-ledger"], capsys)
    assert "would overwrite the input" in line
    assert rank1.read_bytes() == before


def test_summarize_and_compare_never_write_over_their_inputs(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "util.csv"
    shutil.copy(SMI_LOG, log)
    line = _refused(["summarize", str(log), "--out", str(log), "--format", "json", "--no-ledger"], capsys)
    assert line.startswith(f"gpuidle: error: --out {log} would overwrite the input {log}")
    assert log.read_bytes() == SMI_LOG.read_bytes()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for report, trace in ((a, TRACE), (b, DATA / "trace_compare__test__test.json.gz")):
        assert main(["analyze", str(trace), "--json", "--out", str(report), "--no-ledger"]) == 0
    before = a.read_bytes()
    for flag in ("--out", "--html"):
        line = _refused(["compare", str(a), str(b), flag, str(a)], capsys)
        assert line.startswith(f"gpuidle: error: {flag} {a} would overwrite the input {a}")
    assert a.read_bytes() == before
    line = _refused(["bench", "allreduce", "--compare", str(a), "--out", str(a)], capsys)
    assert "would overwrite the input" in line
    assert a.read_bytes() == before


def test_the_tests_record_into_a_home_of_their_own_never_the_users(tmp_path: Path) -> None:
    """A run recorded the way a test's subprocesses record (no --ledger, the environment as the test session set
    it) lands in the session's own ledger; the user's ledger holds no run of the session's inputs (the user may
    record runs of their own meanwhile)."""
    from conftest import USERS_LEDGER, runs_of_the_session

    env = {k: v for k, v in os.environ.items() if k != "GPUIDLE_LEDGER"}  # the XDG home alone decides
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(TRACE)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    recorded = Path(env["XDG_DATA_HOME"]) / "gpuidle" / "ledger.sqlite"
    assert [r.id for r in Ledger(recorded).runs()] == [1]
    assert recorded != USERS_LEDGER
    assert runs_of_the_session(recorded, since=0) == [f"run 1 read {TRACE}"]  # it sees a run of the session's
    assert runs_of_the_session(USERS_LEDGER) == []
