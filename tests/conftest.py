from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest

TESTS = Path(__file__).parent
DATA = TESTS / "data"
sys.path.insert(0, str(TESTS))


def _users_ledger() -> Path:
    """Where gpuidle would record runs for the user running the tests (read before anything is redirected)."""
    from gpuidle.ledger import default_path

    return default_path()


def _read(path: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    """Rows of a query on a ledger opened read-only (never created, migrated or written); none if it is absent."""
    if not path.is_file():
        return []
    try:
        db = sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True, timeout=60)
        try:
            return db.execute(sql, params).fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError:  # not a ledger, or one of another schema: it holds no run of the session's
        return []


def _last_run(path: Path) -> int:
    rows = _read(path, "SELECT MAX(id) FROM runs")
    return int(rows[0][0]) if rows and isinstance(rows[0][0], int) else 0


USERS_LEDGER = _users_ledger()
USERS_LAST_RUN = _last_run(USERS_LEDGER)

# Everything gpuidle (and the XDG-minded libraries beside it) would keep for the user goes to a temporary home for
# the whole session, before any fixture of any scope runs: module-scoped jobs and their subprocesses included.
SESSION_HOME = Path(tempfile.mkdtemp(prefix="gpuidle-tests-"))
os.environ["GPUIDLE_LEDGER"] = str(SESSION_HOME / "session-ledger.sqlite")
for _var, _sub in (("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"),
                   ("XDG_STATE_HOME", "state")):
    os.environ[_var] = str(SESSION_HOME / _sub)
SESSION_INPUTS = [DATA, TESTS.parent / "examples", SESSION_HOME]
"""Where the session's inputs lie; pytest's temporary folder is added once it is made."""


def runs_of_the_session(path: Path, since: int = USERS_LAST_RUN) -> list[str]:
    """Runs recorded in the ledger at ``path`` after run ``since`` (the user's last when the session began) that
    read one of the session's inputs (the tests' data and examples, a temporary folder of the session's): the
    session wrote them. Runs the user records meanwhile, of other inputs, are not the session's."""
    roots = [Path(os.path.realpath(r)) for r in SESSION_INPUTS]
    found = []
    for run_id, input_path in _read(path, "SELECT runs.id, inputs.path FROM runs JOIN inputs ON inputs.run_id = "
                                          "runs.id WHERE runs.id > ?", since):
        resolved = Path(os.path.realpath(str(input_path)))
        if any(resolved.is_relative_to(root) for root in roots):
            found.append(f"run {run_id} read {input_path}")
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The whole run fails if the session recorded a run in the user's own ledger, whichever test recorded it."""
    written = runs_of_the_session(USERS_LEDGER)
    if written:
        print(f"\nthe tests recorded into the user's ledger {USERS_LEDGER}: {'; '.join(written)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _session_temp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """pytest's temporary folder holds the session's inputs too."""
    SESSION_INPUTS.append(tmp_path_factory.getbasetemp())


@pytest.fixture
def data() -> Path:
    return DATA


@pytest.fixture(autouse=True)
def private_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test records into its own ledger: never the user's data directory, nor another test's."""
    path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite"
    monkeypatch.setenv("GPUIDLE_LEDGER", str(path))
    monkeypatch.setenv("XDG_DATA_HOME", str(path.parent / "xdg"))
    return path
