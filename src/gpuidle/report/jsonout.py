"""The JSON report: the :class:`~gpuidle.model.AnalysisReport` as-is, schema ``gpuidle.analysis/1``."""

from __future__ import annotations

import msgspec

from gpuidle.model import AnalysisReport
from gpuidle.report.common import DEFAULT_OPTIONS, RenderOptions


class JsonRenderer:
    name = "json"
    extensions: tuple[str, ...] = (".json",)

    def render(self, report: AnalysisReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        return msgspec.json.format(msgspec.json.encode(report).decode(), indent=2) + "\n"
