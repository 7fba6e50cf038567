"""The per-rank work, wherever it runs: open one trace file, reduce each rank in it to a compact result.

The function opens its input itself (a local path, a path on a shared filesystem, or any fsspec URL),
so on a cluster the trace's bytes go from storage to the worker, never through the client. What comes
back is a :class:`RankOutcome`: the rank's :class:`~gpuidle.analysis.summary.RankAnalysis` (its report,
step numbers, collectives and exposed-communication segments: kilobytes), its host side where its trace lost every
device record (:mod:`gpuidle.analysis.host_side`), or one line saying why the file could not be read.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gpuidle.analysis.host_side import host_side
from gpuidle.analysis.summary import RankAnalysis, summarize_rank
from gpuidle.errors import GpuidleError
from gpuidle.model import HostSide, Timeline
from gpuidle.sources import kineto
from gpuidle.sources.formats import read_timelines


class RankOutcome(msgspec.Struct, frozen=True):
    """One rank of one file: its analysis, its host side where the trace lost every device record, or the one-line
    reason there is neither."""

    path: str
    analysis: RankAnalysis | None
    error: str | None
    format: str = kineto.FORMAT
    framework: str | None = None
    host_side: HostSide | None = None


def analyze_file(path: str, progress: Callable[[int, int], None] | None = None) -> list[RankOutcome]:
    """One file's ranks: any failure, even a bug, is that file's outcome, not the job's."""
    try:
        return [_outcome(path, tl) for tl in read_timelines(path, progress)]
    except GpuidleError as err:
        return [RankOutcome(path, None, str(err))]
    except Exception as err:  # a bug: one rank's crash must not take the folder down, nor pass for bad input
        return [internal_error(path, err)]


def _outcome(path: str, tl: Timeline) -> RankOutcome:
    """A rank with device activity analysed; one without (its device records lost) reported from its host side."""
    if not tl.devices:
        return RankOutcome(path, None, None, tl.meta.format, tl.meta.framework, host_side=host_side(tl))
    return RankOutcome(path, summarize_rank(tl), None, tl.meta.format, tl.meta.framework)


def internal_error(path: str, err: BaseException) -> RankOutcome:
    """The outcome of a file whose reading met a bug in gpuidle rather than a fault in the file."""
    return failed(path, f"an internal error: please report it ({type(err).__name__}: {err})")


def failed(path: str, why: str) -> RankOutcome:
    """The outcome of a file whose work did not finish, with ``why`` on one line."""
    return RankOutcome(path, None, " ".join(why.split()))
