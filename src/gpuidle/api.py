"""The library face of gpuidle: everything the CLI does, callable from Python.

>>> from gpuidle.api import analyze
>>> report = analyze(["run/traces/"])          # doctest: +SKIP
>>> report.ranks[0].devices[0].utilization     # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from gpuidle.advice.rules import rank_by_gain, recommend, straggler_recommendations
from gpuidle.analysis.ranks import job_report
from gpuidle.analysis.summary import RankAnalysis, summarize_rank
from gpuidle.errors import GpuidleError, InputNotFound
from gpuidle.model import AnalysisReport, Recommendation, Source
from gpuidle.sources import kineto

TRACE_SUFFIXES = (".json", ".json.gz")

Progress = Callable[[str, int, int], None]
"""``(what, done, total)``: bytes of one file, or files of a job."""


def find_trace_files(path: str | Path) -> list[str]:
    """One file, or the trace files (``*.json``, ``*.json.gz``) directly inside a folder."""
    p = Path(path)
    if not p.exists():
        raise InputNotFound(f"{p}: no such file or folder")
    if p.is_file():
        return [str(p)]
    files = sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise InputNotFound(f"{p}: no trace files (*.json, *.json.gz) in this folder",
                            "point at the folder torch.profiler.tensorboard_trace_handler wrote")
    return files


@dataclass(frozen=True, slots=True)
class _Outcome:
    path: str
    analysis: RankAnalysis | None
    error: str | None


def _analyze_file(path: str) -> _Outcome:
    try:
        return _Outcome(path, summarize_rank(kineto.read(path)), None)
    except GpuidleError as err:
        return _Outcome(path, None, str(err))


def analyze_file(path: str, progress: Progress | None = None) -> RankAnalysis:
    """One trace file, in this process. Raises :class:`GpuidleError` on bad input."""
    on_bytes = (lambda done, total: progress(path, done, total)) if progress else None
    return summarize_rank(kineto.read(path, on_bytes))


def analyze(
    paths: Sequence[str | Path],
    workers: int | None = None,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
) -> AnalysisReport:
    """Analyse one trace or a job (a folder of per-rank traces, or several files).

    Files are analysed one per worker process (at most ``workers``, default the CPU
    count), so the parent holds only the small per-rank results. A file that cannot
    be read is skipped with a warning when others remain; alone, it raises.
    """
    files = [f for p in paths for f in find_trace_files(p)]
    outcomes = _run(files, workers, progress)
    good = [o for o in outcomes if o.analysis is not None]
    skipped = [f"{o.path}: {o.error}" for o in outcomes if o.error is not None]
    if not good:
        if len(outcomes) == 1:
            raise GpuidleError(outcomes[0].error or "unreadable trace")
        raise GpuidleError(f"none of the {len(files)} files is a readable GPU trace; first: {skipped[0]}")
    for line in skipped:
        if warn:
            warn(f"skipped {line}")
    analyses = sorted((o.analysis for o in good if o.analysis is not None), key=lambda a: a.report.rank)
    analyses, duplicates = _dedupe_ranks(analyses, warn)
    job = job_report(analyses, duplicates) if len(analyses) > 1 else None
    recs: list[Recommendation] = []
    for a in analyses:
        recs.extend(recommend(a.report, a.accumulation_repeats))
    if job is not None:
        recs.extend(straggler_recommendations(job, [a.report for a in analyses]))
    return AnalysisReport(
        source=Source(paths=[str(p) for p in paths], format=kineto.FORMAT, skipped=skipped),
        ranks=[a.report for a in analyses],
        job=job,
        recommendations=_merge_across_ranks(recs),
    )


def _run(files: list[str], workers: int | None, progress: Progress | None) -> list[_Outcome]:
    if len(files) == 1:
        try:
            return [_Outcome(files[0], analyze_file(files[0], progress), None)]
        except GpuidleError as err:
            return [_Outcome(files[0], None, str(err))]
    n = max(1, min(workers or os.cpu_count() or 1, len(files)))
    out: list[_Outcome] = []
    with ProcessPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(_analyze_file, f) for f in files]
        for done, fut in enumerate(as_completed(futures), 1):
            out.append(fut.result())
            if progress:
                progress("ranks", done, len(files))
    return sorted(out, key=lambda o: o.path)


def _dedupe_ranks(
    analyses: list[RankAnalysis], warn: Callable[[str], None] | None,
) -> tuple[list[RankAnalysis], list[int]]:
    """Keep the first file of each rank; report the rank numbers seen twice."""
    seen: dict[int, RankAnalysis] = {}
    duplicates: list[int] = []
    for a in analyses:
        r = a.report.rank
        if r in seen:
            duplicates.append(r)
            if warn:
                warn(f"rank {r} appears twice ({seen[r].report.path}, {a.report.path}): the second is ignored")
            continue
        seen[r] = a
    return list(seen.values()), sorted(set(duplicates))


def _merge_across_ranks(recs: list[Recommendation]) -> list[Recommendation]:
    """One recommendation per id: the rank where it gains most, with every rank it applies to."""
    best: dict[str, Recommendation] = {}
    ranks: dict[str, list[int]] = {}
    for r in recs:
        ranks.setdefault(r.id, []).append(r.rank if r.rank is not None else 0)
        if r.id not in best or r.gain.step_s_saved > best[r.id].gain.step_s_saved:
            best[r.id] = r
    for rid, r in best.items():
        if len(ranks[rid]) > 1:
            r.evidence["ranks"] = sorted(set(ranks[rid]))
    return rank_by_gain(list(best.values()))
