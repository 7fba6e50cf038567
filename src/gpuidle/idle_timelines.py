"""Where the idle time lies: each device's idle intervals by cause, for plots and annotated traces.

The windows, steps and causes are those of :func:`gpuidle.api.analyze`: both start from one preparation
(:func:`~gpuidle.analysis.attribution.attributed`), so a device's idle drawn here is its idle in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from gpuidle.analysis.attribution import attributed
from gpuidle.analysis.binning import slice_shares
from gpuidle.analysis.intervals import Intervals
from gpuidle.analysis.ranks import enough_steps, match_collectives, waiting_intervals
from gpuidle.analysis.summary import RankAnalysis
from gpuidle.errors import GpuidleError
from gpuidle.jobs.executors import LocalPool
from gpuidle.model import CAUSES, AnalysisReport, DeviceTimeline, IdleTimeline, Timeline
from gpuidle.sources import inputs, tracker
from gpuidle.sources.formats import is_nsys, is_xspace, looks_like_trace, read_timelines
from gpuidle.sources.jsonstream import TraceStream

TIMELINE_BINS = 400
"""Slices of the window in a utilization-over-time plot: finer than a page is wide is wasted."""


def idle_timeline(path: str | Path, bins: int = TIMELINE_BINS,
                  straggler: dict[int, Intervals] | None = None, rank: int | None = None) -> IdleTimeline:
    """Re-read one trace and return every device's idle intervals with their causes.

    The windows, steps and causes are those of :func:`analyze` (one preparation,
    :func:`~gpuidle.analysis.attribution.attributed`), each device over its own steps where the devices run theirs
    apart (a multi-GPU XSpace profile's ``Steps`` line per GPU); idle under one-time start-up (context creation,
    module loading, allocator growth) is in no cause there, and is left out here. ``straggler`` (per device, the
    intervals spent waiting for a slower rank, from the job's other ranks) turns that waiting into
    ``straggler_wait`` as in the job report; without it, it stays ``communication``. ``rank`` picks one rank of a
    file that holds several (an Nsight export of a job); by default its first.
    """
    tl = _rank_timeline(str(path), rank)
    rank_idle = attributed(tl, straggler)
    devices = []
    for d in rank_idle.idle:
        window = rank_idle.window_of(d.device)
        bounds = window.bounds
        seg_s, seg_e, cause = d.segments
        per_step = cause < len(CAUSES)  # start-up is in no cause, as in the report: not drawn as one
        seg_s, seg_e, cause = seg_s[per_step], seg_e[per_step], cause[per_step]
        step_index = np.clip(np.searchsorted(bounds, seg_s, side="right") - 1, 0, bounds.size - 2)
        edges, busy, idle = slice_shares(d.window, (seg_s, seg_e, cause.astype(np.int64)), bins)
        devices.append(DeviceTimeline(
            device=d.device, name=tl.meta.device_names.get(d.device), window=d.window,
            seg_start=seg_s, seg_end=seg_e, seg_cause=cause.astype(np.int64),
            seg_step=window.steps.number[step_index].astype(np.int64),
            step_numbers=window.steps.number.astype(np.int64), step_bounds=bounds,
            bin_edges=edges, bin_busy=busy, bin_idle=idle,
        ))
    window = rank_idle.window
    return IdleTimeline(path=str(path), rank=_rank_of(tl), t0_ns=tl.meta.t0_ns,
                        step_numbers=window.steps.number.astype(np.int64), step_bounds=window.bounds, devices=devices)


def _rank_of(tl: Timeline) -> int:
    return tl.meta.rank if tl.meta.rank is not None else 0


def _rank_timeline(path: str, rank: int | None) -> Timeline:
    """The rank of ``path`` numbered ``rank``: a file of one rank is that rank whatever number it reads as alone
    (an XSpace profile's is its place among its folder's, which a job renumbers among the files given)."""
    timelines = read_timelines(path)
    if rank is None or len(timelines) == 1:
        return timelines[0]
    for tl in timelines:
        if _rank_of(tl) == rank:
            return tl
    raise GpuidleError(f"{path}: no rank {rank} in this trace")


def timeline_for(report: AnalysisReport, bins: int = TIMELINE_BINS,
                 analyses: Sequence[RankAnalysis] = ()) -> IdleTimeline:
    """The timeline of the report's trace; for a job, of its lowest-utilization rank (the note says so).

    ``analyses``: the job's per-rank results (:attr:`JobResult.analyses`); without them every rank is
    analysed again to find what the lowest one waited for. Only that rank's trace is read either way.
    """
    if report.source.format == tracker.FORMAT:
        raise GpuidleError("the step tracker records step times, not device intervals: no timeline to draw",
                           "profile a few steps with tracker.profile(steps=...) and use that trace")
    if not report.ranks:
        raise GpuidleError("the trace's device records were lost: no device timeline to draw",
                           "profile again keeping the device records (a larger CUPTI buffer, a shorter window)")
    if len(report.ranks) == 1:
        return idle_timeline(report.ranks[0].path, bins, rank=report.ranks[0].rank)
    worst = min(report.ranks, key=lambda r: (r.primary().utilization, r.rank))
    # waiting for the last rank needs every rank's collectives: from the job's results, else analysed again
    ranks = list(analyses)
    if not ranks:
        files = sorted({r.path for r in report.ranks})
        ranks = [o.analysis for o in LocalPool().run(files) if o.analysis is not None]
    mine = next(a for a in ranks if a.report.path == worst.path and a.report.rank == worst.rank)
    waits = {mine.primary_device: waiting_intervals(mine, match_collectives(ranks))} if enough_steps(ranks) else {}
    tl = idle_timeline(worst.path, bins, waits, rank=worst.rank)
    note = f"rank {worst.rank} of {len(report.ranks)}, the lowest utilization ({worst.primary().utilization:.1%})"
    return IdleTimeline(path=tl.path, rank=worst.rank, t0_ns=tl.t0_ns, step_numbers=tl.step_numbers,
                        step_bounds=tl.step_bounds, devices=tl.devices, note=note)


_raw_events = msgspec.json.Decoder(list[msgspec.Raw])


def annotate_trace(path: str | Path, out: str | Path, timeline: IdleTimeline | None = None) -> IdleTimeline:
    """Write ``out``: the trace at ``path`` plus a ``gpuidle`` track of idle intervals by cause.

    The input is streamed, never loaded whole, and never written; ``out`` ending in
    ``.gz`` is gzip-compressed. An Nsight export or an XSpace ``.pb`` becomes a Chrome trace of its
    timeline (the rank of ``timeline``). Returns the timeline written.
    """
    src, dst = str(path), Path(out)
    if not inputs.is_url(src) and dst.exists() and Path(src).exists() and dst.samefile(src):
        raise GpuidleError(f"{dst}: the annotated trace would overwrite its input", "give another output path")
    from gpuidle.report import annotate

    tl = timeline if timeline is not None else idle_timeline(src)
    if is_nsys(src) or (is_xspace(src) and not looks_like_trace(src)):  # not a Chrome trace: converted
        from gpuidle.report import chrome

        source = _rank_timeline(src, tl.rank)
        annotate.write_annotated(dst, chrome.timeline_events(source), {"displayTimeUnit": "ns"}, tl)
        return tl
    stream = TraceStream(src, _raw_events.decode)
    annotate.write_annotated(dst, stream, stream.header, tl)
    return tl
