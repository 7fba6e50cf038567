from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
DATA = TESTS / "data"
sys.path.insert(0, str(TESTS))


def _users_ledger() -> Path:
    """Where gpuidle would record runs for the user running the tests (read before anything is redirected)."""
    from gpuidle.ledger import default_path

    return default_path()


def _fingerprint(path: Path) -> str:
    """What a ledger file is now: absent, or its size, time and bytes (with SQLite's journal beside it)."""
    parts = []
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-journal")):
        if p.is_file():
            st = p.stat()
            parts.append(f"{p.name} {st.st_size} {st.st_mtime_ns} {hashlib.sha256(p.read_bytes()).hexdigest()}")
        else:
            parts.append(f"{p.name} absent")
    return "; ".join(parts)


USERS_LEDGER = _users_ledger()
USERS_LEDGER_BEFORE = _fingerprint(USERS_LEDGER)

# Everything gpuidle (and the XDG-minded libraries beside it) would keep for the user goes to a temporary home for
# the whole session, before any fixture of any scope runs: module-scoped jobs and their subprocesses included.
SESSION_HOME = Path(tempfile.mkdtemp(prefix="gpuidle-tests-"))
os.environ["GPUIDLE_LEDGER"] = str(SESSION_HOME / "session-ledger.sqlite")
for _var, _sub in (("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"),
                   ("XDG_STATE_HOME", "state")):
    os.environ[_var] = str(SESSION_HOME / _sub)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The whole run fails if the user's own ledger changed, whichever test changed it."""
    after = _fingerprint(USERS_LEDGER)
    if after != USERS_LEDGER_BEFORE:
        print(f"\nthe tests changed the user's ledger {USERS_LEDGER}: {USERS_LEDGER_BEFORE} -> {after}",
              file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(SESSION_HOME, ignore_errors=True)


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
