"""``gpuidle analyze`` over folders of jobs: one report per job, each in the ledger, and the fleet table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from gpuidle.cli.common import PIPED_WIDTH, emit, record_analysis, refuse_conflicting_formats, terminal_columns, warn
from gpuidle.errors import GpuidleError

if TYPE_CHECKING:
    from gpuidle import api
    from gpuidle.model import AnalysisReport

JOB_REPORT_EXTENSIONS = {"json": ".json", "md": ".md", "terminal": ".txt"}
"""The formats a job's report in ``--out-dir`` can take (an HTML page re-reads the traces: one job at a time)."""


def report_fleet(args: argparse.Namespace, jobs: api.Jobs, fmt: str) -> int:
    """Write each job's report (``--out-dir``), record each in the ledger, print the fleet table.

    Exit code 1 when a job, or a file of a job, could not be analysed; the table says which and why.
    """
    from gpuidle import api

    if args.html or args.annotate:
        raise GpuidleError("--html and --annotate take one job; these are folders of jobs",
                           "run gpuidle analyze on one job's folder for its page or annotated trace")
    if fmt == "html":
        raise GpuidleError("the fleet table is text or JSON", "give --out with .json or .txt, or --json")
    job_fmt = refuse_conflicting_formats(args) or "json"
    if job_fmt not in JOB_REPORT_EXTENSIONS:
        raise GpuidleError(f"--out-dir writes each job's report as json, md or terminal text, not {job_fmt}",
                           "run gpuidle analyze on one job's folder for its HTML page")
    out_dir = _out_dir(args.out_dir, args.paths) if args.out_dir else None
    written: dict[str, str] = {}
    run_ids: dict[str, int] = {}
    for job in jobs.results:
        if job.report is None:
            warn(f"{job.name}: not analysed: {job.error}")
            continue
        report = api.with_cost(job.report, args.price_per_gpu_hour, args.hours) \
            if args.price_per_gpu_hour is not None else job.report
        if out_dir is not None:
            written[job.name] = _write_job(out_dir, job.name, report, job_fmt, args.top)
        run_id = record_analysis(args, report, f"{args.label}/{job.name}" if args.label else job.name)
        if run_id is not None:
            run_ids[job.name] = run_id
    fleet = api.fleet_report(jobs.results, args.paths, args.hours, args.price_per_gpu_hour, written, run_ids)
    if fmt == "json":
        emit(fleet.to_json(indent=2) + "\n", args.out)
    else:
        from gpuidle.report.fleet import render_fleet

        emit(render_fleet(fleet, terminal_columns(PIPED_WIDTH) if args.out is None else None), args.out)
    incomplete = fleet.failed_jobs or any(j.skipped for j in fleet.jobs)
    return 1 if incomplete else 0


def _out_dir(folder: str, inputs: list[str]) -> Path:
    """The folder for the jobs' reports, made if missing; never inside an input (it would become a job)."""
    out = Path(folder).expanduser()
    for given in inputs:
        if "://" not in given and out.resolve().is_relative_to(Path(given).resolve()):
            raise GpuidleError(f"--out-dir {folder} is inside the input {given}: its reports would be read as a job",
                               "give a folder outside the inputs")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise GpuidleError(f"cannot make --out-dir {folder}: {err.strerror}") from None
    return out


def _write_job(out_dir: Path, name: str, report: AnalysisReport, fmt: str, top: int) -> str:
    from gpuidle.report.common import RenderOptions
    from gpuidle.report.registry import renderer_class

    path = out_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") + JOB_REPORT_EXTENSIONS[fmt])
    emit(renderer_class(fmt)().render(report, RenderOptions(top=top, color=False)), str(path))
    return str(path)
