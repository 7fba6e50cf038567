"""What every executor of the per-rank work promises: the outcomes of every rank, in one order, with progress.

Its own module so that the local pool (:mod:`.executors`) and the Dask cluster (:mod:`.cluster`) both hold to it
without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gpuidle.jobs.rank import RankOutcome

Progress = Callable[[str, int, int], None]
"""``(what, done, total)``: bytes of one file, or files of a job."""


class Executor(Protocol):
    def run(self, files: Sequence[str], progress: Progress | None = None) -> list[RankOutcome]:
        """Every rank of every file, sorted by file then rank."""


def ordered(outcomes: list[RankOutcome]) -> list[RankOutcome]:
    """The order both executors return: by file, then rank (unreadable files first of theirs)."""
    return sorted(outcomes, key=lambda o: (o.path, o.analysis.report.rank if o.analysis else -1))
