"""The real traces beside the project (``../shared/corpus``, ``../shared/traces``), where a checkout has them: from
the repository's root, or from a worktree one folder further down."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _found() -> Path | None:
    for parent in (ROOT.parent, ROOT.parent.parent):
        if (parent / "shared" / "corpus").is_dir():
            return parent / "shared"
    return None


def shared() -> Path:
    return _found() or pytest.skip("../shared/corpus absent")


def every_input() -> list[Path]:
    """Every trace and folder of ranks held (none where they are absent): the corpus's files and folders, the
    traces' files and their formats' folders' files."""
    root = _found()
    if root is None:
        return []
    corpus, traces = root / "corpus", root / "traces"
    return [*sorted(corpus.glob("*.gz")), *sorted(p for p in corpus.iterdir() if p.is_dir()),
            *sorted(traces.glob("*.gz")), *sorted(p for p in traces.glob("*/*") if p.is_file())]


def corpus(name: str) -> Path:
    path = shared() / "corpus" / name
    return path if path.exists() else pytest.skip(f"{path} absent")


def kineto_traces() -> list[Path]:
    """Every Kineto trace held: the corpus's (a folder of ranks counts each rank) and ``traces``'."""
    root = shared()
    return [*sorted((root / "corpus").glob("**/*.json.gz")), *sorted((root / "traces").glob("*.json.gz"))]
