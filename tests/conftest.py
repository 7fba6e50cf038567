from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
DATA = TESTS / "data"
sys.path.insert(0, str(TESTS))


@pytest.fixture
def data() -> Path:
    return DATA


@pytest.fixture(autouse=True)
def private_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test records into its own ledger: never the user's data directory."""
    path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite"
    monkeypatch.setenv("GPUIDLE_LEDGER", str(path))
    monkeypatch.setenv("XDG_DATA_HOME", str(path.parent / "xdg"))
    return path
