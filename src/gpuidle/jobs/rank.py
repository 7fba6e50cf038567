"""The per-rank work, wherever it runs: open one trace file, reduce each rank in it to a compact result.

The function opens its input itself (a local path, a path on a shared filesystem, or any fsspec URL),
so on a cluster the trace's bytes go from storage to the worker, never through the client. What comes
back is a :class:`RankOutcome`: the rank's :class:`~gpuidle.analysis.summary.RankAnalysis` (its report,
step numbers, collectives and exposed-communication segments: kilobytes), or one line saying why the
file could not be read.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gpuidle.analysis.summary import RankAnalysis, summarize_rank
from gpuidle.errors import GpuidleError
from gpuidle.sources import kineto
from gpuidle.sources.formats import read_timelines


class RankOutcome(msgspec.Struct, frozen=True):
    """One rank of one file: its analysis, or the one-line reason there is none."""

    path: str
    analysis: RankAnalysis | None
    error: str | None
    format: str = kineto.FORMAT
    framework: str | None = None


def analyze_file(path: str, progress: Callable[[int, int], None] | None = None) -> list[RankOutcome]:
    """One file's ranks: any failure, even a bug, is that file's outcome, not the job's."""
    try:
        return [RankOutcome(path, summarize_rank(tl), None, tl.meta.format, tl.meta.framework)
                for tl in read_timelines(path, progress)]
    except GpuidleError as err:
        return [RankOutcome(path, None, str(err))]
    except Exception as err:  # a bug: one rank's crash must not take the folder down, nor pass for bad input
        return [internal_error(path, err)]


def internal_error(path: str, err: BaseException) -> RankOutcome:
    """The outcome of a file whose reading met a bug in gpuidle rather than a fault in the file."""
    return failed(path, f"an internal error: please report it ({type(err).__name__}: {err})")


def failed(path: str, why: str) -> RankOutcome:
    """The outcome of a file whose work did not finish, with ``why`` on one line."""
    return RankOutcome(path, None, " ".join(why.split()))
