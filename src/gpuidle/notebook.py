"""The analysis report as the library hands it out: the model's report, shown by Jupyter and as DataFrames.

:class:`gpuidle.model.AnalysisReport` is data and stays on the ground floor, importing
nothing of ours; this subclass, at the level of the library face, adds the presentation a
notebook asks for: ``_repr_html_`` is the HTML page ``gpuidle analyze --html`` writes (the
same renderer, without the timeline, which needs the trace again) in an iframe, and :meth:`to_frames`
gives the tables as pandas DataFrames. Same fields, same JSON.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gpuidle import model


class AnalysisReport(model.AnalysisReport, kw_only=True):
    """One analysis: sources, ranks, the job, recommendations. ``to_json``/``from_json`` round-trip it."""

    def _repr_html_(self) -> str:
        """The page ``gpuidle analyze --html`` writes (without the timeline), framed for a notebook cell."""
        from gpuidle.report.html import render_inline

        return render_inline(self)

    def to_frames(self) -> dict[str, Any]:
        """The report's tables as ``pandas.DataFrame``: see :func:`gpuidle.report.frames.to_frames`."""
        from gpuidle.report.frames import to_frames

        return to_frames(self)


def public(report: model.AnalysisReport) -> AnalysisReport:
    """The same report as the public type (fields shared, not copied)."""
    if isinstance(report, AnalysisReport):
        return report
    return AnalysisReport(**msgspec.structs.asdict(report))
