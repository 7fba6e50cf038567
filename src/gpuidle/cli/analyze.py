"""``gpuidle analyze``: profiler traces in, the idle-time report out."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpuidle.cli.common import (
    Parser,
    add_ledger_option,
    emit,
    positive_float,
    positive_int,
    record_analysis,
    refuse_conflicting_formats,
    refuse_overwriting_inputs,
    render_options,
    warn,
)
from gpuidle.cli.scaleout import add_options as add_scale_out_options
from gpuidle.cli.scaleout import with_scale_out
from gpuidle.errors import GpuidleError
from gpuidle.report.registry import REPORT_FORMATS, format_for

if TYPE_CHECKING:
    from gpuidle import api
    from gpuidle.analysis.summary import RankAnalysis
    from gpuidle.model import AnalysisReport

PROGRESS_MIN_BYTES = 50 << 20
"""Show a progress bar when the traces to read are at least this big."""


def register(sub: argparse._SubParsersAction[Parser]) -> None:
    an = sub.add_parser("analyze", help="explain where GPU time goes: profiler traces and profiles, tracker runs",
                        description="Analyse one input or a job's per-rank inputs: PyTorch profiler traces "
                                    "(.json/.json.gz), JAX/TensorFlow XSpace profiles (.xplane.pb), Nsight Systems "
                                    "SQLite exports (.sqlite) or step-tracker folders (gpuidle.torch.StepTracker). "
                                    "nvidia-smi/DCGM utilization logs: gpuidle summarize LOG.",
                        epilog="Exit codes: 0 the report is complete; 1 a report was written, but it leaves out a "
                               "rank, file or job that could not be analysed, or gives a rank whose device records "
                               "were lost from its host side alone (each named on stderr); 2 bad input or usage, one "
                               "line on stderr.")
    an.add_argument("paths", nargs="+", metavar="PATH",
                    help="a file, or a folder with one file per rank; local, or a URL (s3://bucket/job/, "
                         "gs://, https://, any fsspec protocol installed)")
    an.add_argument("--json", action="store_true", help="print the JSON report (same as --format json)")
    an.add_argument("--format", choices=sorted(REPORT_FORMATS),
                    help="output format (default: terminal, or from --out's extension)")
    an.add_argument("--out", metavar="FILE",
                    help="write the report to FILE instead of stdout (.json, .md, .html, .txt choose the format)")
    an.add_argument("--top", type=positive_int, default=3, help="recommendations to show (default 3)")
    an.add_argument("--workers", type=positive_int, default=None,
                    help="processes for a folder of ranks (default: CPU count)")
    an.add_argument("--scheduler", metavar="ADDRESS",
                    help="run the per-rank work on this Dask scheduler (tcp://host:8786; default: "
                         "$DASK_SCHEDULER_ADDRESS, else scheduler-address in Dask's configuration, else this machine)")
    an.add_argument("--out-dir", metavar="DIR",
                    help="for a folder of jobs: write each job's report to DIR/JOB.json (.md, .txt with --format)")
    an.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    an.add_argument("--explain", action="store_true",
                    help="also list the fixes measured but not offered, each with the precondition that failed")
    an.add_argument("--include-warmup", action="store_true",
                    help="keep warm-up, profiler and outlier steps in per-step figures and gains "
                         "(default: steady-state steps only)")
    an.add_argument("--html", metavar="FILE",
                    help="also write a self-contained HTML report with plots (timeline, steps, ranks)")
    an.add_argument("--annotate", metavar="OUT",
                    help="also write the trace plus a gpuidle track of idle intervals by cause, for Perfetto UI "
                         "or chrome://tracing (gzip if OUT ends in .gz; for a folder: the lowest-utilization rank)")
    an.add_argument("--label", help="name this run in the ledger, e.g. 'num_workers 0->8' (for gpuidle compare)")
    an.add_argument("--notes", help="free text stored with the run in the ledger")
    an.add_argument("--batch-size", type=positive_int, default=None,
                    help="batch size per GPU, stored in the ledger so compare can tell unlike runs apart")
    an.add_argument("--price-per-gpu-hour", type=positive_float, metavar="PRICE",
                    help="add the cost of the idle time (GPU-hours and money) to the report")
    an.add_argument("--hours", type=positive_float, default=1.0,
                    help="training hours the cost is computed for (default 1: cost per hour)")
    add_scale_out_options(an)
    add_ledger_option(an)
    an.set_defaults(func=run)


@contextmanager
def _progress(paths: Sequence[str], enabled: bool) -> Iterator[api.Progress | None]:
    """A rich progress bar on stderr, for big inputs on a terminal only."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from gpuidle import api

    try:
        size = sum(api.input_size(f) for job in api.plan_inputs(paths).jobs for f in job.files)
    except GpuidleError:
        size = 0
    if size < PROGRESS_MIN_BYTES:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  transient=True, console=Console(stderr=True)) as bar:
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(os.path.basename(what), total=total)
            bar.update(tasks[what], completed=done, total=total)

        yield update


def run(args: argparse.Namespace) -> int:
    """Exit code 0, or 1 when the report is incomplete: it leaves out a rank, a file or a job that could not be
    analysed, or reports a rank whose device records were lost from its host side alone."""
    from gpuidle import api

    fmt = format_for(REPORT_FORMATS, refuse_conflicting_formats(args), args.out)
    outputs = {"--out": args.out, "--html": args.html, "--annotate": args.annotate}
    refuse_overwriting_inputs(args.paths, outputs)
    with _progress(args.paths, not args.no_progress) as progress:
        try:
            jobs = api.analyze_jobs(args.paths, workers=args.workers, progress=progress, warn=warn,
                                    include_warmup=args.include_warmup, scheduler=args.scheduler)
        except GpuidleError:
            if len(args.paths) == 1 and _counter_log(args.paths[0]):
                raise GpuidleError(f"{args.paths[0]}: a GPU counter log (nvidia-smi, dmon, DCGM or Prometheus), "
                                   "not a profiler trace", f"gpuidle summarize {args.paths[0]} reads it") from None
            raise
    if jobs.fleet:
        from gpuidle.cli.fleet import report_fleet

        if args.scale_to is not None:
            raise GpuidleError("--scale-to is for one job; this is a folder of jobs", "give one job's folder")
        return report_fleet(args, jobs, fmt)
    if args.out_dir:
        raise GpuidleError("--out-dir is for a folder of jobs; this is one job", "give --out FILE instead")
    report = jobs.results[0].report
    assert report is not None  # one job alone raises rather than return no report
    return _report_job(args, report, fmt, jobs.results[0].analyses)


COUNTER_LOG_MAX_BYTES = 64 << 20
"""A file refused as a trace is tried as a counter log only up to this size, on disk and decompressed: the try
reads it whole (a gzip bomb refused as a trace must not be inflated whole as a log)."""


def _counter_log(path: str) -> bool:
    """Whether ``path`` is a GPU counter log (nvidia-smi CSV or dmon, DCGM, gpuidle's JSONL) that summarize reads."""
    from gpuidle import api

    try:
        if not os.path.isfile(path):
            return False
        api.summarize_log(path, max_bytes=COUNTER_LOG_MAX_BYTES)
    except Exception:  # any failure to read it as a log: the trace's own error stands, never a traceback
        return False
    return True


def _explain(report: AnalysisReport) -> None:
    """The fixes not offered, one line per fix and failed precondition with the ranks it failed on."""
    from gpuidle.report.text import printable

    ranks: dict[tuple[str, str], list[int]] = {}
    for d in report.declined:
        ranks.setdefault((d.id, d.check), []).append(d.rank)
    print("not offered:" if ranks else "not offered: none (every fix measured had its preconditions)")
    for (rule, check), where in ranks.items():
        on = f"rank {where[0]}" if len(where) == 1 else f"ranks {', '.join(map(str, sorted(set(where))))}"
        print(printable(f"  {rule} ({on}): needs {check}"))


def _report_job(args: argparse.Namespace, report: AnalysisReport, fmt: str,
                analyses: Sequence[RankAnalysis] = ()) -> int:
    from gpuidle import api
    from gpuidle.report.common import RenderOptions

    outputs = {"--out": args.out, "--html": args.html, "--annotate": args.annotate}
    refuse_overwriting_inputs(api.analysis_inputs(report), outputs)  # the traces found in a folder
    given = [o for o, v in (("--price-per-gpu-hour", args.price_per_gpu_hour), ("--scale-to", args.scale_to))
             if v is not None]
    if given and not report.ranks:  # the host's side alone: the report is still worth printing
        warn(f"{' and '.join(given)} left out: {'they need' if len(given) > 1 else 'it needs'} the device's figures, "
             "and the trace's device records were lost")
    elif args.price_per_gpu_hour is not None:
        report = api.with_cost(report, args.price_per_gpu_hour, args.hours)
    if report.ranks:
        report = with_scale_out(args, report)
    options = render_options(args, args.out is None and sys.stdout.isatty(), top=args.top)
    pages = [args.html] if args.html else []
    if fmt == "html":
        pages.insert(0, args.out)
    else:
        from gpuidle.report.registry import renderer_class

        emit(renderer_class(fmt)().render(report, options), args.out)
    if args.explain:
        _explain(report)
    if pages or args.annotate:
        timeline = api.timeline_for(report, analyses=analyses) if report.ranks else None
        if timeline is not None and timeline.note:
            from gpuidle.report.text import printable

            print(printable(f"gpuidle: timeline of {timeline.path}: {timeline.note}"), file=sys.stderr)
        if pages:
            from gpuidle.report import html

            page = html.render_report(report, timeline, RenderOptions(top=args.top))
            for out in pages:
                emit(page, out)
        if args.annotate and timeline is None:
            warn(f"{args.annotate} not written: the trace holds no device activity to mark idle time on")
        elif args.annotate and timeline is not None:
            api.annotate_trace(timeline.path, args.annotate, timeline)
    record_analysis(args, report, args.label)
    return 1 if report.source.skipped or report.host_side else 0
