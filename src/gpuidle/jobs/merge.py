"""The per-rank results of one job in, its report out: the same code whichever executor ran the ranks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpuidle.advice.advise import advise, framework_of
from gpuidle.analysis.ranks import job_report
from gpuidle.analysis.summary import RankAnalysis
from gpuidle.analysis.trace_quality import job_quality
from gpuidle.errors import GpuidleError
from gpuidle.jobs.rank import RankOutcome
from gpuidle.model import HOST_RANK_NOTE, XSPACE_FORMAT, AnalysisReport, Source
from gpuidle.sources import kineto


def merge_job(
    paths: Sequence[str | Path], outcomes: Sequence[RankOutcome], warn: Callable[[str], None] | None = None,
    include_warmup: bool = False,
) -> AnalysisReport:
    """The job's report from its ranks' outcomes; a file that failed is named in ``source.skipped``.

    :raises GpuidleError: no rank could be read (alone, the file's own error).
    """
    good = [o for o in outcomes if o.analysis is not None]
    skipped = [_named(o.path, o.error) for o in outcomes if o.error is not None]
    if not good:
        if len(outcomes) == 1 and outcomes[0].error is not None:
            raise GpuidleError(outcomes[0].error or "unreadable trace")
        raise GpuidleError(f"none of the {len(outcomes)} files is a readable GPU trace; first: {skipped[0]}")
    for line in skipped:
        if warn:
            warn(f"skipped {line}")
    _hosts_as_given([o for o in good if o.format == XSPACE_FORMAT])
    analyses = sorted((o.analysis for o in good if o.analysis is not None), key=lambda a: a.report.rank)
    analyses, duplicates = _dedupe_ranks(analyses, warn)
    job = job_report(analyses, duplicates, include_warmup) if len(analyses) > 1 else None
    reports = [a.report for a in analyses]
    framework = _one({o.framework for o in good})
    advice = advise(reports, job, framework_of({o.framework for o in good}), include_warmup,
                    {a.report.rank: a.accumulation_repeats for a in analyses})
    return AnalysisReport(
        source=Source(paths=[str(p) for p in paths], format=_one({o.format for o in good}) or kineto.FORMAT,
                      skipped=skipped, framework=framework),
        ranks=reports, job=job, recommendations=advice.recommendations, combined=advice.combined,
        declined=advice.declined, include_warmup=include_warmup, quality=job_quality(reports),
    )


def _hosts_as_given(outcomes: Sequence[RankOutcome]) -> None:
    """An XSpace profile is one host's and names no rank: the hosts given are numbered in host-name order among
    themselves. The reader numbered each among the profiles in its folder; a profile given alone, or with some of
    its neighbours, is not the rank its folder would make it, and the note says how many it left out."""
    given = sorted(outcomes, key=lambda o: Path(o.path).name)
    for i, o in enumerate(given):
        if o.analysis is None:
            continue
        r = o.analysis.report
        in_folder = r.world_size or 1
        r.rank, r.world_size = i, len(given)
        left = in_folder - len(given)
        r.notes = [n for n in r.notes if not n.startswith(HOST_RANK_NOTE)]
        r.notes.append(f"{HOST_RANK_NOTE} {Path(o.path).name} is rank {i} of the {len(given)} host profile(s) given"
                       + (f"; {left} more in its folder not given" if left > 0 else ""))


def _named(path: str, error: str) -> str:
    """``path: error``, the path said once: a reader's error names its file already."""
    return error if error.startswith(path) else f"{path}: {error}"


def _one(values: set[str | None]) -> str | None:
    """The one value of a job's files, or their sorted list joined by ``+`` when they differ."""
    known = sorted(v for v in values if v)
    return "+".join(known) if known else None


def _dedupe_ranks(
    analyses: list[RankAnalysis], warn: Callable[[str], None] | None,
) -> tuple[list[RankAnalysis], list[int]]:
    """One file per rank: where several hold the same rank (a log folder keeping every run of a worker), the
    newest run, by the time its trace begins; one line, on stderr and in the kept rank's notes, says which was taken
    and how many were left out."""
    by_rank: dict[int, list[RankAnalysis]] = {}
    for a in analyses:
        by_rank.setdefault(a.report.rank, []).append(a)
    kept: list[RankAnalysis] = []
    duplicates: list[int] = []
    for rank in sorted(by_rank):
        runs = by_rank[rank]
        newest = max(runs, key=lambda a: (a.started_ns, a.report.path))
        kept.append(newest)
        if len(runs) > 1:
            duplicates.append(rank)
            said = (f"rank {rank} is in {len(runs)} files (runs of the same rank): the newest, {newest.report.path}, "
                    f"is analysed and the other {len(runs) - 1} left out (give one file to analyse another run)")
            newest.report.notes.append(said)  # in the report itself: its JSON, every renderer, the ledger's record
            if warn:
                warn(said)
    return kept, duplicates
