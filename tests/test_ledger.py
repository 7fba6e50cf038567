"""The ledger: round trip, migrations from an older schema, concurrent writers, files that are not ours."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from conftest import DATA
from gpuidle import api, ledger
from gpuidle.cli import main
from gpuidle.ledger import APPLICATION_ID, SCHEMA_VERSION, Ledger, LedgerError

TRACE = DATA / "trace_compare__base__base.json.gz"

# The schema as version 1 shipped it, written out here so that the test keeps testing the
# upgrade of real old files even if the module changes.
V1_SCHEMA = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, created TEXT NOT NULL, label TEXT,
                   notes TEXT, host TEXT, report TEXT NOT NULL);
CREATE TABLE inputs (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, path TEXT NOT NULL,
                     size INTEGER, sha256 TEXT);
CREATE INDEX inputs_run ON inputs(run_id);
PRAGMA user_version = 1;
"""


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_round_trip(tmp_path: Path) -> None:
    data = tmp_path / "in.bin"
    data.write_bytes(b"profile bytes" * 1000)
    path = tmp_path / "l.sqlite"
    report = '{"schema": "x", "value": 1.5}'
    with Ledger(path) as book:
        first = book.record("bench", report, label="nccl", notes="after the driver update", inputs=[data],
                            gpu_model="NVIDIA H100 80GB HBM3", gpu_count=8, batch_size=32, utilization=0.5,
                            step_s=0.25, workdir=tmp_path)
        second = book.record("analyze", b"{}", inputs=[tmp_path / "missing.json"], workdir=tmp_path)
    assert (first, second) == (1, 2)
    with Ledger(path) as book:
        runs = book.runs()
        assert [r.id for r in runs] == [2, 1]  # newest first
        r = book.get(1)
        assert r is not None
        assert book.find("1") == r == book.find("nccl") == runs[1]
        assert book.runs(kind="analyze") == [runs[0]]
        assert book.runs(limit=1) == [runs[0]]
    assert r.kind == "bench"
    assert r.report == report
    assert (r.label, r.notes) == ("nccl", "after the driver update")
    assert (r.gpu_model, r.gpu_count, r.batch_size, r.utilization, r.step_s) == ("NVIDIA H100 80GB HBM3", 8, 32,
                                                                                 0.5, 0.25)
    assert r.host == socket.gethostname()
    assert (r.git_commit, r.git_dirty) == (None, None)  # tmp_path is no git working tree
    created = datetime.fromisoformat(r.created)
    assert created.utcoffset() is not None
    assert created.utcoffset().total_seconds() == 0
    assert abs((datetime.now(UTC) - created).total_seconds()) < 3600
    (f,) = r.inputs
    assert f == ledger.InputFile(str(data.resolve()), 13000, hashlib.sha256(data.read_bytes()).hexdigest())
    (missing,) = runs[0].inputs
    assert (missing.size, missing.sha256) == (None, None)
    with Ledger(path) as book, pytest.raises(LedgerError, match="no run 'nope'"):
        book.find("nope")


def test_label_finds_the_newest_run(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as book:
        book.record("analyze", "{}", label="baseline")
        book.record("analyze", "{}", label="baseline")
        assert book.find("baseline").id == 2


def test_git_commit_and_dirty_flag(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("lr = 0.1\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "HEAD")
    with Ledger(tmp_path / "l.sqlite") as book:
        clean = book.get(book.record("analyze", "{}", workdir=repo))
        (repo / "train.py").write_text("lr = 0.2\n")
        dirty = book.get(book.record("analyze", "{}", workdir=repo))
    assert clean is not None
    assert dirty is not None
    assert (clean.git_commit, clean.git_dirty) == (head, False)
    assert (dirty.git_commit, dirty.git_dirty) == (head, True)


def test_analysis_round_trip(tmp_path: Path) -> None:
    report = api.analyze([TRACE])
    path = tmp_path / "l.sqlite"
    run_id = api.record_analysis(report, label="baseline", notes="n", batch_size=64, ledger_path=path)
    with Ledger(path) as book:
        run = book.find("baseline")
    assert run.id == run_id
    assert run.analysis() == report
    assert run.utilization == report.ranks[0].primary().utilization
    assert run.step_s == pytest.approx(statistics.median(s.dur_s for s in report.ranks[0].steps))
    assert (run.gpu_count, run.batch_size, run.kind) == (1, 64, "analyze")
    assert [f.path for f in run.inputs] == [str(TRACE.resolve())]
    assert run.inputs[0].sha256 == hashlib.sha256(TRACE.read_bytes()).hexdigest()


def test_a_record_of_another_kind_is_not_an_analysis(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as book:
        run = book.get(book.record("bench", "{}"))
    assert run is not None
    with pytest.raises(LedgerError, match="is a bench record"):
        run.analysis()


def test_module_record_uses_the_environment(private_ledger: Path) -> None:
    run_id = ledger.record("monitor", b'{"samples": 3}', "overnight", [])
    assert ledger.default_path() == private_ledger
    with Ledger() as book:
        assert book.path == private_ledger
        assert book.find("overnight").id == run_id


def test_default_path_is_the_user_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ledger.ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert ledger.default_path() == tmp_path / "data" / "gpuidle" / "ledger.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ledger.default_path() == tmp_path / "home" / ".local" / "share" / "gpuidle" / "ledger.sqlite"


def test_fresh_ledger_is_wal_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "l.sqlite"
    Ledger(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    db.close()


def test_migration_from_version_1(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO runs (kind, created, label, notes, host, report) VALUES "
               "('analyze', '2025-01-02T03:04:05+00:00', 'old run', NULL, 'node1', '{\"a\": 1}')")
    db.execute("INSERT INTO inputs (run_id, path, size, sha256) VALUES (1, '/data/t.json.gz', 10, 'ab')")
    db.commit()
    db.close()
    with Ledger(path) as book:
        (old,) = book.runs()
        new = book.record("analyze", "{}", label="new run", gpu_model="A100", gpu_count=2, batch_size=16)
        again = book.get(new)
    assert (old.id, old.kind, old.label, old.host, old.report) == (1, "analyze", "old run", "node1", '{"a": 1}')
    assert old.inputs == [ledger.InputFile("/data/t.json.gz", 10, "ab")]
    assert (old.gpu_model, old.gpu_count, old.batch_size, old.git_commit, old.git_dirty, old.utilization) == (
        None, None, None, None, None, None)
    assert again is not None
    assert (again.id, again.gpu_model, again.gpu_count, again.batch_size) == (2, "A100", 2, 16)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    assert {"gpu_model", "gpu_count", "batch_size", "git_commit", "git_dirty", "utilization", "step_s"} <= columns
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from gpuidle.ledger import Ledger
    path, me, n, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    (folder / f"ready-{me}").touch()
    while not (folder / "go").exists():
        time.sleep(0.001)
    for i in range(n):
        with Ledger(path) as book:
            book.record("analyze", '{"writer": "%s", "i": %d}' % (me, i), label=f"{me}-{i}", inputs=[__file__])
""")


def test_two_processes_writing_at_once(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    path = tmp_path / "shared.sqlite"  # created by the writers themselves, at the same moment
    n = 25
    procs = [subprocess.Popen([sys.executable, str(script), str(path), me, str(n), str(tmp_path)],
                              stderr=subprocess.PIPE, text=True) for me in ("a", "b")]
    while not all((tmp_path / f"ready-{me}").exists() for me in ("a", "b")):
        assert all(p.poll() is None for p in procs), [p.communicate()[1] for p in procs]
        time.sleep(0.01)
    (tmp_path / "go").touch()
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err
    with Ledger(path) as book:
        runs = book.runs()
    assert len(runs) == 2 * n
    assert sorted(r.id for r in runs) == list(range(1, 2 * n + 1))
    assert {r.label for r in runs} == {f"{me}-{i}" for me in ("a", "b") for i in range(n)}
    for r in runs:
        body = json.loads(r.report)
        assert r.label == f"{body['writer']}-{body['i']}"
        assert len(r.inputs) == 1
        assert r.inputs[0].path == str(script.resolve())
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT count(*) FROM inputs").fetchone()[0] == 2 * n
    db.close()


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    body = b"these are my notes, not a database\n" * 200
    path.write_bytes(body)
    with pytest.raises(LedgerError, match="not a gpuidle ledger"):
        Ledger(path)
    assert path.read_bytes() == body


def test_a_damaged_ledger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path) as book:
        book.record("analyze", "{}")
    raw = bytearray(path.read_bytes())
    raw[16:100] = b"\xff" * 84  # page size and header fields: garbage
    path.write_bytes(bytes(raw))
    with pytest.raises(LedgerError, match="not a gpuidle ledger, or a damaged one"):
        Ledger(path).runs()
    assert path.read_bytes() == bytes(raw)


def test_another_programs_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "photos.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO photos (name) VALUES ('cat.jpg')")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="is not a gpuidle ledger"):
        Ledger(path)
    assert path.read_bytes() == before


def test_a_newer_ledger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match=f"newer gpuidle \\(ledger schema {SCHEMA_VERSION + 5}; this version reads "
                                          f"up to {SCHEMA_VERSION}\\)"):
        Ledger(path)


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="is a folder"):
        Ledger(tmp_path)


# -- through the command line -----------------------------------------------------------


def test_analyze_records_and_history_lists(private_ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(TRACE), "--label", "baseline", "--notes", "first try", "--batch-size", "32"]) == 0
    assert main(["analyze", str(TRACE), "--no-ledger"]) == 0
    capsys.readouterr()
    with Ledger(private_ledger) as book:
        (run,) = book.runs()
    assert (run.label, run.notes, run.batch_size, run.kind) == ("baseline", "first try", 32, "analyze")
    assert main(["history"]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out
    assert "analyze" in out
    assert main(["history", "--json"]) == 0
    (row,) = msgspec.json.decode(capsys.readouterr().out)
    assert (row["id"], row["label"], row["batch_size"], row["gpu_count"]) == (1, "baseline", 32, 1)
    assert row["inputs"][0]["sha256"] == hashlib.sha256(TRACE.read_bytes()).hexdigest()


def test_history_of_an_empty_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "--ledger", str(tmp_path / "none.sqlite")]) == 0
    assert "no runs recorded" in capsys.readouterr().out
    assert not (tmp_path / "none.sqlite").exists()


def test_a_bad_ledger_never_fails_the_analysis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    foreign = tmp_path / "foreign.db"
    foreign.write_bytes(b"x" * 4096)
    assert main(["analyze", str(TRACE), "--ledger", str(foreign)]) == 0
    captured = capsys.readouterr()
    assert "utilization" in captured.out
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("gpuidle: warning: the run was not recorded in the ledger: ")
    assert "not a gpuidle ledger" in line
    assert foreign.read_bytes() == b"x" * 4096


def test_history_of_a_foreign_file_is_one_error_line(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    foreign.write_bytes(b"x" * 4096)
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "history", "--ledger", str(foreign)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpuidle: error: ")
    assert "not a gpuidle ledger" in line
