"""The fleet table as text: one row per job, the fleet's GPU-hours idle by cause at the bottom.

It prints the figures of :class:`~gpuidle.model.FleetReport` as they are; causes no job has are left out.
"""

from __future__ import annotations

import textwrap

from gpuidle.model import CAUSES, FleetReport
from gpuidle.report.text import printable

TOP_FIX_WIDTH = 60


def render_fleet(fleet: FleetReport, width: int | None = None) -> str:
    """The fleet table, every cause a column; where that is wider than ``width`` (the terminal's), the
    compact table: each job's largest cause, and where the rest are."""
    full = _full_table(fleet)
    if width is None or max(len(line) for line in full.splitlines()) <= width:
        return full
    return _compact_table(fleet, width)


def _compact_table(fleet: FleetReport, width: int) -> str:
    name_w = max([len("fleet"), len("job"), *(len(printable(j.name)) for j in fleet.jobs)])
    lines = ["  ".join([f"{'job':<{name_w}}", f"{'GPUs':>5}", f"{'util':>6}", f"{'idle GPU-h':>10}",
                        "largest idle cause"])]
    for j in fleet.jobs:
        name = f"{printable(j.name):<{name_w}}"
        if j.error is not None:
            lines.append(_fit(f"{name}  error: {printable(j.error)}", width))
            continue
        cause, hours = max(j.idle_gpu_hours_by_cause.items(), key=lambda kv: kv[1], default=("-", 0.0))
        util = f"{j.utilization:.1%}" if j.utilization is not None else "-"
        lines.append("  ".join([name, f"{j.gpus:>5}", f"{util:>6}", f"{j.idle_gpu_hours:>10.2f}",
                                f"{cause} {hours:.2f}"]))
        if j.top_fix:
            lines.append(_fit(f"{'':<{name_w}}  top fix: {printable(j.top_fix)}", width))
        lines.extend(_fit(f"{'':<{name_w}}  skipped {printable(s)}", width) for s in j.skipped)
    lines.append("  ".join([f"{'fleet':<{name_w}}", f"{fleet.gpus:>5}", f"{'':>6}", f"{fleet.idle_gpu_hours:>10.2f}"]))
    if fleet.cost is not None:
        lines.append("  ".join([f"{'cost':<{name_w}}", f"{'':>5}", f"{'':>6}", f"{fleet.cost:>10.2f}"]))
    wide = max(len(line) for line in _full_table(fleet).splitlines())
    lines += textwrap.wrap(_note(fleet), width) + textwrap.wrap(
        f"(every cause of every job: a terminal {wide} columns wide, or --json)", width)
    return "\n".join(lines) + "\n"


def _note(fleet: FleetReport) -> str:
    per = "per hour of training" if fleet.hours == 1.0 else f"per {fleet.hours:g} hours of training"
    note = f"{_count(len(fleet.jobs), 'job')}; GPU-hours idle {per} of each job, by cause"
    if fleet.price_per_gpu_hour is not None:
        note += f"; cost at {fleet.price_per_gpu_hour:g} per GPU-hour"
    if fleet.failed_jobs:
        note += f"; {_count(fleet.failed_jobs, 'job')} without a report"
    return note


def _full_table(fleet: FleetReport) -> str:
    causes = [c.value for c in CAUSES if fleet.idle_gpu_hours_by_cause.get(c.value, 0.0) > 0]
    name_w = max([len("fleet"), len("job"), *(len(printable(j.name)) for j in fleet.jobs)])
    head = [f"{'job':<{name_w}}", f"{'GPUs':>5}", f"{'util':>6}", f"{'idle GPU-h':>10}",
            *(f"{c:>{max(len(c), 8)}}" for c in causes), "top fix"]
    lines = ["  ".join(head)]
    for j in fleet.jobs:
        name = f"{printable(j.name):<{name_w}}"
        if j.error is not None:
            lines.append(f"{name}  error: {printable(j.error)}")
            continue
        util = f"{j.utilization:.1%}" if j.utilization is not None else "-"
        cells = [name, f"{j.gpus:>5}", f"{util:>6}", f"{j.idle_gpu_hours:>10.2f}",
                 *(f"{j.idle_gpu_hours_by_cause.get(c, 0.0):>{max(len(c), 8)}.2f}" for c in causes),
                 _cut(printable(j.top_fix or "-"))]
        lines.append("  ".join(cells))
        lines.extend(f"{'':<{name_w}}  skipped {printable(s)}" for s in j.skipped)
    total = [f"{'fleet':<{name_w}}", f"{fleet.gpus:>5}", f"{'':>6}", f"{fleet.idle_gpu_hours:>10.2f}",
             *(f"{fleet.idle_gpu_hours_by_cause[c]:>{max(len(c), 8)}.2f}" for c in causes)]
    lines.append("  ".join(total).rstrip())
    if fleet.cost is not None and fleet.cost_by_cause is not None:
        cost = [f"{'cost':<{name_w}}", f"{'':>5}", f"{'':>6}", f"{fleet.cost:>10.2f}",
                *(f"{fleet.cost_by_cause[c]:>{max(len(c), 8)}.2f}" for c in causes)]
        lines.append("  ".join(cost).rstrip())
    lines.append(_note(fleet))
    return "\n".join(lines) + "\n"


def _cut(text: str) -> str:
    return _fit(text, TOP_FIX_WIDTH)


def _fit(text: str, width: int) -> str:
    """``text`` in ``width`` characters: cut with an ellipsis where longer, so a cut never reads as the whole."""
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
