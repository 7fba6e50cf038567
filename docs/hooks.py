"""MkDocs hooks: the pages and pictures that come from the code, made by each build, never pasted by hand.

- ``reference/cli.md``: every subcommand's ``--help``, from the argument parser itself;
- ``reference/schema.md``: the JSON Schema of each report, from its msgspec types;
- ``assets/report.html`` and ``assets/terminal.svg``: the HTML and terminal reports of the
  bundled example trace, rendered by gpuidle as the build runs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
EXAMPLE = ROOT / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
HELP_COLUMNS = "100"


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((f"{prefix}{name}", helps.get(name, ""), sub))
                out.extend(_subcommands(sub, f"{prefix}{name} "))
    return out


def cli_page() -> str:
    """Every command's help, as ``gpuidle CMD --help`` prints it."""
    from gpuidle.cli import build_parser

    os.environ["COLUMNS"] = HELP_COLUMNS  # argparse wraps to the terminal: the same page on every machine
    parser = build_parser()
    lines = ["# Command line", "",
             "Generated from gpuidle's argument parser at each build: what `gpuidle COMMAND --help` prints.", "",
             "```text", parser.format_help().rstrip(), "```", ""]
    for name, summary, sub in _subcommands(parser):
        lines += [f"## gpuidle {name}", "", summary[:1].upper() + summary[1:] + ".", "",
                  "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def schema_page() -> str:
    """The JSON Schema of every report gpuidle writes, from the same types that encode and decode it."""
    import msgspec

    from gpuidle.model import AnalysisReport, Comparison, CostResult, UtilizationReport

    lines = ["# JSON Schemas", "",
             "Generated from the report types at each build (`msgspec.json.schema`): the same types",
             "encode `--json` and decode it back (`AnalysisReport.from_json`). See "
             "[the JSON report](json.md) for what the fields mean.", ""]
    for title, kind in (("`gpuidle analyze --json`: `gpuidle.analysis/1`", AnalysisReport),
                        ("`gpuidle summarize --json`: `gpuidle.utilization/1`", UtilizationReport),
                        ("`gpuidle compare --json`: `gpuidle.compare/1`", Comparison),
                        ("`gpuidle cost --json`: `gpuidle.cost/2`", CostResult)):
        schema = json.dumps(msgspec.json.schema(kind), indent=2)
        lines += [f"## {title}", "", '??? note "JSON Schema"', "", "    ```json"]
        lines += [f"    {x}" for x in schema.splitlines()] + ["    ```", ""]
    return "\n".join(lines)


def example_pictures() -> dict[str, str]:
    """The example trace's HTML report (with its timeline) and its terminal report as SVG."""
    from rich.console import Console
    from rich.text import Text

    from gpuidle import api
    from gpuidle.report.common import RenderOptions
    from gpuidle.report.html import render_report
    from gpuidle.report.terminal import TerminalRenderer

    report = api.analyze([str(EXAMPLE)], workers=1)
    page = render_report(report, api.idle_timeline(EXAMPLE))
    ansi = TerminalRenderer().render(report, RenderOptions(color=True, width=110))
    console = Console(record=True, width=110, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(Text.from_ansi(ansi))
    svg = console.export_svg(title="gpuidle analyze examples/ddp_a100_rank0.pt.trace.json.gz")
    return {"assets/report.html": page, "assets/terminal.svg": svg}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    generated = {"reference/cli.md": cli_page(), "reference/schema.md": schema_page(), **example_pictures()}
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    return files
