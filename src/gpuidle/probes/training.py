"""``bench allreduce --compare``: the benchmark's busbw beside a training run's own collectives.

Inside the sizes measured the benchmark's busbw is interpolated linearly in log2(size).
Outside them it is extrapolated with the simplest model of a collective's time,
``time = latency + bytes / bandwidth``, fitted by least squares on the
:data:`FIT_SIZES` measured sizes nearest the training's size (the largest ones above,
the smallest below), and the note says how far outside, the fitted model, and the
``--max-bytes``/``--min-bytes`` that would measure it. A benchmark that did not run
like the training (another world size, backend or device) is flagged: its busbw is
not the training's path.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from gpuidle.advice.calc import busbw
from gpuidle.analysis.comm import bus_factor
from gpuidle.model import AnalysisReport, CollectiveStat, duration
from gpuidle.probes.allreduce import AllReduceResult, SizeRow, TrainingComparison
from gpuidle.probes.common import GIB, KIB, MIB, human_bytes
from gpuidle.probes.fit import TimedSize, TimeFit, fit_latency_bandwidth

WELL_BELOW = 0.5
"""Training busbw under this share of the benchmark's at the same size is worth a look."""
ABOVE = 1.25
"""Training busbw above this share of the benchmark's: the two did not run on the same path."""
FIT_SIZES = 4
"""Measured sizes the latency + bytes / bandwidth fit uses at the end of the range it extends."""


def interpolate_busbw(rows: Sequence[SizeRow], op: str, nbytes: int) -> float | None:
    """The benchmark's busbw for ``op`` at ``nbytes``, linear in log2(size), clamped to the range measured."""
    pts = sorted((r.bytes, r.busbw_gbps) for r in rows if r.op == op and r.busbw_gbps is not None)
    if not pts or nbytes <= 0:
        return None
    x = np.log2([p[0] for p in pts])
    y = np.array([p[1] for p in pts], dtype=np.float64)
    return float(np.interp(np.log2(nbytes), x, y))


def fit_time(rows: Sequence[SizeRow], op: str, above: bool) -> TimeFit | None:
    """The latency + bytes / bandwidth fit over the largest (``above``) or smallest measured sizes.

    None with fewer than two sizes or a time that does not grow with size beyond the runs' spread
    (:func:`~gpuidle.probes.fit.fit_latency_bandwidth` decides).
    """
    pts = sorted((r for r in rows if r.op == op and r.time_us is not None), key=lambda r: r.bytes)
    take = pts[-FIT_SIZES:] if above else pts[:FIT_SIZES]
    return fit_latency_bandwidth([TimedSize(r.bytes, (r.time_us or 0.0) * 1e-6, _spread_s(r)) for r in take])


def _spread_s(row: SizeRow) -> float:
    if row.time_p90_us is None or row.time_min_us is None:
        return 0.0
    return max(row.time_p90_us - row.time_min_us, 0.0) * 1e-6


def size_arg(nbytes: int) -> str:
    """The smallest power of two at or above ``nbytes``, as ``--max-bytes`` reads it (``128M``)."""
    p = 1 << max(int(nbytes) - 1, 0).bit_length()
    for unit, size in (("G", GIB), ("M", MIB), ("K", KIB)):
        if p >= size:
            return f"{p // size}{unit}"
    return str(p)


def _judge(ratio: float | None) -> str:
    if ratio is not None and ratio > ABOVE:
        return ("faster than this benchmark: the benchmark ran on another path than the training "
                "(backend, devices or nodes); run it where the training runs")
    if ratio is not None and ratio < WELL_BELOW:
        return ("well below what the network reaches at this size: the kernel time includes waiting for "
                "late ranks (see straggler_wait) and contention with overlapped compute")
    return "about what the network reaches at this size"


def compare_with_training(result: AllReduceResult, stats: Sequence[CollectiveStat]) -> list[TrainingComparison]:
    """Each training collective's busbw beside the benchmark's at the same mean message size."""
    out: list[TrainingComparison] = []
    for s in stats:
        if s.busbw_gbps is None or s.count <= 0 or s.bytes <= 0:
            continue
        mean = s.bytes // s.count
        measured = [r.bytes for r in result.rows if r.op == s.collective and r.busbw_gbps is not None]
        if not measured:
            out.append(TrainingComparison(s.collective, s.process_group, mean, s.busbw_gbps, None, None,
                                          f"{s.collective} not measured by this benchmark", basis="none"))
            continue
        lo, hi = min(measured), max(measured)
        if lo <= mean <= hi:
            bench = interpolate_busbw(result.rows, s.collective, mean)
            ratio = s.busbw_gbps / bench if bench else None
            out.append(TrainingComparison(s.collective, s.process_group, mean, s.busbw_gbps, bench, ratio,
                                          _judge(ratio)))
            continue
        above = mean > hi
        far = mean / hi if above else lo / mean
        fit = fit_time(result.rows, s.collective, above)
        where = (f"{human_bytes(mean)} is {far:.1f}× the largest size measured ({human_bytes(hi)})" if above else
                 f"{human_bytes(mean)} is {far:.1f}× under the smallest size measured ({human_bytes(lo)})")
        flag = f"--max-bytes {size_arg(mean)}" if above else f"--min-bytes {max(mean, 1)}"
        if fit is None:
            bench = interpolate_busbw(result.rows, s.collective, mean)
            ratio = s.busbw_gbps / bench if bench else None
            note = f"{where}: compared with the nearest size (time does not grow with size there); measure it: {flag}"
            out.append(TrainingComparison(s.collective, s.process_group, mean, s.busbw_gbps, bench, ratio, note,
                                          basis="nearest", size_ratio=far))
            continue
        bench = busbw(mean / fit.seconds(mean) / 1e9, bus_factor(s.collective, result.world_size))
        ratio = s.busbw_gbps / bench if bench > 0 else None
        end = "largest" if above else "smallest"
        note = (f"{_judge(ratio)}; {where}: extrapolated with time = {duration(fit.latency_s)} + bytes / "
                f"{fit.bandwidth_gbps:.3g} GB/s, fitted on the {len(fit.sizes)} {end} sizes; measure it: {flag}")
        out.append(TrainingComparison(s.collective, s.process_group, mean, s.busbw_gbps, bench, ratio, note,
                                      basis="extrapolated", size_ratio=far))
    return out


def training_collectives(report: AnalysisReport) -> tuple[list[CollectiveStat], str]:
    """The collectives to compare: the job's when the report covers several ranks, else rank 0's."""
    if report.job is not None:
        return report.job.communication.collectives, "job"
    if report.ranks:
        return report.ranks[0].communication.collectives, f"rank {report.ranks[0].rank}"
    return [], "none"


def setup_mismatches(result: AllReduceResult, report: AnalysisReport) -> list[str]:
    """Where the benchmark did not run like the training: world size, backend, device."""
    out = []
    world = report.job.world_size if report.job is not None else None
    world = world or next((r.world_size for r in report.ranks if r.world_size), None)
    if world is not None and world != result.world_size:
        out.append(f"the training ran {world} ranks, this benchmark {result.world_size}: busbw's bus factor evens "
                   "out the algorithm's traffic, not the topology (more nodes, more hops, a shared network); "
                   f"run it with the training's {world} ranks (torchrun --nnodes ... -m gpuidle bench allreduce) "
                   "for a like-for-like figure")
    backends = sorted({r.backend for r in report.ranks if r.backend})
    if backends and backends != [result.backend]:
        out.append(f"the training used {', '.join(backends)}, this benchmark {result.backend} on the "
                   f"{result.device}: another path than the training's; run it where the training runs "
                   f"({'--device cuda' if 'nccl' in backends else 'the same backend'})")
    elif not backends and result.device == "cpu" and any(d.name for r in report.ranks for d in r.devices):
        out.append(f"the training ran on GPUs, this benchmark on the CPU ({result.backend}): another path than "
                   "the training's; run it on the GPUs (--device cuda)")
    return out


def with_comparison(result: AllReduceResult, report: AnalysisReport) -> AllReduceResult:
    stats, scope = training_collectives(report)
    rows = compare_with_training(result, stats)
    notes = list(result.notes)
    if not rows:
        notes.append("the training report has no collectives with known sizes to compare with")
    else:
        notes.append(f"training collectives from the report's {scope} view (mean message size = bytes / calls)")
    return msgspec.structs.replace(result, comparison=rows, notes=notes,
                                   mismatches=setup_mismatches(result, report))


def ring_fit(result: AllReduceResult) -> tuple[float, float] | None:
    """The all-reduce's latency per ring step and bus bandwidth (s, GB/s), fitted over every size measured:
    ``time = α × 2(N−1) + bytes × 2(N−1)/N / busbw``; None where time does not grow with the size."""
    rows = sorted((r for r in result.rows if r.op == "all_reduce" and r.time_us is not None), key=lambda r: r.bytes)
    n = result.world_size
    f = fit_latency_bandwidth([TimedSize(r.bytes, (r.time_us or 0.0) * 1e-6, _spread_s(r)) for r in rows])
    if f is None or n < 2:
        return None
    return f.latency_s / (2 * (n - 1)), f.bandwidth_gbps * bus_factor("all_reduce", n)
