"""The library face of gpuidle: everything the CLI does, callable from Python.

>>> from gpuidle.api import analyze
>>> report = analyze(["run/traces/"])          # doctest: +SKIP
>>> report.ranks[0].devices[0].utilization     # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import msgspec

from gpuidle import notebook
from gpuidle.analysis.summary import RankAnalysis
from gpuidle.errors import GpuidleError, InputNotFound, NotATrace
from gpuidle.idle_timelines import annotate_trace, idle_timeline, timeline_for
from gpuidle.jobs.contract import Progress
from gpuidle.jobs.executors import executor_for
from gpuidle.jobs.merge import merge_job
from gpuidle.jobs.plan import plan_inputs
from gpuidle.jobs.rank import RankOutcome
from gpuidle.model import (
    AnalysisReport,
    CommFit,
    Comparison,
    FleetJob,
    FleetReport,
    StepSeries,
    UtilizationReport,
)
from gpuidle.sources import inputs, tracker
from gpuidle.sources.formats import (
    TRACE_SUFFIXES,
    find_trace_files,
    input_size,
    looks_like_trace,
    read_timelines,
)

if TYPE_CHECKING:
    from gpuidle import ledger
    from gpuidle.analysis import compare as comparison

__all__ = [
    "TRACE_SUFFIXES", "Input", "Inputs", "JobResult", "Jobs", "Progress", "analysis_inputs", "analyze",
    "analyze_jobs", "analyze_series", "analyze_tracker", "annotate_trace", "as_inputs", "compare_runs",
    "describe_inputs", "find_trace_files", "fleet_report", "idle_timeline", "input_size", "load_run", "plan_inputs",
    "read_timelines", "record_analysis", "summarize_log", "timeline_for", "utilization_facts", "with_cost",
    "with_scale_out",
]

# Commands import this module whole; what only some of them use (the ledger, counter logs,
# tracker jobs, comparisons, annotated traces, worker processes) is imported where used.

Input: TypeAlias = str | os.PathLike[str]
"""One input: a local path (file or folder) or a URL (``s3://bucket/job/``)."""
Inputs: TypeAlias = Input | Sequence[Input]
"""One input, or several (the ranks of a job)."""


def as_inputs(paths: Inputs) -> list[str]:
    """A list of inputs from one or many: a single string is one input, never its characters. An empty one (an
    unset shell variable) is refused: as a path it would be the current folder."""
    given = [os.fspath(paths)] if isinstance(paths, str | os.PathLike) else [os.fspath(p) for p in paths]
    if any(not str(p).strip() for p in given):
        raise InputNotFound("an empty path", "give a trace file or a folder of them")
    return given


def analyze(
    paths: Inputs,
    workers: int | None = None,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
    include_warmup: bool = False,
    scheduler: str | None = None,
) -> notebook.AnalysisReport:
    """Analyse one trace or a job (a folder of per-rank traces, or several files).

    Per-step figures and gains use the steady-state steps (steps marked ``excluded``, as
    warm-up, profiler or outlier, left out) unless ``include_warmup``.

    Files are analysed one per worker process (at most ``workers``, default the CPU
    count), so the parent holds only the small per-rank results; given a Dask
    ``scheduler`` address (or ``DASK_SCHEDULER_ADDRESS``, or Dask's configuration), one
    task per file on that cluster instead. A file that cannot be read is skipped with a
    warning when others remain; alone, it raises. A folder the in-process tracker wrote
    (``gpuidle.torch.StepTracker``) is read as such. A folder of jobs is refused here:
    :func:`analyze_jobs` takes it.
    """
    paths = as_inputs(paths)
    planned = plan_inputs(paths)
    if planned.fleet:
        raise GpuidleError(f"{paths[0]} is a folder of jobs ({len(planned.jobs)} found), not one job's traces",
                           "analyse it with analyze_jobs (on the command line, gpuidle analyze takes both)")
    return _one_job(paths, planned.jobs[0].files, planned.jobs[0].tracker, workers, progress, warn, include_warmup,
                    scheduler)[0]


def _one_job(paths: list[str], files: Sequence[str], tracked: bool, workers: int | None, progress: Progress | None,
             warn: Callable[[str], None] | None, include_warmup: bool,
             scheduler: str | None) -> tuple[notebook.AnalysisReport, tuple[RankAnalysis, ...]]:
    """One job's report and the per-rank results it was merged from."""
    if tracked:
        return analyze_tracker(paths, warn, include_warmup), ()
    outcomes = executor_for(scheduler, workers).run(files, progress)
    report = notebook.public(merge_job(paths, outcomes, warn, include_warmup))
    return report, tuple(o.analysis for o in outcomes if o.analysis is not None)


class JobResult(msgspec.Struct, frozen=True):
    """One job of a submit: its report, or the one line saying why it has none."""

    name: str
    path: str
    report: AnalysisReport | None
    error: str | None = None
    analyses: tuple[RankAnalysis, ...] = ()
    """The per-rank results the report was merged from: what the job's timeline needs (:func:`timeline_for`),
    so no trace is analysed again, on the client or anywhere."""


class Jobs(msgspec.Struct, frozen=True):
    fleet: bool
    """The inputs were folders of jobs (one report per job, and a fleet table), not one job."""
    results: list[JobResult]


def analyze_jobs(
    paths: Inputs,
    workers: int | None = None,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
    include_warmup: bool = False,
    scheduler: str | None = None,
) -> Jobs:
    """Analyse one job, or every job of folders of jobs (see :mod:`gpuidle.jobs.plan` for which is which).

    Every rank of every job goes to the executor in one submit; each job is then merged alone. In a
    folder of jobs, a job none of whose files can be read is that job's error, and the others go on;
    one job alone raises as :func:`analyze` does.
    """
    paths = as_inputs(paths)
    planned = plan_inputs(paths)
    if not planned.fleet:
        job = planned.jobs[0]
        report, analyses = _one_job(paths, job.files, job.tracker, workers, progress, warn, include_warmup, scheduler)
        return Jobs(False, [JobResult(job.name, str(paths[0]), report, analyses=analyses)])
    files = [f for job in planned.jobs for f in job.files]
    by_file: dict[str, list[RankOutcome]] = {}
    for o in executor_for(scheduler, workers).run(files, progress) if files else []:
        by_file.setdefault(o.path, []).append(o)
    results = []
    for job in planned.jobs:
        said = (lambda line, name=job.name: warn(f"{name}: {line}")) if warn else None
        try:
            report = analyze_tracker(job.paths, said, include_warmup) if job.tracker else \
                notebook.public(merge_job(job.paths, [o for f in job.files for o in by_file.get(f, [])], said,
                                          include_warmup))
        except GpuidleError as err:
            results.append(JobResult(job.name, job.paths[0], None, str(err)))
            continue
        results.append(JobResult(job.name, job.paths[0], report))
    return Jobs(True, results)


def fleet_report(jobs: Sequence[JobResult], paths: Sequence[str | Path], hours: float = 1.0,
                 price_per_gpu_hour: float | None = None, written: dict[str, str] | None = None,
                 run_ids: dict[str, int] | None = None) -> FleetReport:
    """The fleet table of analysed jobs: per job its GPUs, utilization, GPU-hours idle by cause per ``hours``
    of training and top fix; the fleet's GPU-hours per cause, and their cost at ``price_per_gpu_hour``.
    ``written`` and ``run_ids`` (by job name) say where each job's report went."""
    from gpuidle.advice import fleet

    rows = []
    for j in jobs:
        row = fleet.fleet_job(j.name, j.path, j.report, hours) if j.report is not None else \
            FleetJob(name=j.name, path=j.path, error=j.error)
        rows.append(msgspec.structs.replace(row, report=(written or {}).get(j.name),
                                            run_id=(run_ids or {}).get(j.name)))
    return fleet.fleet_report([str(p) for p in paths], rows, hours, price_per_gpu_hour)


def summarize_log(path: str | Path, fields: Sequence[str] | None = None, interval_s: float | None = None,
                  devices: Sequence[int] | None = None, steps_per_s: float | None = None,
                  max_bytes: int | None = None) -> UtilizationReport:
    """A utilization log (nvidia-smi CSV or dmon, or gpuidle's own JSONL) in, the utilization summary out;
    ``max_bytes``: the most it may hold, decompressed (default :data:`gpuidle.sources.smi.MAX_LOG_BYTES`)."""
    from gpuidle.advice.utilization import build_report as build_utilization_report
    from gpuidle.analysis.counters import UtilOptions
    from gpuidle.analysis.utilization import analyze as analyze_utilization
    from gpuidle.sources import smi

    series = smi.read(path, fields, interval_s, smi.MAX_LOG_BYTES if max_bytes is None else max_bytes)
    analysis = analyze_utilization(series, UtilOptions(devices=devices, steps_per_s=steps_per_s))
    return build_utilization_report(series, analysis, steps_per_s)


def with_cost(report: AnalysisReport, price_per_gpu_hour: float, hours: float = 1.0) -> notebook.AnalysisReport:
    """The report with its cost: GPU-hours and money lost to idle time per ``hours`` of training,
    and what reaching 90 % utilization would save (formulas in ``advice.calc``)."""
    from gpuidle.advice import calc

    return notebook.public(msgspec.structs.replace(report, cost=calc.cost_from_report(report, price_per_gpu_hour,
                                                                                     hours)))


def with_scale_out(report: AnalysisReport, gpus: int, *, dim: str = "dp", strong: bool = False,
                   gpus_per_node: int = 8, params: int | None = None, allreduce_results: Input | None = None,
                   inter_node_gbps: float | None = None, batch_size: int | None = None) -> notebook.AnalysisReport:
    """The report with ``scale_out``: the job's step, utilization and samples/s at ``gpus`` GPUs, each a range with
    its assumptions, and the sentence that says what stops it scaling (the model in ``advice.scaleout``).

    ``strong``: the global batch is kept (default: the per-GPU batch); ``allreduce_results``: a ``gpuidle bench
    allreduce --json`` file whose all-reduce gives α and the bandwidth (default: fitted on the trace's own
    collectives); ``params``: the parameter count, for a trace with no collective to size the gradient from;
    ``batch_size``: the per-GPU batch, for samples/s.
    """
    from gpuidle.advice.scaleout import ScaleOptions, scale_out

    link = _allreduce_link(allreduce_results) if allreduce_results is not None else None
    opt = ScaleOptions(gpus=gpus, dim=dim, strong=strong, gpus_per_node=gpus_per_node, params=params, link=link,
                       inter_node_gbps=inter_node_gbps, batch_per_gpu=batch_size)
    return notebook.public(msgspec.structs.replace(report, scale_out=scale_out(report, opt)))


def _allreduce_link(path: Input) -> CommFit:
    from gpuidle.probes.allreduce import AllReduceResult
    from gpuidle.probes.training import ring_fit

    data = inputs.read_bytes(str(path))
    try:
        result = msgspec.json.decode(data, type=AllReduceResult)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise GpuidleError(f"{path} is not gpuidle bench allreduce --json output: {err}",
                           "gpuidle bench allreduce --json > allreduce.json") from None
    got = ring_fit(result)
    if got is None:
        raise GpuidleError(f"{path}: the all-reduce's time does not grow with its size, or ran on one rank: "
                           "no bandwidth to take", "measure larger sizes on 2 or more ranks (--max-bytes)")
    return CommFit(alpha_s=got[0], busbw_gbps=got[1], source="allreduce results", sizes=len(result.rows))


# ----------------------------------------------------------------------------------
# The in-process tracker's runs
# ----------------------------------------------------------------------------------


def analyze_tracker(paths: Inputs, warn: Callable[[str], None] | None = None,
                    include_warmup: bool = False) -> notebook.AnalysisReport:
    """Folders (or rank logs) written by ``gpuidle.torch.StepTracker``: the same report as for traces.

    Every rank's log present: the report is derived from them. Some missing (written on
    another node) and rank 0's summary here: the summary, which covers every rank.
    """
    paths = as_inputs(paths)
    others = [str(p) for p in paths if not tracker.is_tracker_path(p)]
    if others:
        raise GpuidleError(f"{others[0]}: not tracker output, given with a tracker folder",
                           "analyse profiler traces and tracker folders separately")
    run = tracker.read(paths)
    for line in run.skipped:
        if warn:
            warn(f"skipped {line}")
    series: dict[int, StepSeries] = {}
    duplicates: list[int] = []
    for s in run.series:
        if s.rank in series:
            duplicates.append(s.rank)
            if warn:
                warn(f"rank {s.rank} appears twice ({series[s.rank].path}, {s.path}): the second is ignored")
            continue
        series[s.rank] = s
    world = max((s.world_size for s in series.values()), default=0)
    if run.summary is not None and len(run.summary.ranks) > len(series):
        return notebook.public(run.summary)
    if not series:
        raise InputNotFound(f"{', '.join(str(p) for p in paths)}: no tracker log with steps")
    return analyze_series([series[r] for r in sorted(series)], [str(p) for p in paths], run.skipped,
                          sorted(set(duplicates)), world, include_warmup)


def analyze_series(
    series: Sequence[StepSeries], paths: Sequence[str], skipped: Sequence[str] = (),
    duplicates: Sequence[int] = (), world_size: int | None = None, include_warmup: bool = False,
) -> notebook.AnalysisReport:
    """The report of the tracker's steps, one series per rank; the advice rules apply unchanged."""
    from gpuidle.advice.series_report import series_report

    return notebook.public(series_report(series, paths, skipped, duplicates, world_size, include_warmup))


# ----------------------------------------------------------------------------------
# The ledger and comparisons
# ----------------------------------------------------------------------------------


def analysis_inputs(report: AnalysisReport) -> list[str]:
    """The files an analysis read: each trace of each folder it was given."""
    files: list[str] = []
    for p in report.source.paths:
        try:
            files.extend(find_trace_files(p))
        except GpuidleError:
            files.append(p)
    return files


def describe_inputs(paths: Inputs) -> list[ledger.InputFile]:
    """What the ledger keeps of each input: a local file's path, size and SHA-256; a URL's address
    (credentials removed), size and ETag, from its metadata (the object is not read again)."""
    from gpuidle import ledger

    paths = as_inputs(paths)
    described: list[ledger.InputFile] = []
    for p in paths:
        if not inputs.is_url(p):
            described.append(ledger.describe_input(p))
            continue
        try:
            remote = inputs.describe(str(p))
        except GpuidleError:
            described.append(ledger.InputFile(inputs.display(str(p)), None, None))
            continue
        described.append(ledger.InputFile(remote.url, remote.size, None, remote.etag))
    return described


def utilization_facts(report: UtilizationReport) -> ledger.Facts:
    """What the ledger keeps beside a utilization summary: the GPUs sampled and their mean utilization.

    A run without GPU samples (no NVML, CPU only) has none of these.
    """
    from gpuidle import ledger

    devices = report.devices
    if not devices:
        return ledger.Facts()
    names = sorted({d.name for d in devices if d.name})
    return ledger.Facts(gpu_model=", ".join(names) if names else None, gpu_count=len(devices),
                        utilization=sum(d.mean_util_pct for d in devices) / len(devices) / 100.0)


def record_analysis(
    report: AnalysisReport,
    label: str | None = None,
    notes: str | None = None,
    batch_size: int | None = None,
    ledger_path: str | Path | None = None,
    kind: str = "analyze",
) -> int:
    """Record an analysis in the ledger (default: :func:`gpuidle.ledger.default_path`); return the run id.

    :raises GpuidleError: a report without device figures (every rank's device records lost): nothing to compare.
    """
    from gpuidle import ledger

    if not report.ranks:
        raise GpuidleError("a report without device figures (its device records were lost) is not recorded: "
                           "nothing in it to compare")

    facts = ledger.analysis_facts(report)
    facts.update(ledger.Facts(notes=notes, batch_size=batch_size))
    return ledger.record(kind, msgspec.json.encode(report), label, describe_inputs(analysis_inputs(report)),
                         path=ledger_path, **facts)


def read_analysis_report(path: str | Path,
                         hint: str = "write one with: gpuidle analyze TRACES --json --out report.json"
                         ) -> notebook.AnalysisReport:
    """A ``gpuidle analyze --json`` report (a regular file or a URL: a FIFO would block, ``/dev/zero`` never
    end), or a one-line error with ``hint``: what to give instead. Every command reads a report through it."""
    shown = inputs.display(str(path)) if inputs.is_url(path) else str(path)
    data = inputs.read_bytes(path)
    try:
        return notebook.AnalysisReport.from_json(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise NotATrace(f"{shown}: not a gpuidle JSON report ({err})", hint) from None


def load_run(ref: str, ledger_path: str | Path | None = None) -> tuple[notebook.AnalysisReport, comparison.RunInfo]:
    """A run by JSON report path, ledger id, or label (the newest run with that label)."""
    from gpuidle import ledger
    from gpuidle.analysis import compare as comparison

    if inputs.is_url(ref) or Path(ref).is_file():
        shown = inputs.display(ref) if inputs.is_url(ref) else ref
        try:
            report = read_analysis_report(ref, "give a report written by gpuidle analyze --json, a run id or a label")
        except NotATrace:
            if looks_like_trace(ref):
                raise GpuidleError(f"{shown} is a profiler trace, not an analysis",
                                   f"run gpuidle analyze {shown} first (it records the run), then compare "
                                   "run ids or labels, or reports written by gpuidle analyze --json") from None
            raise
        if not report.ranks:
            raise GpuidleError(f"{shown}: a report without device figures (its device records were lost): nothing "
                               "to compare", "compare reports of traces that kept their device records")
        return notebook.public(report), comparison.RunInfo(ref=shown)
    path = Path(ledger_path).expanduser() if ledger_path is not None else ledger.default_path()
    if not ledger.exists(path):
        raise GpuidleError(f"{ref!r} is neither a report file nor a recorded run (no ledger at {path} yet)",
                           "gpuidle analyze records runs; gpuidle history lists them")
    with ledger.Ledger.for_reading(path) as book:
        run = book.find(ref)
    info = comparison.RunInfo(ref=f"run {run.id}", label=run.label, batch_size=run.batch_size, gpu_model=run.gpu_model)
    return notebook.public(run.analysis()), info


def compare_runs(
    before: str,
    after: str,
    ledger_path: str | Path | None = None,
    price_per_gpu_hour: float | None = None,
    steps: int | None = None,
) -> tuple[Comparison, notebook.AnalysisReport, notebook.AnalysisReport]:
    """Compare two runs (report paths, ledger ids or labels); also returns both reports, for renderers."""
    from gpuidle.analysis import compare as comparison

    a, a_info = load_run(before, ledger_path)
    b, b_info = load_run(after, ledger_path)
    return comparison.compare(a, b, a_info, b_info, price_per_gpu_hour, steps), a, b
