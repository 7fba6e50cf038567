"""Pick a renderer by name or by output file extension, never by an if/elif chain."""

from __future__ import annotations

from typing import Protocol

from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport
from gpuidle.report.common import RenderOptions
from gpuidle.report.jsonout import JsonRenderer
from gpuidle.report.markdown import MarkdownRenderer
from gpuidle.report.terminal import TerminalRenderer


class Renderer(Protocol):
    name: str
    extensions: tuple[str, ...]

    def render(self, report: AnalysisReport, options: RenderOptions = ...) -> str: ...


RENDERERS: dict[str, type[Renderer]] = {
    r.name: r for r in (TerminalRenderer, JsonRenderer, MarkdownRenderer)
}


def renderer_for(name: str | None = None, path: str | None = None) -> type[Renderer]:
    if name:
        if name not in RENDERERS:
            raise GpuidleError(f"unknown format {name!r}", f"choose one of {', '.join(RENDERERS)}")
        return RENDERERS[name]
    if path:
        for r in RENDERERS.values():
            if path.endswith(r.extensions):
                return r
    return TerminalRenderer
