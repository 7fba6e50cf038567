"""The real traces beside the project (``../shared/corpus``, ``../shared/traces``), where a checkout has them: from
the repository's root, or from a worktree one folder further down."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shared() -> Path:
    for parent in (ROOT.parent, ROOT.parent.parent):
        if (parent / "shared" / "corpus").is_dir():
            return parent / "shared"
    pytest.skip("../shared/corpus absent")


def corpus(name: str) -> Path:
    path = shared() / "corpus" / name
    return path if path.exists() else pytest.skip(f"{path} absent")


def kineto_traces() -> list[Path]:
    """Every Kineto trace held: the corpus's (a folder of ranks counts each rank) and ``traces``'."""
    root = shared()
    return [*sorted((root / "corpus").glob("**/*.json.gz")), *sorted((root / "traces").glob("*.json.gz"))]
