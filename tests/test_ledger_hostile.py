"""Ledgers that must not be written (damaged, another program's) and folders gpuidle may not search or write.

Permissions are tested in a child process without root's power to ignore them (``setpriv``
drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), so the tests mean the same as root and as a user.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import DATA
from gpuidle.cli import main
from gpuidle.ledger import Ledger, LedgerError
from permissions import unprivileged

TRACE = DATA / "trace_compare__base__base.json.gz"
def gpuidle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*unprivileged(), sys.executable, "-m", "gpuidle", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def closed_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody may list or enter (mode 000); opened again for clean-up."""
    folder = tmp_path / "closed"
    folder.mkdir()
    folder.chmod(0)
    yield folder
    folder.chmod(0o755)


def _ledger_with_runs(path: Path, n: int = 30) -> None:
    with Ledger(path) as book:
        for i in range(n):
            book.record("bench", '{"pad": "' + "x" * 2000 + '"}', label=f"run {i}")
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def _flip_inside_page(path: Path, table: str, offset: int) -> bytes:
    """XOR 8 bytes of the b-tree page of ``table`` (an index or table of the ledger) at ``offset``."""
    db = sqlite3.connect(path)
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    db.close()
    raw = bytearray(path.read_bytes())
    start = (root - 1) * page_size + offset
    raw[start:start + 8] = bytes(b ^ 0xFF for b in raw[start:start + 8])
    path.write_bytes(bytes(raw))
    return bytes(raw)


def _intact(path: Path) -> bool:
    db = sqlite3.connect(path)
    try:
        return bool(db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
    except sqlite3.DatabaseError:  # "database disk image is malformed"
        return False
    finally:
        db.close()


@pytest.mark.parametrize("offset", [12, 4000])  # the cell pointers; a cell's content near the page's end
def test_a_ledger_with_a_damaged_b_tree_page_is_not_written(tmp_path: Path, offset: int,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l.sqlite"
    _ledger_with_runs(path)
    damaged = _flip_inside_page(path, "runs_label", offset)
    assert not _intact(path)  # the damage is real
    with pytest.raises(LedgerError, match="the ledger is damaged \\(On tree page"), Ledger(path) as book:
        book.record("bench", "{}")
    assert path.read_bytes() == damaged
    # a recording command warns in one line, and its report stands
    assert main(["analyze", str(TRACE), "--ledger", str(path)]) == 0
    out = capsys.readouterr()
    assert "utilization" in out.out
    (line,) = out.err.splitlines()
    assert line.startswith("gpuidle: warning: the run was not recorded in the ledger: ")
    assert "damaged" in line
    assert path.read_bytes() == damaged


def test_a_database_with_another_programs_application_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA application_id = 12345")  # set by its program before it made any table
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="is not a gpuidle ledger"):
        Ledger(path)
    assert path.read_bytes() == before


def test_a_ledger_in_a_folder_that_cannot_be_searched(closed_folder: Path) -> None:
    path = closed_folder / "sub" / "l.sqlite"
    run = gpuidle("analyze", str(TRACE), "--ledger", str(path))
    assert run.returncode == 0
    assert "utilization" in run.stdout
    (line,) = run.stderr.splitlines()
    assert line == f"gpuidle: warning: the run was not recorded in the ledger: {path}: cannot open the ledger " \
                   "(Permission denied)"
    for command in (["history"], ["compare", "1", "2"]):
        shown = gpuidle(*command, "--ledger", str(path))
        assert shown.returncode == 2
        assert shown.stderr == f"gpuidle: error: {path}: cannot open the ledger (Permission denied)\n"


def test_history_reads_a_wal_ledger_in_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "l.sqlite"
    _ledger_with_runs(path, 3)
    assert path.read_bytes()[18:20] == b"\x02\x02"  # WAL mode, in the file header
    before = path.read_bytes()
    folder.chmod(0o555)
    try:
        shown = gpuidle("history", "--ledger", str(path), "--json")
        recorded = gpuidle("summarize", str(DATA / "smi" / "query_gpu_units.csv"), "--ledger", str(path))
    finally:
        folder.chmod(0o755)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""
    assert [r["label"] for r in json.loads(shown.stdout)] == ["run 2", "run 1", "run 0"]
    assert sorted(p.name for p in folder.iterdir()) == ["l.sqlite"]
    assert path.read_bytes() == before
    assert recorded.returncode == 0
    (line,) = recorded.stderr.splitlines()
    assert line.startswith("gpuidle: warning: the run was not recorded in the ledger: ")
