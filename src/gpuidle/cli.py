"""The command line: parse, call :mod:`gpuidle.api`, render, map errors to exit codes.

Exit codes: 0 done; 2 bad input or usage (one line on stderr, ``gpuidle: error: ...``);
130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from gpuidle import __version__, api
from gpuidle.errors import GpuidleError
from gpuidle.report.common import RenderOptions
from gpuidle.report.registry import RENDERERS, renderer_for

PROGRESS_MIN_BYTES = 50 << 20
"""Show a progress bar when the traces to read are at least this big."""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one ``gpuidle: error:`` line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise GpuidleError(message, f"see gpuidle {self.prog.split()[-1]} --help")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuidle", description="Find out why your GPUs are idle, and what to change first.")
    parser.add_argument("--version", action="version", version=f"gpuidle {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    an = sub.add_parser("analyze", help="explain where GPU time goes in PyTorch profiler traces",
                        description="Analyse one profiler trace (.json/.json.gz) or a folder of per-rank traces.")
    an.add_argument("paths", nargs="+", metavar="PATH", help="a trace file, or a folder with one trace per rank")
    an.add_argument("--json", action="store_true", help="print the JSON report (same as --format json)")
    an.add_argument("--format", choices=sorted(RENDERERS), help="output format (default: terminal, or from --out)")
    an.add_argument("--out", metavar="FILE", help="write the report to FILE instead of stdout")
    an.add_argument("--top", type=_positive_int, default=3, help="recommendations to show (default 3)")
    an.add_argument("--workers", type=_positive_int, default=None,
                    help="processes for a folder of ranks (default: CPU count)")
    an.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    an.set_defaults(func=cmd_analyze)
    return parser


@contextmanager
def _progress(paths: Sequence[str], enabled: bool) -> Iterator[api.Progress | None]:
    """A rich progress bar on stderr, for big inputs on a terminal only."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    try:
        size = sum(os.path.getsize(f) for p in paths for f in api.find_trace_files(p))
    except GpuidleError:
        size = 0
    if size < PROGRESS_MIN_BYTES:
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  transient=True, console=_stderr_console()) as bar:
        tasks: dict[str, object] = {}

        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(os.path.basename(what), total=total)
            bar.update(tasks[what], completed=done, total=total)  # type: ignore[arg-type]

        yield update


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _warn(message: str) -> None:
    print(f"gpuidle: warning: {message}", file=sys.stderr)


def cmd_analyze(args: argparse.Namespace) -> int:
    with _progress(args.paths, not args.no_progress) as progress:
        report = api.analyze(args.paths, workers=args.workers, progress=progress, warn=_warn)
    fmt = "json" if args.json else args.format
    renderer = renderer_for(fmt, args.out)()
    to_tty = args.out is None and sys.stdout.isatty()
    text = renderer.render(report, RenderOptions(top=args.top, color=to_tty))
    _emit(text, args.out)
    return 0


def _emit(text: str, out: str | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise GpuidleError(f"cannot write {out}: {err.strerror}") from None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except GpuidleError as err:
        print(f"gpuidle: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpuidle: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
