"""A comparison as text: terminal (rich), Markdown for a pull request, or JSON (``gpuidle.compare/1``)."""

from __future__ import annotations

import io
from typing import Protocol

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuidle.errors import GpuidleError
from gpuidle.model import Comparison, RecommendationChange, RunSummary
from gpuidle.report.common import DEFAULT_OPTIONS, RenderOptions, ms, pct, printable_report

STATUS_TITLE = {"resolved": "resolved", "new": "new", "remaining": "still recommended"}


def run_name(s: RunSummary) -> str:
    return f"{s.label} ({s.ref})" if s.label and s.ref else (s.label or s.ref or "run")


def money(v: float) -> str:
    """Two decimals, or three significant digits for small sums (a cost of 1000 steps can be cents)."""
    return f"{v:,.2f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"


def util_words(share: float | None) -> str:
    """A run's utilization, or ``not measured``."""
    return "not measured" if share is None else pct(share)


def _signed_ms(seconds: float) -> str:
    return ("+" if seconds > 0 else ("−" if seconds < 0 else "±")) + ms(abs(seconds))


def _signed_pts(share: float) -> str:
    return ("+" if share > 0 else ("−" if share < 0 else "±")) + f"{abs(share) * 100:.1f} pts"


def gpu_count_words(s: RunSummary) -> str:
    """The GPUs with work, and the part of the job traced where it is a part: ``8``, ``2 of 128``,
    ``8 (1 of 2 ranks)``; history and compare both say it so."""
    if s.ranks >= s.world_size:
        return str(s.gpus)
    return f"{s.gpus} of {s.world_size}" if s.gpus == s.ranks else f"{s.gpus} ({s.ranks} of {s.world_size} ranks)"


def _gpus(s: RunSummary) -> str:
    count = gpu_count_words(s)
    gpus = f"{count} × {s.gpu_model}" if s.gpu_model else f"{count} GPU(s)"
    return gpus + (f", batch {s.batch_size}" if s.batch_size is not None else "")


def _gain(x: RecommendationChange) -> str:
    before = "-" if x.gain_before_s is None else ms(x.gain_before_s)
    after = "-" if x.gain_after_s is None else ms(x.gain_after_s)
    return f"{before} → {after} per step"


def headline_rows(c: Comparison) -> list[tuple[str, str, str, str]]:
    """``(figure, before, after, change)``, shared by the text renderers."""
    a, b = c.before, c.after
    speed = "" if c.speedup is None else f" ({c.speedup:.2f}×)"
    rows = [
        ("utilization", util_words(a.utilization), util_words(b.utilization),
         "n/a" if c.utilization_delta is None else _signed_pts(c.utilization_delta)),
        ("steady step", ms(a.step_s), ms(b.step_s), _signed_ms(c.step_s_delta) + speed),
        ("idle per steady step", ms(a.idle_s), ms(b.idle_s), _signed_ms(b.idle_s - a.idle_s)),
    ]
    rows += [(f"  {k}", ms(a.idle_by_cause_s[k]), ms(b.idle_by_cause_s[k]), _signed_ms(v))
             for k, v in c.idle_by_cause_delta_s.items() if a.idle_by_cause_s[k] > 0 or b.idle_by_cause_s[k] > 0]
    if c.cost is not None:
        k = c.cost
        rows.append((f"cost of {k.steps:,} steps at {k.price_per_gpu_hour:g}/GPU-h", money(k.before),
                     money(k.after), ("saves " if k.saved >= 0 else "costs ") + money(abs(k.saved))))
    return rows


class CompareRenderer(Protocol):
    name: str

    def render(self, c: Comparison, options: RenderOptions = ...) -> str: ...


class CompareTerminalRenderer:
    name = "terminal"

    def render(self, c: Comparison, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        c = printable_report(c)
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=options.color, no_color=not options.color,
                          width=options.width, highlight=False)
        console.print(Text(f"gpuidle compare · {run_name(c.before)} → {run_name(c.after)}", style="bold"))
        console.print(Text(f"before: {_gpus(c.before)} · after: {_gpus(c.after)}", style="bright_black"))
        if not c.comparable:
            console.print(Text("not comparable: " + "; ".join(c.differences), style="bold red"))
        for n in c.notes:
            console.print(Text(f"note: {n}", style="yellow"))
        t = Table(box=None, header_style="bold", pad_edge=False)
        for col in ("", "before", "after", "change"):
            t.add_column(col, justify="left" if not col else "right")
        for name, before, after, change in headline_rows(c):
            better = change.startswith(("−", "saves")) if name != "utilization" else change.startswith("+")
            style = "bright_black" if change.startswith("±") else ("green" if better else "red")
            t.add_row(name, before, after, Text(change, style=style))
        console.print(t)
        for status, title in STATUS_TITLE.items():
            items = [x for x in c.recommendations if x.status == status]
            if items:
                console.print(Text(f"{title}:", style="bold"))
                for x in items:
                    console.print(Text(f"  {x.title}  [{x.id} · {x.cause} · gain {_gain(x)}]"))
        return buf.getvalue()


class CompareMarkdownRenderer:
    name = "md"

    def render(self, c: Comparison, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        c = printable_report(c)
        a, b = c.before, c.after
        lines = [f"## gpuidle compare: {run_name(a)} → {run_name(b)}", "",
                 f"Before: {_gpus(a)}, {a.ranks} rank(s), {a.steps} step(s). "
                 f"After: {_gpus(b)}, {b.ranks} rank(s), {b.steps} step(s).", ""]
        if not c.comparable:
            lines += ["> **Not comparable**: " + "; ".join(c.differences), ""]
        lines += [f"> {n}" for n in c.notes] + ([""] if c.notes else [])
        lines += ["| | before | after | change |", "|---|---:|---:|---:|"]
        lines += [f"| {'&nbsp;&nbsp;' if n.startswith('  ') else ''}{n.strip()} | {x} | {y} | {d} |"
                  for n, x, y, d in headline_rows(c)]
        lines.append("")
        for status, title in STATUS_TITLE.items():
            items = [x for x in c.recommendations if x.status == status]
            if items:
                lines += [f"**Recommendations {title}**", ""]
                lines += [f"- {x.title} (`{x.id}`, {x.cause}; gain {_gain(x)})" for x in items]
                lines.append("")
        return "\n".join(lines)


class CompareJsonRenderer:
    name = "json"

    def render(self, c: Comparison, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        return msgspec.json.format(msgspec.json.encode(c).decode(), indent=2) + "\n"


COMPARE_RENDERERS: dict[str, type[CompareRenderer]] = {
    r.name: r for r in (CompareTerminalRenderer, CompareMarkdownRenderer, CompareJsonRenderer)
}
_EXTENSIONS = {".md": "md", ".json": "json", ".txt": "terminal"}


def compare_renderer_for(name: str | None = None, path: str | None = None) -> type[CompareRenderer]:
    """By name, else by the output file's extension, else the terminal."""
    if name:
        if name not in COMPARE_RENDERERS:
            raise GpuidleError(f"unknown format {name!r}", f"choose one of {', '.join(COMPARE_RENDERERS)}")
        return COMPARE_RENDERERS[name]
    for ext, fmt in _EXTENSIONS.items():
        if path and path.endswith(ext):
            return COMPARE_RENDERERS[fmt]
    return CompareTerminalRenderer


def load_comparison(text: bytes | str) -> Comparison:
    return msgspec.json.decode(text, type=Comparison)

