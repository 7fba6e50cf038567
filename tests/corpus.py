"""Where the shared corpus of real traces lies: ``../shared/corpus`` from the project's root (CI keeps a copy of
``shared/`` beside the clone; a worktree one level deeper finds it a level up). Tests that read it skip without it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = next((p for p in (ROOT.parent / "shared" / "corpus", ROOT.parent.parent / "shared" / "corpus")
               if p.is_dir()), ROOT.parent / "shared" / "corpus")
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason="the shared corpus is not beside this checkout")
