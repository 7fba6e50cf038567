"""``gpuidle history`` and ``gpuidle compare``: the ledger of runs, and whether a change helped."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from datetime import datetime
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from gpuidle import api, ledger
from gpuidle.analysis import compare as comparison
from gpuidle.cli.common import (
    PIPED_WIDTH,
    Parser,
    add_ledger_option,
    emit,
    positive_float,
    positive_int,
    refuse_overwriting_inputs,
    render_options,
    terminal_columns,
)
from gpuidle.model import RunSummary
from gpuidle.report import html
from gpuidle.report.common import ms, pct
from gpuidle.report.compare_text import COMPARE_RENDERERS, compare_renderer_for, gpu_count_words
from gpuidle.report.text import printable


def register(sub: argparse._SubParsersAction[Parser]) -> None:
    hi = sub.add_parser("history", help="list the runs recorded in the ledger, newest first",
                        description="Every run recorded by analyze, run, monitor, summarize, bench and tune, "
                                    "newest first.")
    hi.add_argument("--limit", type=positive_int, default=20, help="runs to show (default 20)")
    hi.add_argument("--kind", choices=ledger.KINDS, help="only runs of this kind")
    hi.add_argument("--json", action="store_true", help="print the runs as JSON (without their reports)")
    add_ledger_option(hi, write=False)
    hi.set_defaults(func=run_history)

    co = sub.add_parser("compare", help="before/after: did the change help? (runs by id, label or report file)",
                        description="Compare two runs: utilization, step time, idle by cause, recommendations "
                                    "resolved and new, and the cost effect when a price is given.")
    co.add_argument("before", help="a ledger run id, a label, or a JSON report (gpuidle analyze --json)")
    co.add_argument("after", help="the same, for the run after the change")
    co.add_argument("--json", action="store_true", help="print the comparison as JSON (same as --format json)")
    co.add_argument("--format", choices=sorted(COMPARE_RENDERERS), help="output format (default: terminal)")
    co.add_argument("--out", metavar="FILE", help="write the comparison to FILE instead of stdout")
    co.add_argument("--html", metavar="FILE", help="also write the side-by-side comparison as HTML")
    co.add_argument("--price", type=positive_float, metavar="PER_GPU_HOUR",
                    help="price of one GPU-hour, to show what the change saves")
    co.add_argument("--steps", type=positive_int, metavar="N",
                    help="steps in an epoch or a run, for the cost (default 1000)")
    add_ledger_option(co, write=False)
    co.set_defaults(func=run_compare)


def _when(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


def _of_kind(kind: str, wanted: str) -> bool:
    """``bench`` also matches the records of its sub-commands (``bench allreduce``, ``bench storage``)."""
    return kind == wanted or kind.startswith(wanted + " ")


def _summary(r: ledger.Run) -> RunSummary | None:
    """An analysis record's figures as compare gives them; None for other kinds and unreadable reports."""
    if r.kind not in ledger.ANALYSIS_KINDS:
        return None
    try:
        return comparison.summarize(r.analysis())
    except ledger.LedgerError:
        return None


def _gpus(r: ledger.Run, summary: RunSummary | None) -> str:
    """GPUs with work in the run; for a trace folder, of the job's world size ("2 of 128"), as compare says it."""
    if summary is not None:
        return gpu_count_words(summary)
    return str(r.gpu_count) if r.gpu_count else ""


def _as_analyze_shows_it(r: ledger.Run, summary: RunSummary | None) -> ledger.Run:
    """An analysis record with its figures as analyze and compare give them today, from the report it keeps: a
    record written before they were one figure (a median step, one GPU for an 8-GPU profile) reads the same."""
    if summary is None:
        return r
    return dataclasses.replace(r, step_s=summary.step_s, utilization=summary.utilization, gpu_count=summary.gpus)


def _utilization(r: ledger.Run, summary: RunSummary | None) -> str:
    """The recorded utilization; ``not measured`` for an analysis whose busy time holds an unmeasured wait."""
    if summary is not None and summary.utilization is None:
        return "not measured"
    return "" if r.utilization is None else pct(r.utilization)


def run_history(args: argparse.Namespace) -> int:
    path = Path(args.ledger).expanduser() if args.ledger else ledger.default_path()
    if not ledger.exists(path):
        runs: list[ledger.Run] = []
    else:
        with ledger.Ledger.for_reading(path) as book:
            runs = book.runs(limit=args.limit) if args.kind is None else \
                [r for r in book.runs() if _of_kind(r.kind, args.kind)][:args.limit]
    summaries = [_summary(r) for r in runs]  # each kept report read once
    runs = [_as_analyze_shows_it(r, s) for r, s in zip(runs, summaries, strict=True)]
    if args.json:
        rows = [{k: v for k, v in msgspec.to_builtins(r).items() if k != "report"} for r in runs]
        emit(msgspec.json.format(msgspec.json.encode(rows).decode(), indent=2) + "\n", None)
        return 0
    if not runs:
        print(f"no runs recorded in {path} yet (gpuidle analyze, run, summarize and bench record them)")
        return 0
    console = Console(file=sys.stdout, highlight=False, width=terminal_columns(PIPED_WIDTH))
    rows = [_row(r, s) for r, s in zip(runs, summaries, strict=True)]
    columns = list(COLUMNS)
    while _width(columns, rows) > console.width and (drop := [c for c in NARROW_DROPS if c in columns]):
        columns.remove(drop[0])
    t = _table(path, columns, rows)
    console.print(t)
    if len(columns) < len(COLUMNS):
        left = ", ".join(c for c in COLUMNS if c not in columns)
        console.print(f"(not shown at {console.width} columns: {left}; history --json has every field)",
                      style="bright_black")
    return 0


COLUMNS = ("id", "when", "kind", "label", "GPUs", "util", "steady step", "left out", "commit", "inputs")
NARROW_DROPS = ("inputs", "commit", "when", "kind", "left out")
"""The columns a narrow terminal goes without, first to last: never the run, its figures or its label."""


def _row(r: ledger.Run, summary: RunSummary | None) -> dict[str, str]:
    count = _gpus(r, summary)
    gpus = f"{count or '?'} × {r.gpu_model}" if r.gpu_model else count
    commit = (r.git_commit[:10] + ("*" if r.git_dirty else "")) if r.git_commit else ""
    left_out = "; ".join(summary.excluded_steps) if summary is not None else ""
    return {"id": str(r.id), "when": _when(r.created), "kind": printable(r.kind), "label": printable(r.label or ""),
            "GPUs": printable(gpus), "util": _utilization(r, summary),
            "steady step": "" if r.step_s is None else ms(r.step_s), "left out": printable(left_out),
            "commit": commit, "inputs": str(len(r.inputs))}


WORDS = ("GPUs", "left out")
"""Columns that wrap at spaces; the others (ids, labels one types into compare, times, figures) are never broken."""
WORDS_MIN = 14
"""The least width a wrapping column is given before a column is left out."""


def _width(columns: list[str], rows: list[dict[str, str]]) -> int:
    """The table's width with each column whole, or wrapped to :data:`WORDS_MIN` where it may wrap."""
    whole = [max([len(c), *(len(row[c]) for row in rows)]) for c in columns]
    return sum(min(w, WORDS_MIN) if c in WORDS else w for c, w in zip(columns, whole, strict=True)) \
        + 2 * (len(columns) - 1)


def _table(path: Path, columns: list[str], rows: list[dict[str, str]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False, title=str(path), title_justify="left",
              title_style="bright_black")
    for col in columns:
        t.add_column(col, justify="right" if col in ("id", "util", "steady step") else "left",
                     no_wrap=col not in WORDS)
    for row in rows:
        t.add_row(*(row[c] for c in columns))
    return t


def run_compare(args: argparse.Namespace) -> int:
    refuse_overwriting_inputs([args.before, args.after], {"--out": args.out, "--html": args.html})
    path = Path(args.ledger).expanduser() if args.ledger else None
    comparison, before, after = api.compare_runs(args.before, args.after, ledger_path=path,
                                                 price_per_gpu_hour=args.price, steps=args.steps)
    renderer = compare_renderer_for("json" if args.json else args.format, args.out)()
    to_tty = args.out is None and sys.stdout.isatty()
    emit(renderer.render(comparison, render_options(args, to_tty)), args.out)
    if args.html:
        emit(html.render_comparison(comparison, before, after), args.html)
    return 0
