"""The terminal report (rich): headline, idle by cause, steps, job view, fixes."""

from __future__ import annotations

import io
import re

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuidle.model import (
    CAUSES,
    AnalysisReport,
    Combined,
    CostResult,
    DeviceReport,
    HostSide,
    JobReport,
    RankReport,
    Recommendation,
    ScaleOut,
    ranges,
)
from gpuidle.report import host_side
from gpuidle.report.code import code_block
from gpuidle.report.common import (
    CAUSE_MEANING,
    DEFAULT_OPTIONS,
    MANY_STEPS,
    OWN_STEP,
    QUALITY_HEAD,
    TARGET_UTILIZATION,
    RenderOptions,
    collectives_words,
    combined_text,
    excluded_lines,
    exposed_words,
    gain_text,
    kernel_words,
    mesh_lines,
    ms,
    pct,
    printable_report,
    quality_lines,
    role_lines,
    run_words,
    shown_recommendations,
    smi_words,
    source_label,
    startup_lines,
    step_rows,
    unmeasured_words,
    utilization_falls,
    utilization_words,
    window_words,
)
from gpuidle.report.scaleout import scale_out_lines

CAUSE_STYLE = {
    "data_loading": "magenta", "host_sync": "red", "launch_overhead": "yellow", "cpu_compute": "cyan",
    "memcpy": "blue", "communication": "green", "straggler_wait": "bright_red", "unattributed": "bright_black",
}
BAR = 30


def _bar(share: float, style: str, width: int = BAR) -> Text:
    filled = max(0, min(width, round(share * width)))
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="bright_black")


def _util_style(utilization: float) -> str:
    return "green" if utilization >= TARGET_UTILIZATION else ("yellow" if utilization >= 0.6 else "red")


def _headline(r: RankReport, d: DeviceReport) -> RenderableType:
    """The device and its utilization on the first line; its idle, what nvidia-smi would say and what was not
    measured under it, so that no width breaks a figure from its unit."""
    style = _util_style(d.utilization)
    name = f" ({d.name})" if d.name else ""
    head = Text(f"rank {r.rank} · device {d.device}{name}  ", style="bold")
    head += Text(f"utilization {utilization_words(r, d)}", style=f"bold {style}")
    head += Text(f"  (target {pct(TARGET_UTILIZATION, 0)})")
    idle = Text(f"  idle {ms(d.idle_s)} of {ms(d.window_s)}")
    smi = smi_words(d)
    if smi is not None:
        idle += Text(f" · {smi}", style="bright_black")
    unmeasured = unmeasured_words(r)
    tail = [Text(f"  {unmeasured}", style="bold yellow")] if unmeasured is not None else []
    return Group(head, idle, *tail)


def _devices(r: RankReport) -> RenderableType:
    """A rank with several devices: one row each, so that eight of them fit a narrow terminal."""
    t = Table(box=None, header_style="bold", pad_edge=False, title=f"rank {r.rank}", title_justify="left",
              title_style="bold")
    for col in ("device", "utilization", "idle", "of"):
        t.add_column(col, justify="left" if col == "device" else "right")
    for d in r.devices:
        style = _util_style(d.utilization)
        t.add_row(f"{d.device}" + (f" ({d.name})" if d.name else ""),
                  Text(utilization_words(r, d), style=f"bold {style}"),
                  ms(d.idle_s), ms(d.window_s))
    unmeasured = unmeasured_words(r)
    tail = [Text(unmeasured, style="bold yellow")] if unmeasured is not None else []
    return Group(t, Text(f"target utilization {pct(TARGET_UTILIZATION, 0)}", style="bright_black"), *tail)


def _causes(d: DeviceReport, several: bool = False) -> Table:
    """The primary device's idle by cause; where the rank has several devices, the header names which."""
    t = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    t.add_column(f"idle cause, device {d.device}" if several else "idle cause")
    t.add_column("time", justify="right")
    t.add_column("of window", justify="right")
    t.add_column("")
    for c in CAUSES:
        v = d.idle_by_cause_s[c.value]
        if v <= 0:
            continue
        share = v / d.window_s if d.window_s else 0.0
        t.add_row(Text(c.value, style=CAUSE_STYLE[c.value]), ms(v), pct(share), _bar(share, CAUSE_STYLE[c.value]))
    if d.idle_s <= 0:
        t.add_row("(no idle time)", "", "", "")
    return t


def _meanings(d: DeviceReport) -> Text:
    """What each cause in the table means, in one dim line apiece."""
    shown = [c.value for c in CAUSES if d.idle_by_cause_s[c.value] > 0]
    return Text("\n".join(f"  {c}: {CAUSE_MEANING[c]}" for c in shown), style="bright_black")


def _steps(r: RankReport) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False, title_justify="left")
    for col in ("step", "duration", "busy", "idle", "top cause"):
        t.add_column(col, justify="left" if col in ("step", "top cause") else "right")
    for row in step_rows(r):
        t.add_row(*row)
    return t


def _job(job: JobReport) -> RenderableType:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("rank", "step", "own step", "utilization", "top cause"):
        t.add_column(col, justify="right" if col in ("step", "own step", "utilization") else "left")
    for row in job.rank_table:
        t.add_row(str(row.rank), ms(row.step_s), ms(row.own_step_s), pct(row.utilization),
                  Text(row.top_cause, style=CAUSE_STYLE.get(row.top_cause, "")))
    lines: list[RenderableType] = [t, Text(OWN_STEP, style="bright_black")]
    skew = "n/a" if job.step_skew is None else f"{job.step_skew:.3f}"
    head = f"{len(job.ranks_found)} ranks"
    if job.world_size:
        head += f" of {job.world_size}"
    lines.append(Text(f"{head} · step-time skew (max/median) {skew}"))
    if job.steps and len(job.steps) <= MANY_STEPS and any(s.last_rank is not None for s in job.steps):
        st = Table(box=None, header_style="bold", pad_edge=False)
        for col in ("step", "skew", "last to arrive", "others waited"):
            st.add_column(col, justify="left" if col == "step" else "right")
        for s in job.steps:
            st.add_row(str(s.step), "n/a" if s.skew is None else f"{s.skew:.3f}",
                       "-" if s.last_rank is None else f"rank {s.last_rank}", ms(s.lateness_s))
        lines.append(st)
    for lag in job.stragglers:
        lines.append(Text(f"straggler: rank {lag.rank} late in steps {lag.steps} by {ms(lag.lateness_s)} on average, "
                          f"score {lag.score:.2f} — {lag.why}", style="bright_red"))
    c = job.communication
    overlap = "n/a" if c.overlap_ratio is None else pct(c.overlap_ratio)
    lines.append(Text(f"collectives: {exposed_words(c.collective_exposed_s, c.exposed_s, c.straggler_wait_s)} · "
                      f"overlap with compute {overlap}", style="green"))
    lines += [Text(f"  {line}", style="green") for line in role_lines(c.parallelism, c.roles)]
    lines += [Text(line, style="green") for line in mesh_lines(c.mesh, job.world_size, coordinates=False)]
    for note in job.notes:
        lines.append(Text(f"note: {note}", style="bright_black"))
    if job.missing_ranks:
        more = job.missing_count() - len(job.missing_ranks)
        lines.append(Text(f"missing ranks: {ranges(job.missing_ranks)}" + (f" and {more:,} more" if more > 0 else ""),
                          style="bright_black"))
    if job.duplicate_ranks:
        lines.append(Text(f"ranks given twice: {job.duplicate_ranks}", style="yellow"))
    return Panel(Group(*lines), title="job", title_align="left")


def _recommendation(i: int | None, rec: Recommendation) -> RenderableType:
    """The title, then under it, indented (wrapped lines too): its confidence and cause, the gain, the evidence,
    the fix's code, whole at any width (:mod:`gpuidle.report.code`). The confidence has a line of its own, so no
    width breaks it in two."""
    indent = 3 if i is not None else 6
    head = Text(f"{i}. {rec.title}" if i is not None else f"   or: {rec.title}", style="bold")
    good = rec.gain.step_s_saved is not None and rec.alternative_to is None and not utilization_falls(rec.gain)
    tag = Text(f"{rec.confidence} confidence · {rec.cause}" + (f" · rank {rec.rank}" if rec.rank is not None else ""),
               style="bright_black")
    gain = Text(gain_text(rec), style="green" if good else "yellow")
    ev = Text("evidence: " + ", ".join(f"{k}={v}" for k, v in rec.evidence.items()), style="bright_black")
    return Group(head, Padding(Group(tag, gain, ev), (0, 0, 0, indent), expand=False),
                 code_block(rec.fix, indent + 2))


def _combined(c: Combined, listed: list[Recommendation]) -> Text:
    return Text(combined_text(c, {r.id for r in listed}), style="bold")


def _cost(cost: CostResult) -> RenderableType:
    t = Table(box=None, header_style="bold", pad_edge=False, title="Cost", title_justify="left",
              title_style="bold underline")
    for col in ("", "value", "formula"):
        t.add_column(col, justify="right" if col == "value" else "left")
    for line in cost.lines:
        t.add_row(line.name.replace("_", " "), line.shown, Text(line.worked, style="bright_black"))
    notes = [Text(f"note: {n}", style="bright_black") for n in cost.notes]
    return Group(t, *notes)


def _scale_out(so: ScaleOut) -> RenderableType:
    head, answer, *rest = scale_out_lines(so)
    return Group(Text(f"At {so.gpus} GPUs", style="bold underline"), Text(head), Text(answer, style="bold"),
                 *[Text(line, style="bright_black") for line in rest])


def _host_side(console: Console, lost: list[HostSide]) -> None:
    """The first rank reported from its host side alone: its window, what its launching threads were inside, its
    steps and operators; the others named."""
    h = lost[0]
    console.print(Text(host_side.head(h), style="bold yellow"))
    console.print(Text(f"window: {host_side.window_words(h)}", style="bright_black"))
    console.print(Text(host_side.NO_DEVICE, style="yellow"))
    console.print(Text(host_side.ACTIVITY_HEAD))
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("", "time", "of window"):
        t.add_column(col, justify="left" if not col else "right")
    for row in host_side.activity_rows(h):
        t.add_row(*row)
    console.print(t)
    if h.steps:
        st = Table(box=None, header_style="bold", pad_edge=False)
        for i, col in enumerate(host_side.step_header(h)):
            st.add_column(col, justify="left" if i == 0 else "right")
        for cells in host_side.step_rows(h):
            st.add_row(*cells)
        console.print(st)
    if h.top_calls:
        ct = Table(box=None, header_style="bold", pad_edge=False, title="host operators with the most time",
                   title_justify="left")
        for col in ("operator", "calls", "time", "of window"):
            ct.add_column(col, justify="left" if col == "operator" else "right")
        for call in host_side.call_rows(h):
            ct.add_row(*call)
        console.print(ct)
    for note in h.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if len(lost) > 1:
        console.print(Text(f"ranks {ranges([x.rank for x in lost[1:]])}: host side only as well (the JSON report "
                           "holds each)", style="bright_black"))


_TRAILING_SPACES = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$", re.M)


def _without_trailing_spaces(text: str) -> str:
    """rich pads an indented block to its width; the padding is kept out of what is copied or piped."""
    return _TRAILING_SPACES.sub(r"\1", text)


class TerminalRenderer:
    name = "terminal"
    extensions: tuple[str, ...] = (".txt",)

    def render(self, report: AnalysisReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        report = printable_report(report)
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=options.color, no_color=not options.color,
                          width=options.width, highlight=False)
        n = len(report.ranks)
        if not report.ranks:  # every rank's device records lost: the host's side alone
            console.print(Text(f"gpuidle · {source_label(report.source)}", style="bold"))
            _host_side(console, report.host_side)
        else:
            console.print(Text(f"gpuidle · {n} rank{'s' if n != 1 else ''} · {source_label(report.source)}",
                               style="bold"))
            console.print(Text(f"run: {run_words(report)}", style="bold"))
        if report.job is not None:
            console.print(_job(report.job))
            worst = min(report.ranks, key=lambda r: r.primary().utilization)
            console.print(Text(f"lowest utilization: rank {worst.rank}", style="bold"))
            self._rank(console, worst, report.include_warmup)
        elif report.ranks:
            self._rank(console, report.ranks[0], report.include_warmup)
        lost = host_side.lost_ranks_line(report.host_side) if report.ranks else None
        if lost is not None:
            console.print(Text(lost, style="yellow"))
        if report.cost is not None:
            console.print(_cost(report.cost))
        if report.scale_out is not None:
            console.print(_scale_out(report.scale_out))
        quality = quality_lines(report)
        if quality:
            console.print(Text(QUALITY_HEAD, style="bold"))
        for says, recording in quality:
            console.print(Text(f"  {says}", style="yellow"))
            if recording:
                console.print(Text(f"    {recording}", style="bright_black"))
        recs = shown_recommendations(report.recommendations, options.top)
        console.print(Text("Top fixes" if recs else "Nothing to fix: no idle cause above its threshold."
                           if report.ranks else host_side.NO_FIXES, style="bold underline"))
        i = 0
        for rec in recs:
            if rec.alternative_to is None:
                i += 1
            console.print(_recommendation(i if rec.alternative_to is None else None, rec), crop=False)
        if report.combined is not None and report.combined.fixes:
            console.print(_combined(report.combined, recs))
        if len(report.recommendations) > len(recs):
            console.print(Text(f"(+{len(report.recommendations) - len(recs)} more: --top N or --format json)",
                               style="bright_black"))
        return _without_trailing_spaces(buf.getvalue())

    def _rank(self, console: Console, r: RankReport, kept: bool = False) -> None:
        console.print(Text(f"window: {window_words(r)}", style="bright_black"))
        if len(r.devices) > 1:
            console.print(_devices(r))
        else:
            console.print(_headline(r, r.devices[0]))
        console.print(_causes(r.primary(), len(r.devices) > 1))
        console.print(_meanings(r.primary()))
        if len(r.steps) > 1:
            console.print(_steps(r))
        for line in excluded_lines(r, kept):
            console.print(Text(line, style="yellow"))
        for line in startup_lines(r):
            console.print(Text(line, style="yellow"))
        c = r.communication
        collectives = collectives_words(r)
        if collectives is not None:
            console.print(Text(collectives, style="green"))
            for line in role_lines(c.parallelism, c.roles):
                console.print(Text(f"  {line}", style="green"))
            for line in mesh_lines(c.mesh, r.world_size):
                console.print(Text(line, style="green"))
        kernels = kernel_words(r.kernels)
        if kernels is not None:
            console.print(Text(kernels, style="bright_black"))
        for note in r.notes:
            console.print(Text(f"note: {note}", style="yellow"))
