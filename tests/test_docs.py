"""The documentation stays true: every command and code block that can run on a CPU runs here.

The README and every page under ``docs/`` are read for fenced code blocks. A ``bash`` block runs
line by line as a shell script, a ``python`` block as a program, both from a folder of the page's
own that sees the repository's ``examples/``, ``tests/`` and ``deploy/`` (so the bundled traces are
found), with a ledger of the page's own. A block that cannot run here is marked on the line before
it with ``<!-- skip: why -->`` (a GPU, a cluster, placeholders for the reader's own files); every
other block names its language (``text`` for output and sketches). The site builds with
``mkdocs build --strict`` (no broken link, no page missing from the navigation, no reference to a
name that no longer exists), and the notebook in ``docs/`` executes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuidle.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)
SKIP = re.compile(r"<!-- skip: (.+?) -->\s*$")
RUNNABLE = {"bash", "python"}
NOT_CODE = {"text", "json", "yaml"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    skip: str | None


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        indent = len(m.group(1))
        code = "\n".join(x[indent:] for x in m.group(3).splitlines())
        out.append(Block(page, text[: m.start()].count("\n") + 1, m.group(2), code,
                         skip.group(1) if skip else None))
    return out


ALL = [b for p in PAGES for b in blocks(p)]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_every_block_names_its_language_and_every_skip_its_reason() -> None:
    assert len(ALL) > 20
    bad = [f"{_name(b.page)}:{b.line}" for b in ALL if b.lang not in RUNNABLE | NOT_CODE]
    assert bad == [], "a fenced block without a language (bash, python, text, json, yaml)"
    assert all(b.skip is None or b.lang in RUNNABLE for b in ALL)


def _workdir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    for name in ("examples", "tests", "deploy"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, GPUIDLE_LEDGER=str(tmp_path / "ledger.sqlite"), NO_COLOR="1", COLUMNS="110",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return tmp_path, env


RUN_PAGES = sorted({b.page for b in ALL if b.lang in RUNNABLE and b.skip is None})


@pytest.mark.parametrize("page", RUN_PAGES, ids=[_name(p) for p in RUN_PAGES])
def test_the_pages_commands_and_code_run(page: Path, tmp_path: Path) -> None:
    """The page's blocks in order, in one folder: a later block may read what an earlier one wrote."""
    cwd, env = _workdir(tmp_path)
    shim = f'gpuidle() {{ "{sys.executable}" -m gpuidle "$@"; }}\npython() {{ "{sys.executable}" "$@"; }}\n'
    for b in blocks(page):
        if b.skip is not None or b.lang not in RUNNABLE:
            continue
        if b.lang == "bash":
            cmd = ["bash", "-c", "set -euo pipefail\n" + shim + b.code]
        else:
            cmd = [sys.executable, "-c", b.code]
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{_name(page)}:{b.line}\n{b.code}\n--- stderr\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, f"{_name(page)}:{b.line}\n{proc.stderr[-3000:]}"


def test_the_readme_excerpt_is_what_the_quickstart_prints() -> None:
    section = README.split("## What it prints", 1)[1].split("\n## ", 1)[0]
    (excerpt,) = re.findall(r"```text\n(.*?)```", section, re.S)
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(ROOT / "src"), COLUMNS="100")  # as the excerpt was laid out
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", "examples/ddp_a100_rank0.pt.trace.json.gz",
                           "--no-ledger"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    printed = [line.rstrip() for line in proc.stdout.splitlines()]
    shown = [line.rstrip() for line in excerpt.splitlines() if line.strip() != "…"]
    assert len(shown) > 8
    positions = [printed.index(line) for line in shown]  # each line as printed ...
    assert positions == sorted(positions)                # ... and in the order printed


def test_the_fleet_table_on_the_cluster_page_is_what_the_command_prints(tmp_path: Path) -> None:
    page = (DOCS / "cluster.md").read_text()
    section = page.split("### The fleet table", 1)[1]
    (table,) = re.findall(r"```text\n(.*?)```", section.split("\n### ", 1)[0], re.S)
    (tmp_path / "alexnet").mkdir()
    (tmp_path / "ddp").mkdir()
    data = ROOT / "tests" / "data"
    alexnet = "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
    shutil.copy(data / alexnet, tmp_path / "alexnet")
    for rank in (0, 1):
        shutil.copy(data / f"trace_filter__sampled_rank-{rank}.json.gz", tmp_path / "ddp")
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(ROOT / "src"), COLUMNS="250")
    proc = subprocess.run([sys.executable, "-m", "gpuidle", "analyze", str(tmp_path), "--price-per-gpu-hour", "2.5",
                           "--no-ledger"], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout == table


# -- the command line is documented ------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((f"{prefix}{name}", sub))
                assert helps.get(name), f"gpuidle {prefix}{name} has no help text"
                out.extend(_subcommands(sub, f"{prefix}{name} "))
    return out


COMMANDS = _subcommands(build_parser())
HAND_WRITTEN = "\n".join(p.read_text() for p in PAGES)


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_subcommand_is_on_a_page(name: str, parser: argparse.ArgumentParser) -> None:
    """Besides the generated reference, a page a reader finds by task says what each command is for."""
    assert f"gpuidle {name}" in HAND_WRITTEN, f"`gpuidle {name}` is on no page of docs/"
    assert parser.format_help()


# -- the README's Quickstart ---------------------------------------------------------------------


def _quickstart() -> list[str]:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_quickstart_has_exactly_two_commands() -> None:
    commands = _quickstart()
    assert len(commands) == 2
    assert "gpuidle analyze examples/" in commands[0]
    assert "pytest" in commands[1]
    example = commands[0].split("gpuidle analyze ", 1)[1].split()[0]
    assert (ROOT / example).is_file()


def test_quickstart_installs_the_core_first_and_ci_runs_both_verbatim() -> None:
    first, second = _quickstart()
    assert first.startswith("pip install -e . ")
    assert "[dev]" not in first
    assert "'.[dev]'" in second
    ci = (ROOT / ".ci" / "run").read_text()
    assert first in ci.splitlines()
    assert second in ci.splitlines()


def test_the_readme_is_a_front_page() -> None:
    assert len(README.encode()) < 10_000
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).is_file(), link


# -- the site and the notebook --------------------------------------------------------------------


def test_the_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]' (CI installs it)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    assert "gpuidle analyze" in (site / "reference" / "cli" / "index.html").read_text()
    assert (site / "assets" / "terminal.svg").read_text().startswith("<svg")
    assert 'id="headline"' in (site / "assets" / "report.html").read_text()


def test_the_notebook_runs_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat", reason="the docs extra: pip install -e '.[docs]' (CI installs it)")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(DOCS / "walkthrough.ipynb", as_version=4)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    nbclient.NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(DOCS)}}).execute()
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in shown if o.get("output_type") == "error"]
    first = nb.cells[1]["outputs"][0]["data"]
    assert first["text/html"].startswith("<iframe ")  # the report displayed itself


def test_every_confidence_and_every_cause_a_fix_names_is_defined() -> None:
    """The words a fix is printed with (``medium confidence · compute``) each have a row in numbers.md: the
    confidences and the causes that are not idle causes, as the bundled traces' fixes use them."""
    from gpuidle import api
    from gpuidle.model import CAUSES
    from test_reference import GPU_TRACES

    page = (DOCS / "numbers.md").read_text()
    recs = [r for name in GPU_TRACES[:6] for r in api.analyze([Path(__file__).parent / "data" / name]).recommendations]
    confidences = {r.confidence for r in recs}
    others = {r.cause for r in recs} - {c.value for c in CAUSES}
    assert {"high", "medium"} <= confidences
    assert {"compute", "trace_quality"} & others
    for word in confidences:
        assert f"| `{word}` confidence |" in page, word
    for word in others:
        assert f"| cause `{word}` |" in page, word
    assert "| exposed |" in page
