"""The README stays true: every subcommand has help and is documented; the Quickstart is two commands."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gpuidle.cli import build_parser

README = (Path(__file__).parent.parent / "README.md").read_text()


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


@pytest.mark.parametrize(("name", "parser"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_subcommand_is_in_the_readme(name: str, parser: argparse.ArgumentParser) -> None:
    assert f"gpuidle {name}" in README, f"`gpuidle {name}` is not mentioned in README.md"
    assert parser.format_help()


def test_quickstart_has_exactly_two_commands() -> None:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) == 2
    assert "gpuidle analyze examples/" in commands[0]
    assert "pytest" in commands[1]
    example = commands[0].split("gpuidle analyze ", 1)[1].split()[0]
    assert (Path(__file__).parent.parent / example).is_file()


def test_quickstart_installs_the_core_first_and_ci_runs_both_verbatim() -> None:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    first, second = (line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    assert first.startswith("pip install -e . ")
    assert "[dev]" not in first
    assert "'.[dev]'" in second
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert first in ci.splitlines()
    assert second in ci.splitlines()
