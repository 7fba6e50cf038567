"""A report's tables as pandas DataFrames, for a notebook: one row per thing, times in seconds.

The columns are the JSON report's own names (``dur_s``, ``busy_s``, ``idle_s``), each idle
cause a column of its own; a recommendation's gain is flattened field by field, so a field
added to :class:`~gpuidle.model.Gain` becomes a column with no change here. pandas is an
optional extra (``pip install 'gpuidle[pandas]'``), imported only when a frame is asked for.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gpuidle.errors import GpuidleError
from gpuidle.model import CAUSES, AnalysisReport

FRAMES = ("steps", "devices", "recommendations", "kernels", "ranks")
"""The tables :func:`to_frames` returns, in this order."""


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as err:
        raise GpuidleError(f"report tables as DataFrames need pandas ({err})",
                           "pip install 'gpuidle[pandas]'") from None
    return pandas


def _causes(idle_by_cause_s: dict[str, float]) -> dict[str, float]:
    """Every cause of the vocabulary, in its order, as a column (0 where the report has none)."""
    return {c.value: idle_by_cause_s.get(c.value, 0.0) for c in CAUSES}


def rows(report: AnalysisReport) -> dict[str, list[dict[str, Any]]]:
    """The tables as lists of plain rows (what the DataFrames are built from)."""
    steps = [{"rank": r.rank, "step": s.step, "start_s": s.start_s, "dur_s": s.dur_s, "busy_s": s.busy_s,
              "idle_s": s.idle_s, **_causes(s.idle_by_cause_s), "excluded": s.excluded}
             for r in report.ranks for s in r.steps]
    devices = [{"rank": r.rank, "device": d.device, "name": d.name, "window_s": d.window_s, "busy_s": d.busy_s,
                "idle_s": d.idle_s, "utilization": d.utilization, **_causes(d.idle_by_cause_s),
                "active_s": d.active_s, "compute_capability": d.compute_capability, "timing": d.timing}
               for r in report.ranks for d in r.devices]
    recommendations = [{"order": i, "id": x.id, "cause": x.cause, "title": x.title, "rank": x.rank,
                        "confidence": x.confidence, "alternative_to": x.alternative_to,
                        **msgspec.structs.asdict(x.gain), "fix": x.fix}
                       for i, x in enumerate(report.recommendations, 1)]
    kernels = [{"rank": r.rank, "name": k.name, "count": k.count, "total_s": k.total_s, "share": k.share}
               for r in report.ranks for k in r.kernels.top]
    ranks = [msgspec.structs.asdict(row) for row in report.job.rank_table] if report.job is not None else []
    return {"steps": steps, "devices": devices, "recommendations": recommendations, "kernels": kernels,
            "ranks": ranks}


def to_frames(report: AnalysisReport) -> dict[str, Any]:
    """``{"steps", "devices", "recommendations", "kernels", "ranks"}`` -> ``pandas.DataFrame``.

    ``steps``: one row per rank and profiler step (``excluded`` names a step left out of the
    steady state); ``devices``: per rank and device; ``recommendations``: in the order to apply
    them, with the gain's fields; ``kernels``: each rank's top kernels by device time;
    ``ranks``: the job's rank table (empty for one rank).
    """
    pd = _pandas()
    return {name: pd.DataFrame(table) for name, table in rows(report).items()}
