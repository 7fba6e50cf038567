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
from gpuidle.model import HOST_RANK_NOTE, XSPACE_FORMAT, AnalysisReport, HostSide, Source
from gpuidle.sources import kineto


def merge_job(
    paths: Sequence[str | Path], outcomes: Sequence[RankOutcome], warn: Callable[[str], None] | None = None,
    include_warmup: bool = False,
) -> AnalysisReport:
    """The job's report from its ranks' outcomes; a file that failed is named in ``source.skipped``, a rank whose
    trace lost every device record is reported from its host side (``host_side``) and left out of every figure.

    :raises GpuidleError: no rank could be read (alone, the file's own error).
    """
    good = [o for o in outcomes if o.analysis is not None]
    lost = [o for o in outcomes if o.host_side is not None]
    skipped = [_named(o.path, o.error) for o in outcomes if o.error is not None]
    if not good and not lost:
        if len(outcomes) == 1 and outcomes[0].error is not None:
            raise GpuidleError(outcomes[0].error or "unreadable trace")
        raise GpuidleError(f"none of the {len(outcomes)} files is a readable GPU trace; first: {skipped[0]}")
    host_side = sorted((o.host_side for o in lost if o.host_side is not None), key=lambda h: h.rank)
    for line in [f"skipped {x}" for x in skipped] + [_host_side_line(h, bool(good)) for h in host_side]:
        if warn:
            warn(line)
    _hosts_as_given([o for o in good if o.format == XSPACE_FORMAT])
    analyses = sorted((o.analysis for o in good if o.analysis is not None), key=lambda a: a.report.rank)
    analyses, duplicates = _dedupe_ranks(analyses, warn)
    job = job_report(analyses, duplicates, include_warmup) if len(analyses) > 1 else None
    reports = [a.report for a in analyses]
    read = good + lost
    advice = advise(reports, job, framework_of({o.framework for o in good}), include_warmup,
                    {a.report.rank: a.accumulation_repeats for a in analyses}) if reports else None
    return AnalysisReport(
        source=Source(paths=[str(p) for p in paths], format=_one({o.format for o in read}) or kineto.FORMAT,
                      skipped=skipped, framework=_one({o.framework for o in read})),
        ranks=reports, job=job, recommendations=advice.recommendations if advice else [],
        combined=advice.combined if advice else None, declined=advice.declined if advice else [],
        include_warmup=include_warmup, quality=job_quality([*reports, *host_side]), host_side=host_side,
    )


def _host_side_line(h: HostSide, others: bool) -> str:
    """The line that says a rank is reported from its host side alone, and why; ``others``: ranks were analysed
    beside it, whose figures it is not in."""
    return (f"rank {h.rank} ({h.path}): its device records were lost ({h.lost_launches} kernel launches with no "
            "kernel record): reported from its host side alone" + (", in no figure of the job" if others else ""))


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
