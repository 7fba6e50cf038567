"""Read the in-process step tracker's output into :class:`~gpuidle.model.StepSeries`.

A tracker folder holds ``rank-<r>.jsonl`` from every rank that writes there and, from
rank 0, ``gpuidle-summary.json``. The logs are the raw capture, one step per line; the
summary is the report rank 0 derived from every rank's steps when the tracker closed.
The logs are preferred when every rank's is at hand (the analysis can have improved since
the run); the summary stands in for ranks whose logs are on another node's disk.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from gpuidle.errors import CorruptInput, InputNotFound, NotATrace
from gpuidle.model import (
    TRACKER_FORMAT,
    TRACKER_SOURCE,
    TRACKER_SUMMARY,
    AnalysisReport,
    StepSeries,
    TrackerEnd,
    TrackerHeader,
    TrackerLine,
    TrackerStep,
)
from gpuidle.sources.inputs import read_bytes
from gpuidle.sources.job_facts import MAX_WORLD, checked_facts

FORMAT = TRACKER_SOURCE
RANK_LOG = re.compile(r"rank-(\d+)\.jsonl")
_decoder = msgspec.json.Decoder(TrackerLine)


def is_tracker_path(path: str | Path) -> bool:
    """A tracker folder (a summary or a rank log inside), a rank log, or the summary itself.

    A path that cannot be read is not: the trace reader then says why it cannot be read.
    """
    try:
        return _is_tracker_path(Path(path))
    except OSError:
        return False


def _is_tracker_path(p: Path) -> bool:
    if p.is_dir():
        return (p / TRACKER_SUMMARY).is_file() or any(RANK_LOG.fullmatch(f.name) for f in p.iterdir())
    if not p.is_file():
        return False
    if p.name == TRACKER_SUMMARY:
        return True
    if not p.name.endswith(".jsonl"):
        return False
    with open(p, "rb") as f:
        first = f.readline()
    try:
        head = _decoder.decode(first)
    except msgspec.DecodeError:
        return False
    return isinstance(head, TrackerHeader)


class TrackerRun(msgspec.Struct, frozen=True):
    """What the paths held: the ranks' series, rank 0's summary if found, and files skipped."""

    series: list[StepSeries]
    summary: AnalysisReport | None
    skipped: list[str]


def read(paths: Sequence[str | Path]) -> TrackerRun:
    """Every rank log and summary in ``paths`` (folders or files)."""
    logs: list[Path] = []
    summaries: list[Path] = []
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise InputNotFound(f"{p}: no such file or folder")
        if p.is_dir():
            logs.extend(sorted((f for f in p.iterdir() if RANK_LOG.fullmatch(f.name)), key=_rank_of))
            if (p / TRACKER_SUMMARY).is_file():
                summaries.append(p / TRACKER_SUMMARY)
        elif p.name == TRACKER_SUMMARY:
            summaries.append(p)
        else:
            logs.append(p)
    series: list[StepSeries] = []
    skipped: list[str] = []
    for f in logs:
        try:
            series.append(read_log(f))
        except (CorruptInput, NotATrace, InputNotFound) as err:
            if len(logs) == 1:
                raise
            skipped.append(f"{f}: {err}")
    summary = read_summary(summaries[0]) if summaries else None
    return TrackerRun(series=series, summary=summary, skipped=skipped)


def _rank_of(f: Path) -> int:
    m = RANK_LOG.fullmatch(f.name)
    return int(m.group(1)) if m else -1


def read_summary(path: str | Path) -> AnalysisReport:
    try:
        return AnalysisReport.from_json(read_bytes(path))
    except msgspec.DecodeError as err:
        raise CorruptInput(f"{path}: not a gpuidle report ({err})", "rerun the job, or analyse the rank logs") from None


def read_log(path: str | Path) -> StepSeries:
    """One rank's log. A last line cut short (the job was killed mid-write) is dropped, with a note."""
    p = Path(path)
    raw = read_bytes(p).split(b"\n")  # a regular file only: a FIFO named rank-0.jsonl would block
    lines = [x for x in raw if x.strip()]
    if not lines:
        raise NotATrace(f"{p}: empty file", "a tracker log starts with a header line")
    try:
        head = _decoder.decode(lines[0])
    except msgspec.DecodeError:
        head = None
    if not isinstance(head, TrackerHeader):
        raise NotATrace(f"{p}: not a gpuidle tracker log (no header line)")
    if head.format != TRACKER_FORMAT:
        raise NotATrace(f"{p}: tracker log format {head.format!r}, this gpuidle reads {TRACKER_FORMAT!r}",
                        "upgrade gpuidle")
    steps: list[TrackerStep] = []
    end: TrackerEnd | None = None
    notes = list(head.notes)
    for i, line in enumerate(lines[1:], 2):
        try:
            item = _decoder.decode(line)
        except msgspec.DecodeError as err:
            if i == len(lines):
                notes.append(f"the last line of {p.name} was cut short and is left out")
                break
            raise CorruptInput(f"{p}:{i}: {err}") from None
        if isinstance(item, TrackerStep):
            steps.append(item)
        elif isinstance(item, TrackerEnd):
            end = item
    if not steps:
        raise InputNotFound(f"{p}: a tracker log without steps (a header only)",
                            f"the job stopped before the tracker wrote a step: steps are written every {head.every} "
                            "steps and at tracker.close()")
    if end is None:
        notes.append(f"{p.name} has no end line: the job stopped before tracker.close(), its last steps are missing")
    else:
        notes.extend(end.notes)
    return _series(p, head, steps, end, notes)


def _series(p: Path, head: TrackerHeader, steps: list[TrackerStep], end: TrackerEnd | None,
            notes: list[str]) -> StepSeries:
    steps.sort(key=lambda s: s.step)

    def col(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    world, groups, claims = checked_facts(head.rank, head.world_size, list(head.process_groups))
    if world is None:  # a job of the logs given
        world = min(max(head.rank, 0), MAX_WORLD - 1) + 1
    notes = notes + claims
    names = list(dict.fromkeys([*head.phases, *(k for s in steps for k in s.phases)]))
    device_names = list(dict.fromkeys(k for s in steps for k in s.device_phases))
    return StepSeries(
        rank=head.rank, world_size=world, path=str(p), timing=head.timing, device=head.device,
        device_name=head.device_name, compute_phases=list(head.compute_phases), copy_phase=head.copy_phase,
        step=col([s.step for s in steps]), start=col([s.start_ns for s in steps]), dur=col([s.dur_ns for s in steps]),
        data=col([s.data_ns for s in steps]),
        phases={n: col([s.phases.get(n, 0) for s in steps]) for n in names},
        device_phases={n: col([s.device_phases.get(n, 0) for s in steps]) for n in device_names},
        comm=col([s.comm_ns for s in steps]), comm_exposed=col([s.comm_exposed_ns for s in steps]),
        straggler=col([s.straggler_ns for s in steps]), buckets=col([s.buckets for s in steps]),
        bucket_bytes=col([s.bucket_bytes for s in steps]), samples=col([s.samples for s in steps]),
        batches=col([s.batches for s in steps]), profiled=np.array([s.profiled for s in steps], dtype=bool),
        comm_hook=end.comm_hook if end is not None else None,
        comm_settings=dict(end.comm_settings) if end is not None else {}, notes=notes,
        unmeasured=list(end.unmeasured) if end is not None else [],
        sync=col([s.sync_ns for s in steps]), syncs=col([s.syncs for s in steps]), framework=head.framework,
        process_groups=groups,
    )
