"""The fleet roll-up: each job's GPUs, utilization and GPU-hours idle by cause, and the fleet's totals.

The figures are those of the cost of one job (``advice.calc.cost_from_report``), split by cause:
GPUs are those with work in the analysed window (``analysis.figures.gpus``), utilization the mean over
its traced ranks of each rank's training device, and a cause's GPU-hours ``GPUs × hours × share``, where
``share`` is the mean over the ranks of that device's idle time for the cause over its window. The causes add up to
``GPUs × hours × (1 − utilization)``, the job's wasted GPU-hours.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuidle.analysis import figures
from gpuidle.model import CAUSES, AnalysisReport, FleetJob, FleetReport


def fleet_job(name: str, path: str, report: AnalysisReport, hours: float = 1.0) -> FleetJob:
    """One job's row: GPU-hours idle per cause per ``hours`` of training, and its top fix; a job whose every rank
    lost its device records has none (its host side is in its report)."""
    lost = [f"rank {h.rank} ({h.path}): device records lost ({h.lost_launches} kernel launches with no kernel "
            "record), host side only" for h in report.host_side]
    if not report.ranks:
        return FleetJob(name=name, path=path, error=f"no device figures: {lost[0]}")
    devices = [r.primary() for r in report.ranks]
    gpus, utilization = figures.gpus(report), figures.utilization(report)
    if utilization is None:
        return FleetJob(name=name, path=path, error=f"utilization not measured "
                        f"({', '.join(figures.unmeasured(report))} counts as busy)")
    # shares of the window, which leaves start-up out: a one-time cost (context creation, module loading) does
    # not recur per hour of training, and is in no cause
    shares = {c.value: sum(d.idle_by_cause_s.get(c.value, 0.0) / d.window_s for d in devices if d.window_s > 0)
              / len(devices) for c in CAUSES}
    by_cause = {c: gpus * hours * share for c, share in shares.items()}
    return FleetJob(
        name=name, path=path, gpus=gpus, utilization=utilization,
        idle_gpu_hours_by_cause=by_cause, idle_gpu_hours=sum(by_cause.values()),
        top_fix=report.recommendations[0].title if report.recommendations else None,
        skipped=[*report.source.skipped, *lost],
    )


def fleet_report(paths: Sequence[str], jobs: Sequence[FleetJob], hours: float = 1.0,
                 price_per_gpu_hour: float | None = None) -> FleetReport:
    """The fleet's totals over the jobs that have figures: GPU-hours idle per cause, and their cost at a price."""
    ok = [j for j in jobs if j.error is None]
    by_cause = {c.value: sum(j.idle_gpu_hours_by_cause.get(c.value, 0.0) for j in ok) for c in CAUSES}
    total = sum(by_cause.values())
    cost_by_cause = {c: h * price_per_gpu_hour for c, h in by_cause.items()} if price_per_gpu_hour else None
    return FleetReport(
        paths=list(paths), hours=hours, jobs=list(jobs), gpus=sum(j.gpus for j in ok),
        idle_gpu_hours_by_cause=by_cause, idle_gpu_hours=total, price_per_gpu_hour=price_per_gpu_hour,
        cost_by_cause=cost_by_cause, cost=total * price_per_gpu_hour if price_per_gpu_hour else None,
        failed_jobs=len(jobs) - len(ok),
    )
