"""What each input is, and which reader takes it: the one place that decides.

- A step tracker's folder or log (``gpuidle.torch.StepTracker``): the tracker reader, in this process.
- A trace file, or a folder (or prefix) with trace files directly inside: one job, each file a rank
  (or, for an Nsight export, several), read by the per-rank work on the executor; the format of each
  file is told by its content there (:func:`gpuidle.sources.formats.read_timelines`).
- A folder (or prefix) with no trace file directly inside, whose subfolders each hold traces or tracker
  output: a folder of jobs, each subfolder one job, named by the subfolder. Subfolders without either
  are not jobs and are left out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from gpuidle.errors import GpuidleError, InputNotFound
from gpuidle.sources import inputs, tracker
from gpuidle.sources.formats import find_trace_files


class JobInput(msgspec.Struct, frozen=True):
    """One job: what was given for it, and its trace files (none for tracker output)."""

    name: str
    paths: list[str]
    files: list[str] = msgspec.field(default_factory=list)
    tracker: bool = False


class InputPlan(msgspec.Struct, frozen=True):
    jobs: list[JobInput]
    fleet: bool
    """Given folders of jobs: one report per job, and a fleet table."""


def plan_inputs(paths: Sequence[str | Path]) -> InputPlan:
    """The jobs in ``paths``: several paths are the ranks of one job, unless each is a folder of jobs."""
    given = [str(p) for p in paths]
    if any(_is_tracker(p) for p in given):
        return InputPlan([JobInput(_name(given[0]), given, tracker=True)], fleet=False)
    files: list[str] = []
    jobs: list[JobInput] = []
    job_traces: list[str] = []
    for p in given:
        try:
            found = find_trace_files(p)
        except InputNotFound:
            inside = job_folders(p)
            if not inside:
                raise
            jobs.extend(inside)
            continue
        files.extend(found)
        job_traces.append(p)
    if jobs and job_traces:
        raise GpuidleError(f"{_shown(job_traces[0])} holds one job's traces, but another input is a folder of jobs",
                           "give folders of jobs, or one job's traces, not both")
    if jobs:
        return InputPlan(_named_once(jobs), fleet=True)
    return InputPlan([JobInput(_name(given[0]), given, files)], fleet=False)


def job_folders(path: str) -> list[JobInput]:
    """The subfolders of ``path`` that are jobs: with trace files, or a step tracker's output, directly inside."""
    jobs = []
    for sub in inputs.list_folders(path):
        if _is_tracker(sub):
            jobs.append(JobInput(_name(sub), [sub], tracker=True))
            continue
        try:
            jobs.append(JobInput(_name(sub), [sub], find_trace_files(sub)))
        except InputNotFound:
            continue
    return jobs


def _named_once(jobs: list[JobInput]) -> list[JobInput]:
    """Jobs of the same name in two folders of jobs: the later ones get ``~2``, ``~3``."""
    seen: dict[str, int] = {}
    out = []
    for job in jobs:
        seen[job.name] = seen.get(job.name, 0) + 1
        n = seen[job.name]
        out.append(job if n == 1 else JobInput(f"{job.name}~{n}", job.paths, job.files, job.tracker))
    return out


def _is_tracker(path: str) -> bool:
    return not inputs.is_url(path) and tracker.is_tracker_path(path)


def _name(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or path


def _shown(path: str) -> str:
    return inputs.display(path) if inputs.is_url(path) else path
