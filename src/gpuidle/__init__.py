"""gpuidle: find out why your GPUs are idle, and what to change first.

The library face: everything the command line does, callable from Python.

>>> import gpuidle
>>> report = gpuidle.analyze(["examples/ddp_a100_rank0.pt.trace.json.gz"])
>>> device = report.ranks[0].devices[0]
>>> round(device.busy_s + device.idle_s, 9) == round(device.window_s, 9)
True
>>> report.recommendations[0].cause in gpuidle.CAUSES
True
>>> gpuidle.AnalysisReport.from_json(report.to_json()) == report
True

Names load on first use, so ``import gpuidle`` stays cheap for the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "analyze": "gpuidle.api",
    "analyze_tracker": "gpuidle.api",
    "summarize_log": "gpuidle.api",
    "compare_runs": "gpuidle.api",
    "with_cost": "gpuidle.api",
    "record_analysis": "gpuidle.api",
    "idle_timeline": "gpuidle.api",
    "annotate_trace": "gpuidle.api",
    "AnalysisReport": "gpuidle.notebook",
    "RankReport": "gpuidle.model",
    "DeviceReport": "gpuidle.model",
    "StepReport": "gpuidle.model",
    "JobReport": "gpuidle.model",
    "Recommendation": "gpuidle.model",
    "UtilizationReport": "gpuidle.model",
    "Comparison": "gpuidle.model",
    "CostResult": "gpuidle.model",
    "Cause": "gpuidle.model",
    "CAUSES": "gpuidle.model",
    "GpuidleError": "gpuidle.errors",
}

__all__ = [
    "CAUSES",
    "AnalysisReport",
    "Cause",
    "Comparison",
    "CostResult",
    "DeviceReport",
    "GpuidleError",
    "JobReport",
    "RankReport",
    "Recommendation",
    "StepReport",
    "UtilizationReport",
    "__version__",
    "analyze",
    "analyze_tracker",
    "annotate_trace",
    "compare_runs",
    "idle_timeline",
    "record_analysis",
    "summarize_log",
    "with_cost",
]

if TYPE_CHECKING:
    from gpuidle.api import (
        analyze,
        analyze_tracker,
        annotate_trace,
        compare_runs,
        idle_timeline,
        record_analysis,
        summarize_log,
        with_cost,
    )
    from gpuidle.errors import GpuidleError
    from gpuidle.model import (
        CAUSES,
        Cause,
        Comparison,
        CostResult,
        DeviceReport,
        JobReport,
        RankReport,
        Recommendation,
        StepReport,
        UtilizationReport,
    )
    from gpuidle.notebook import AnalysisReport


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'gpuidle' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
