"""``gpuidle analyze``: profiler traces in, the idle-time report out."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gpuidle import api
from gpuidle.cli.common import Parser, emit, positive_int, warn
from gpuidle.errors import GpuidleError
from gpuidle.report.common import RenderOptions
from gpuidle.report.registry import RENDERERS, renderer_for

PROGRESS_MIN_BYTES = 50 << 20
"""Show a progress bar when the traces to read are at least this big."""


def register(sub: argparse._SubParsersAction[Parser]) -> None:
    an = sub.add_parser("analyze", help="explain where GPU time goes in PyTorch profiler traces",
                        description="Analyse one profiler trace (.json/.json.gz) or a folder of per-rank traces.")
    an.add_argument("paths", nargs="+", metavar="PATH", help="a trace file, or a folder with one trace per rank")
    an.add_argument("--json", action="store_true", help="print the JSON report (same as --format json)")
    an.add_argument("--format", choices=sorted(RENDERERS), help="output format (default: terminal, or from --out)")
    an.add_argument("--out", metavar="FILE", help="write the report to FILE instead of stdout")
    an.add_argument("--top", type=positive_int, default=3, help="recommendations to show (default 3)")
    an.add_argument("--workers", type=positive_int, default=None,
                    help="processes for a folder of ranks (default: CPU count)")
    an.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    an.set_defaults(func=run)


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
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  transient=True, console=Console(stderr=True)) as bar:
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(os.path.basename(what), total=total)
            bar.update(tasks[what], completed=done, total=total)

        yield update


def run(args: argparse.Namespace) -> int:
    with _progress(args.paths, not args.no_progress) as progress:
        report = api.analyze(args.paths, workers=args.workers, progress=progress, warn=warn)
    fmt = "json" if args.json else args.format
    renderer = renderer_for(fmt, args.out)()
    to_tty = args.out is None and sys.stdout.isatty()
    emit(renderer.render(report, RenderOptions(top=args.top, color=to_tty)), args.out)
    return 0
