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
