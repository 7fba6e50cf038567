"""Pick a renderer by name or by output file extension, never by an if/elif chain.

Renderers are imported only when picked: the terminal's (rich) or the HTML page's
modules stay out of a ``--json`` run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, TypeVar

from gpuidle.errors import GpuidleError

if TYPE_CHECKING:
    from gpuidle.model import AnalysisReport
    from gpuidle.report.common import RenderOptions


class Renderer(Protocol):
    name: str
    extensions: tuple[str, ...]

    def render(self, report: AnalysisReport, options: RenderOptions = ...) -> str: ...


R = TypeVar("R")

REPORT_FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "terminal": ("gpuidle.report.terminal:TerminalRenderer", (".txt",)),
    "json": ("gpuidle.report.jsonout:JsonRenderer", (".json",)),
    "md": ("gpuidle.report.markdown:MarkdownRenderer", (".md",)),
    "html": ("gpuidle.report.html:HtmlRenderer", (".html", ".htm")),
}
"""Format name -> (``module:class``, output file extensions)."""


def format_for(registry: dict[str, tuple[str, tuple[str, ...]]], name: str | None, path: str | None,
               default: str = "terminal") -> str:
    """The format named, else the one the output path's extension says, else ``default``.

    A name that contradicts the path's extension (``--format md --out r.json``) is refused,
    and so is an extension no format writes, so a file never holds what its name denies.
    """
    if name is not None and name not in registry:
        raise GpuidleError(f"unknown format {name!r}", f"choose one of {', '.join(registry)}")
    by_ext = None
    if path is not None:
        lower = path.lower()
        by_ext = next((f for f, (_, exts) in registry.items() if lower.endswith(exts)), None)
        if by_ext is None and name is None and "." in lower.rsplit("/", 1)[-1]:
            known = ", ".join(e for _, exts in registry.values() for e in exts)
            raise GpuidleError(f"cannot tell the format of {path} from its extension",
                               f"name it {known}, or say --format")
    if name is not None and by_ext is not None and by_ext != name:
        raise GpuidleError(f"--format {name} does not match {path}", f"write {name} to a file named for it")
    return name or by_ext or default


def pick(registry: dict[str, type[R]], default: type[R], name: str | None, path: str | None) -> type[R]:
    """From a registry of classes: by name, else by the output path's extension, else ``default``."""
    if name:
        if name not in registry:
            raise GpuidleError(f"unknown format {name!r}", f"choose one of {', '.join(registry)}")
        return registry[name]
    if path:
        for r in registry.values():
            if path.endswith(r.extensions):  # type: ignore[attr-defined]
                return r
    return default


def renderer_class(fmt: str) -> type[Renderer]:
    """Import the report renderer of ``fmt``."""
    module, _, cls = REPORT_FORMATS[fmt][0].partition(":")
    found: type[Renderer] = getattr(importlib.import_module(module), cls)
    return found


def renderer_for(name: str | None = None, path: str | None = None) -> type[Renderer]:
    """The report renderer for ``--format``/``--out``."""
    return renderer_class(format_for(REPORT_FORMATS, name, path))
