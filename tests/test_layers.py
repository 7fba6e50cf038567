"""The package's layers, as DESIGN draws them: imports point down, never up.

Read from the source with ``ast`` (every import, also those inside functions), so a lazy import that
reaches up a layer is caught as surely as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "gpuidle"

FORBIDDEN = {
    "model": {"sources", "analysis", "advice", "report", "api", "cli", "live", "probes", "ledger", "torch", "jobs"},
    "analysis": {"sources", "advice", "report", "api", "cli", "live", "probes", "ledger", "torch", "jobs"},
    "advice": {"sources", "report", "api", "cli", "live", "probes", "ledger", "torch", "jobs"},
    "sources": {"analysis", "advice", "report", "api", "cli", "live", "probes", "ledger", "jobs"},
    "live": {"sources", "report", "api", "cli", "probes", "jobs"},
    "probes": {"sources", "report", "api", "cli", "live", "jobs"},
    "report": {"sources", "api", "cli", "live", "ledger", "jobs"},
    "jobs": {"report", "api", "cli", "live", "probes", "ledger"},
}
"""What each layer may not import: producers (sources, live, probes) never the renderers or the library face;
analyses and advice never what produces their input; the model nothing of ours but errors; the executors (jobs)
read and analyse, and leave rendering, recording and the library face to the layers above."""


def _imports(path: Path) -> set[str]:
    """The gpuidle subpackages or modules ``path`` imports (``gpuidle.x.y`` -> ``x``; ``from gpuidle import x``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "gpuidle" else [f"gpuidle.{a.name}" for a in node.names]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("gpuidle.")}
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_point_down(layer: str) -> None:
    bad = {f"{f.relative_to(SRC)} imports gpuidle.{m}"
           for f in (SRC / layer).rglob("*.py") for m in _imports(f) & FORBIDDEN[layer]}
    assert sorted(bad) == []


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from gpuidle.api import analyze\n    from gpuidle import report\n")
    assert _imports(f) == {"api", "report"}
