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


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The gpuidle modules ``path`` imports, lazily or for type checking too: ``from a import b`` is module a.b
    where there is one, else a."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                target = f"{base}.{a.name}"
                out.add(target if target in modules else base)
    return (out & modules) - {name}


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import circle, however long, through lazy and type-only imports too: a piece two modules share has a
    home of its own."""
    files = [f for f in SRC.rglob("*.py") if "xplane_pb2" not in f.name]
    modules = {_module_name(f) for f in files}
    graph = {_module_name(f): _module_imports(f, modules) for f in files}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert [" -> ".join(c) for c in cycles] == []
