"""Pieces every subcommand shares: the parser class, argument types, output, warnings, the ledger."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from gpuidle.errors import GpuidleError
from gpuidle.report.text import printable

if TYPE_CHECKING:
    from gpuidle.ledger import Facts
    from gpuidle.model import AnalysisReport
    from gpuidle.report.common import RenderOptions


COLOR_CHOICES = ("auto", "always", "never")

LEDGER_ENV = "GPUIDLE_LEDGER"
"""The environment variable that names the ledger file (read by :func:`gpuidle.ledger.default_path`)."""


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, as wide as the terminal, without the ``shutil`` import (with ``bz2`` and ``lzma``,
    4 ms) that argparse makes for that width on every parser, help asked or not."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width)


PIPED_WIDTH = 100
"""A report's width where it goes to no terminal (a pipe, a file, a CI log) and ``COLUMNS`` is not set."""


def terminal_columns(off_terminal: int = 80) -> int:
    """``shutil.get_terminal_size().columns``: ``COLUMNS`` if set, else the terminal's, else ``off_terminal``."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or off_terminal  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return off_terminal


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one ``gpuidle: error:`` line and exit code 2.

    Every command and subcommand takes ``--color``; a value given at any level is kept
    (the default is suppressed, so a subcommand never resets it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--color", choices=COLOR_CHOICES, default=argparse.SUPPRESS,
                          help="colour in terminal output: auto (a terminal, unless NO_COLOR is set), always, never")

    def error(self, message: str) -> None:  # type: ignore[override]
        raise GpuidleError(message, f"see {self.prog} --help")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def finite_float(text: str) -> float:
    """Any finite number (inf and nan are refused: they would only print inf or nan)."""
    return _number(text)


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


def fraction(text: str) -> float:
    """A share from 0 to 1, e.g. a utilization."""
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is outside 0..1 (give 0.55 for 55 %)")
    return value


def render_options(args: argparse.Namespace, to_tty: bool, top: int | None = None) -> RenderOptions:
    """How a command's report is laid out: its colour, and the terminal's width (``COLUMNS``, else the terminal's,
    else :data:`PIPED_WIDTH`), so that no line is longer than the screen it is read on."""
    from gpuidle.report.common import RenderOptions

    options = RenderOptions(color=use_color(args, to_tty), width=terminal_columns(PIPED_WIDTH))
    return options if top is None else replace(options, top=top)


def use_color(args: argparse.Namespace, to_tty: bool) -> bool:
    """``--color``, else colour on a terminal unless ``NO_COLOR`` is set (https://no-color.org)."""
    choice = getattr(args, "color", "auto")
    if choice != "auto":
        return bool(choice == "always")
    return to_tty and not os.environ.get("NO_COLOR")


def refuse_conflicting_formats(args: argparse.Namespace) -> str | None:
    """The format ``--json``/``--format`` ask for; both at once must agree."""
    fmt: str | None = getattr(args, "format", None)
    if getattr(args, "json", False):
        if fmt not in (None, "json"):
            raise GpuidleError(f"--json and --format {fmt} ask for different outputs", "give one of them")
        return "json"
    return fmt


def warn(message: str) -> None:
    """One line on stderr; names from the inputs in it are shown escaped (see :mod:`gpuidle.report.text`)."""
    print(f"gpuidle: warning: {printable(message)}", file=sys.stderr)


def emit(text: str, out: str | None) -> None:
    """Write to stdout, or to the file ``out``; a full disk or a closed device either way is one error line (a
    closed pipe is the reader's choice: :func:`gpuidle.cli.main` ends quietly)."""
    if out is None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise GpuidleError(f"cannot write to standard output: {err.strerror}") from None
        return
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise GpuidleError(f"cannot write {out}: {err.strerror}") from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)  # links and other spellings included
    except OSError:
        return False


def refuse_overwriting_inputs(inputs: Iterable[str | Path | None], outputs: Mapping[str, str | None]) -> None:
    """Refuse, before anything is written, an output (``{"--out": path}``) that is one of the inputs:
    an input is only ever read."""
    given = [Path(x) for x in inputs if x is not None]
    for flag, out in outputs.items():
        if out is None:
            continue
        hit = next((x for x in given if _same_file(Path(out), x)), None)
        if hit is not None:
            raise GpuidleError(f"{flag} {out} would overwrite the input {hit}", "give another output path")


def add_ledger_option(p: argparse.ArgumentParser, write: bool = True) -> None:
    """``--ledger PATH`` (and ``--no-ledger`` for commands that record), the same everywhere."""
    p.add_argument("--ledger", metavar="PATH",
                   help=f"the ledger file (default: ${LEDGER_ENV}, else the user data folder's gpuidle/ledger.sqlite)")
    if write:
        p.add_argument("--no-ledger", action="store_true", help="do not record this run in the ledger")


def ledger_path(args: argparse.Namespace) -> Path | None:
    """Where this command records, or None with ``--no-ledger``."""
    if getattr(args, "no_ledger", False):
        return None
    from gpuidle import ledger

    return Path(args.ledger).expanduser() if args.ledger else ledger.default_path()


WRITTEN = ("out", "html", "annotate", "summary")
"""The options that name a file a command writes: said with the run it recorded, in one line."""


def record_run(
    args: argparse.Namespace,
    kind: str,
    report_json: bytes | str,
    label: str | None = None,
    inputs: Sequence[str | Path] = (),
    **facts: Unpack[Facts],
) -> int | None:
    """Keep the run in the ledger; return its id, or None when not recorded.

    Recording is a side effect: a ledger that cannot be written is one warning line,
    never a failed command. On a terminal one line names the files the command wrote and
    the run (``gpuidle: wrote report.html; recorded as run 14``); scripts that read stderr
    see nothing new. Called after the command's files are written.
    """
    path = ledger_path(args)
    if path is None:
        return None
    from gpuidle import ledger

    described: list[ledger.InputFile] = []
    if inputs:
        from gpuidle import api

        described = api.describe_inputs(inputs)
    try:
        run_id = ledger.record(kind, report_json, label, described, path=path, **facts)
    except GpuidleError as err:
        warn(f"the run was not recorded in the ledger: {err}")
        return None
    if sys.stderr.isatty():
        written = [str(getattr(args, name)) for name in WRITTEN if getattr(args, name, None)]
        said = [f"wrote {', '.join(written)}"] if written else []
        said.append(f"recorded as run {run_id}" + (f" ({label})" if label else ""))
        print(f"gpuidle: {'; '.join(said)}", file=sys.stderr)
    return run_id


def record_analysis(args: argparse.Namespace, report: AnalysisReport, label: str | None) -> int | None:
    """Keep the run in the ledger; a ledger problem is a warning, never a failed analysis. A report without device
    figures (every rank's device records lost) is not kept: there is nothing in it to compare."""
    if ledger_path(args) is None:
        return None
    if not report.ranks:
        warn(f"not recorded in the ledger{f' ({label})' if label else ''}: no device figures to compare later "
             "(the device records were lost)")
        return None
    import msgspec

    from gpuidle import api
    from gpuidle.ledger import Facts, analysis_facts

    facts = analysis_facts(report)
    facts.update(Facts(notes=args.notes, batch_size=args.batch_size))
    return record_run(args, "analyze", msgspec.json.encode(report), label, api.analysis_inputs(report), **facts)
