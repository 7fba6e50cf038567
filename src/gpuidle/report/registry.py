"""Pick a renderer by name or by output file extension, never by an if/elif chain."""

from __future__ import annotations

from typing import Protocol, TypeVar

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


R = TypeVar("R")

RENDERERS: dict[str, type[Renderer]] = {
    r.name: r for r in (TerminalRenderer, JsonRenderer, MarkdownRenderer)
}


def pick(registry: dict[str, type[R]], default: type[R], name: str | None, path: str | None) -> type[R]:
    """A renderer by name, else by the output path's extension, else ``default``."""
    if name:
        if name not in registry:
            raise GpuidleError(f"unknown format {name!r}", f"choose one of {', '.join(registry)}")
        return registry[name]
    if path:
        for r in registry.values():
            if path.endswith(r.extensions):  # type: ignore[attr-defined]
                return r
    return default


def renderer_for(name: str | None = None, path: str | None = None) -> type[Renderer]:
    return pick(RENDERERS, TerminalRenderer, name, path)
