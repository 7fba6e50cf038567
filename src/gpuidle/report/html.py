"""The HTML report: one self-contained file of inline SVG, readable offline, forever.

No script, no font, no stylesheet or image is fetched: the charts are SVG written
here, the style is inline, and a Content-Security-Policy forbids the page any request
at all, so it opens the same from a laptop on a plane as from a CI artifact.

What it shows, the decision first: the headline (utilization and the largest idle cause),
the recommendations as ranked cards with their evidence and gain, and every fix together;
then the evidence: per device, utilization and idle by cause, and the one-time start-up cost
left out of every step (in the terminal report's words); utilization over time with idle
intervals coloured by cause (from :func:`gpuidle.api.idle_timeline`); per step, busy vs idle
by cause as stacked bars; for a job, a rank x step heatmap of utilization; the collectives
and kernels. For ``gpuidle compare``, the two runs side by side.
Every number comes from the report, the comparison or the timeline; this module only
places them.
"""

from __future__ import annotations

import html

from gpuidle.advice.hardware import hardware
from gpuidle.model import (
    CAUSES,
    AnalysisReport,
    CommReport,
    Comparison,
    DeviceReport,
    IdleTimeline,
    JobReport,
    KernelFacts,
    RankReport,
    Recommendation,
    RunSummary,
    ranges,
)
from gpuidle.probes.common import human_bytes
from gpuidle.report import host_side
from gpuidle.report.common import (
    CAUSE_MEANING,
    DEFAULT_OPTIONS,
    OWN_STEP,
    QUALITY_HEAD,
    STARTUP_SHOWN,
    RenderOptions,
    combined_text,
    exposed_words,
    gain_text,
    mesh_lines,
    ms,
    pct,
    quality_lines,
    role_lines,
    run_words,
    source_label,
    startup_head,
    startup_item,
    unmeasured_words,
    utilization_words,
    window_words,
)
from gpuidle.report.compare_text import gpu_count_words, money, util_words
from gpuidle.report.svg import (
    CAUSE_COLOR,
    MAX_INTERVAL_RECTS,
    SIDE_WIDTH,
    cause_bar,
    cause_delta_chart,
    esc,
    heatmap_chart,
    legend,
    page,
    steps_chart,
    timeline_chart,
    util_class,
)

# -- sections --------------------------------------------------------------------------


def _device_card(r: RankReport, d: DeviceReport) -> str:
    name = f" · {esc(d.name)}" if d.name else ""
    tool = hardware(d).smi
    smi = (f'<div class="note">{tool} would count {pct(d.active_s / d.window_s)} (collectives included)</div>'
           if d.active_s > d.busy_s and d.window_s and tool is not None else "")
    return (f'<div class="card"><h3>rank {r.rank} · GPU {d.device}{name}</h3>'
            f'<div class="big {util_class(d.utilization)}">{utilization_words(r, d)}</div>'
            f'<div class="muted">utilization · idle {ms(d.idle_s)} of {ms(d.window_s)}</div>{smi}</div>')


def _cause_table(d: DeviceReport, several: bool = False) -> str:
    rows = "".join(
        f'<tr title="{esc(CAUSE_MEANING[c.value])}"><td><i class="chip" style="background:{CAUSE_COLOR[c.value]}">'
        f'&nbsp;</i>{c.value}<div class="muted">{esc(CAUSE_MEANING[c.value])}</div></td>'
        f'<td class="num">{ms(d.idle_by_cause_s[c.value])}</td>'
        f'<td class="num">{pct(d.idle_by_cause_s[c.value] / d.window_s if d.window_s else 0.0)}</td></tr>'
        for c in CAUSES if d.idle_by_cause_s.get(c.value, 0.0) > 0)
    head = f"idle cause, GPU {d.device}" if several else "idle cause"
    return (f'<table><tr><th>{head}</th><th class="num">time</th><th class="num">of window</th></tr>'
            + (rows or '<tr><td colspan="3">no idle time</td></tr>') + "</table>")


def _startup(r: RankReport) -> str:
    """The terminal's start-up line and calls, in its words; the calls past the first few fold away."""
    head = startup_head(r)
    if head is None:
        return ""
    items = [f"<li>{esc(startup_item(c))}</li>" for c in r.startup]
    more = (f'<details><summary>+{len(items) - STARTUP_SHOWN} more</summary><ul class="startup">'
            f"{''.join(items[STARTUP_SHOWN:])}</ul></details>" if len(items) > STARTUP_SHOWN else "")
    return (f'<div id="startup"><p class="note">{esc(head)}</p><ul class="startup">'
            f"{''.join(items[:STARTUP_SHOWN])}</ul>{more}</div>")


def recommendation_card(i: int, rec: Recommendation) -> str:
    ev = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rec.evidence.items())
    color = CAUSE_COLOR.get(rec.cause, "#546e7a")
    where = f" · rank {rec.rank}" if rec.rank is not None else ""
    return (f'<div class="card rec"><h3>{i}. {esc(rec.title)}</h3>'
            f'<div><span class="chip" style="background:{color}">{esc(rec.cause)}</span>'
            f'<span class="muted">{esc(rec.confidence)} confidence{where}</span></div>'
            f'<p class="good"><b>{esc(gain_text(rec))}</b></p>'
            f"<table><tr><th>evidence</th><th></th></tr>{ev}</table>"
            f"<pre><code>{esc(rec.fix)}</code></pre></div>")


def _collectives_table(c: CommReport, world: int | None) -> str:
    """The terminal's collectives line, and each collective type, group and size bucket."""
    if c.comm_s <= 0:
        return ""
    rows = "".join(
        f"<tr><td>{esc(s.collective)}</td><td>{esc(s.process_group)}</td><td>{esc(s.size_bucket)}</td>"
        f'<td class="num">{s.count}</td><td class="num">{human_bytes(s.bytes) if s.bytes else "n/a"}</td>'
        f'<td class="num">{ms(s.total_s)}</td>'
        f'<td class="num">{"n/a" if s.busbw_gbps is None else f"{s.busbw_gbps:.2f} GB/s"}</td></tr>'
        for s in c.collectives)
    overlap = "n/a" if c.overlap_ratio is None else pct(c.overlap_ratio)
    roles = "".join(f"<li>{esc(line.strip())}</li>" for line in role_lines(c.parallelism, c.roles)
                    + mesh_lines(c.mesh, world))
    return (f'<h3>Collectives</h3><p class="note">{ms(c.comm_s)} on the device, {ms(c.exposed_s)} exposed '
            f"(no compute running), overlap with compute {overlap}</p>" + (f"<ul>{roles}</ul>" if roles else "") +
            '<table class="collectives"><tr><th>op</th><th>group</th><th>size</th><th class="num">count</th>'
            '<th class="num">bytes</th><th class="num">time</th><th class="num">busbw</th></tr>'
            f"{rows}</table>")


def _kernels_table(k: KernelFacts) -> str:
    """The top kernels by device time, and the kernel facts the terminal prints."""
    if not k.count:
        return ""
    rows = "".join(f'<tr><td><code>{esc(s.name)}</code></td><td class="num">{s.count}</td>'
                   f'<td class="num">{ms(s.total_s)}</td><td class="num">{pct(s.share)}</td></tr>' for s in k.top)
    gemm = ("" if k.reduced_precision_gemm_share is None
            else f" · GEMM/conv in fp16/bf16 or on matrix units: {pct(k.reduced_precision_gemm_share)}")
    return (f'<h3>Kernels</h3><p class="note">{k.count:,} kernels, {ms(k.total_s)}; '
            f"{pct(k.short_kernel_share)} of kernel time in kernels &lt; 10 µs{gemm} · syncs/step "
            f"{k.syncs_per_step:.1f} · .item()/step {k.item_calls_per_step:.1f}</p>"
            '<table class="kernels"><tr><th>kernel</th><th class="num">count</th><th class="num">time</th>'
            f'<th class="num">of kernel time</th></tr>{rows}</table>')


def _job_section(job: JobReport) -> str:
    rows = "".join(f'<tr><td>{r.rank}</td><td class="num">{ms(r.step_s)}</td><td class="num">{ms(r.own_step_s)}</td>'
                   f'<td class="num">{pct(r.utilization)}</td><td>{esc(r.top_cause)}</td></tr>' for r in job.rank_table)
    skew = "n/a" if job.step_skew is None else f"{job.step_skew:.3f}"
    world = f" of {job.world_size}" if job.world_size else ""
    items = [f"<li class=\"bad\">straggler: rank {s.rank}, late by {ms(s.lateness_s)} in steps {s.steps}, "
             f"score {s.score:.2f}: {esc(s.why)}</li>" for s in job.stragglers]
    c = job.communication
    items.append(f"<li>collectives: {esc(exposed_words(c.collective_exposed_s, c.exposed_s, c.straggler_wait_s))} · "
                 f"overlap {'n/a' if c.overlap_ratio is None else pct(c.overlap_ratio)}</li>")
    items.append(f'<li class="muted">{esc(OWN_STEP)}</li>')
    items += [f"<li>{esc(line.strip())}</li>" for line in role_lines(c.parallelism, c.roles)
              + mesh_lines(c.mesh, job.world_size, coordinates=False)]
    items += [f'<li class="muted">{esc(n)}</li>' for n in job.notes]
    return (f'<section id="job"><h2>Job: {len(job.ranks_found)} ranks{world} · step-time skew {skew}</h2>'
            '<table><tr><th>rank</th><th class="num">step</th><th class="num">own step</th>'
            '<th class="num">utilization</th><th>top cause</th></tr>'
            f"{rows}</table><ul>{''.join(items)}</ul></section>")


def _shown_rank(report: AnalysisReport) -> RankReport:
    return report.ranks[0] if len(report.ranks) == 1 else min(report.ranks, key=lambda r: r.primary().utilization)


def _headline(report: AnalysisReport, shown: RankReport) -> str:
    """The answer first: the shown device's utilization, its idle time and the cause that holds the most of it."""
    d = shown.primary()
    cause, idle = max(d.idle_by_cause_s.items(), key=lambda kv: kv[1], default=("", 0.0))
    top = (f'; most of it <span class="chip" style="background:{CAUSE_COLOR[cause]}">{esc(cause)}</span> '
           f"{ms(idle)}" if idle > 0 else "")
    where = f"rank {shown.rank} · GPU {d.device}" + (f" · {esc(d.name)}" if d.name else "")
    lowest = " (the lowest of the job)" if len(report.ranks) > 1 else ""
    return (f'<section id="headline"><h2>{where}{lowest}: <span class="{util_class(d.utilization)}">'
            f"utilization {utilization_words(shown, d)}</span></h2>"
            f'<p class="lead">idle {ms(d.idle_s)} of {ms(d.window_s)}{top}.</p>'
            + (f'<p class="bad">{esc(unmeasured)}</p>' if (unmeasured := unmeasured_words(shown)) else "")
            + "</section>")


def _decision(report: AnalysisReport) -> str:
    """The ranked fixes with their gains, then every fix together: what to do, before why."""
    recs = report.recommendations
    cards = "".join(recommendation_card(i, r) for i, r in enumerate(recs, 1))
    both = report.combined
    plan = (f'<p id="combined" class="combined"><b>{esc(combined_text(both, {r.id for r in recs}))}</b></p>'
            if both is not None and both.fixes else "")
    quality = "".join(f"<li>{esc(says)}" + (f' <span class="muted">{esc(rec)}</span>' if rec else "") + "</li>"
                      for says, rec in quality_lines(report))
    head = f'<section id="quality"><h2>{QUALITY_HEAD}</h2><ul>{quality}</ul></section>' if quality else ""
    return (head + '<section id="recommendations"><h2>What to change first</h2>'
            + (cards + plan or "<p>Nothing to fix: no idle cause above its threshold.</p>") + "</section>")


def _rows(header: list[str], rows: list[list[str]]) -> str:
    """A table of text cells, every column but the first one of numbers."""
    num = ' class="num"'
    head = "".join(f"<th{num if i else ''}>{esc(c)}</th>" for i, c in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{num if i else ''}>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _host_side_page(report: AnalysisReport) -> str:
    """The page of a report whose every rank lost its device records: the first rank's host side (what its
    launching threads were inside, its steps and operators), what the trace cannot tell, and no fix."""
    lost = report.host_side
    h = lost[0]
    others = (f'<p class="note">ranks {esc(ranges([x.rank for x in lost[1:]]))}: host side only as well (the JSON '
              "report holds each)</p>" if len(lost) > 1 else "")
    quality = "".join(f"<li>{esc(says)}" + (f' <span class="muted">{esc(rec)}</span>' if rec else "") + "</li>"
                      for says, rec in quality_lines(report))
    body = [f"<header><h1>gpuidle · {esc(source_label(report.source))}</h1>"
            f'<div class="muted">{esc(", ".join(report.source.paths))}</div></header>',
            f'<section id="headline"><h2>{esc(host_side.head(h))}</h2>'
            f'<p class="lead">{esc(host_side.NO_DEVICE)}.</p>'
            f'<p class="note">window: {esc(host_side.window_words(h, ", "))}</p>{others}</section>',
            f'<section id="quality"><h2>{QUALITY_HEAD}</h2><ul>{quality}</ul></section>',
            f'<section id="recommendations"><h2>What to change first</h2><p>{esc(host_side.NO_FIXES)}</p></section>',
            f'<section id="host"><h2>The host</h2><p class="note">{esc(host_side.ACTIVITY_HEAD)}</p>'
            + _rows(["", "time", "of window"], [list(r) for r in host_side.activity_rows(h)])
            + (_rows(host_side.step_header(h), host_side.step_rows(h)) if h.steps else "")
            + (_rows(["operator", "calls", "time", "of window"], [list(r) for r in host_side.call_rows(h)])
               if h.top_calls else "")
            + "".join(f'<p class="note">note: {esc(x)}</p>' for x in h.notes) + "</section>"]
    return page("gpuidle report", body)


def render_report(report: AnalysisReport, timeline: IdleTimeline | None = None,
                  options: RenderOptions = DEFAULT_OPTIONS) -> str:
    """The full page for one analysis; ``timeline`` adds the utilization-over-time charts.

    The decision comes first (headline, ranked fixes, all fixes together), the evidence after it
    (utilization and causes, charts over time and per step, the job, the device's work). A report whose every rank
    lost its device records shows the host's side instead.
    """
    if not report.ranks:
        return _host_side_page(report)
    n = len(report.ranks)
    shown = _shown_rank(report)
    body = [f"<header><h1>gpuidle · {n} rank{'s' if n != 1 else ''} · {esc(source_label(report.source))}</h1>"
            f'<div class="muted">{esc(", ".join(report.source.paths))}</div>'
            f'<p id="run">run: {esc(run_words(report))}</p></header>',
            _headline(report, shown), _decision(report)]
    body.append(f'<section id="summary"><h2>Utilization</h2><p class="note">window: {esc(window_words(shown, ", "))}'
                + (f"; rank {shown.rank} has the lowest utilization of the job" if n > 1 else "") + "</p>"
                + '<div class="grid">' + "".join(_device_card(shown, d) for d in shown.devices) + "</div>"
                + "".join(cause_bar(d) for d in shown.devices) + legend()
                + _cause_table(shown.primary(), len(shown.devices) > 1)
                + _startup(shown)
                + "".join(f'<p class="note">note: {esc(x)}</p>' for x in shown.notes)
                + (f'<p class="note">{esc(lost)}</p>' if (lost := host_side.lost_ranks_line(report.host_side)) else "")
                + "</section>")
    if timeline is not None:
        note = f'<p class="note">{esc(timeline.note)}</p>' if timeline.note else ""
        body.append(f'<section id="timeline"><h2>Over time: rank {timeline.rank}</h2>{note}'
                    '<p class="note">top: utilization in slices of the window, busy at the bottom and idle causes '
                    "above; below: the idle intervals, coloured by cause (hover for step and length; "
                    f"above {MAX_INTERVAL_RECTS:,} intervals, each slice is split in proportion to its idle time "
                    "by cause; busy is blank). "
                    "Dashed lines are step starts.</p>"
                    + "".join(f"<h3>GPU {d.device}{' · ' + esc(d.name) if d.name else ''}</h3>"
                              + timeline_chart(d) for d in timeline.devices)
                    + legend() + "</section>")
    if shown.steps:
        body.append(f'<section id="steps"><h2>Per step: rank {shown.rank}, GPU {shown.primary().device}</h2>'
                    + steps_chart(shown) + legend() + "</section>")
    if n > 1:
        body.append('<section id="heatmap"><h2>Utilization by rank and step</h2>' + heatmap_chart(report.ranks)
                    + "</section>")
    if report.job is not None:
        body.append(_job_section(report.job))
    body.append(f'<section id="device-work"><h2>Device work: rank {shown.rank}</h2>'
                + _collectives_table(shown.communication, shown.world_size) + _kernels_table(shown.kernels)
                + "</section>")
    return page("gpuidle report", body)


NOTEBOOK_HEIGHT_PX = 760


def render_inline(report: AnalysisReport) -> str:
    """The same page, for a notebook cell: in an iframe of its own, so that its style stays inside it and
    the notebook's stays out (``srcdoc``: nothing is fetched; sandboxed: no script, no form, no navigation)."""
    return (f'<iframe class="gpuidle-report" title="gpuidle report" sandbox="allow-same-origin" '
            f'style="width:100%;height:{NOTEBOOK_HEIGHT_PX}px;border:1px solid #d9e2ec;border-radius:8px" '
            f'srcdoc="{html.escape(render_report(report), quote=True)}"></iframe>')


# -- comparison ------------------------------------------------------------------------


def _run_name(s: RunSummary) -> str:
    return f"{s.label} ({s.ref})" if s.label and s.ref else (s.label or s.ref or "run")


def _delta(v: float, fmt: str, better_when_lower: bool) -> str:
    cls = "muted" if v == 0 else ("good" if (v < 0) == better_when_lower else "bad")
    sign = "+" if v > 0 else ("−" if v < 0 else "±")
    return f'<span class="{cls}">{sign}{fmt}</span>'


def _side(title: str, s: RunSummary, report: AnalysisReport, y_max: float) -> str:
    r = _shown_rank(report)
    count = gpu_count_words(s)
    gpus = f"{count} × {s.gpu_model}" if s.gpu_model else f"{count} GPU(s)"
    batch = f" · batch {s.batch_size}" if s.batch_size is not None else ""
    return (f'<div class="card"><h3>{esc(title)}: {esc(_run_name(s))}</h3>'
            f'<div class="muted">{esc(gpus)}{batch} · {s.ranks} rank(s) · {s.steps} step(s)</div>'
            f'<div class="big {util_class(s.utilization or 0.0)}">{util_words(s.utilization)}</div>'
            f'<div class="muted">utilization · steady step {ms(s.step_s)} · idle {ms(s.idle_s)} per step</div>'
            + cause_bar(r.primary(), SIDE_WIDTH) + f'<p class="note">per step, rank {r.rank}:</p>'
            + steps_chart(r, y_max, SIDE_WIDTH)
            + "</div>")


def render_comparison(c: Comparison, before: AnalysisReport, after: AnalysisReport) -> str:
    """The compare page: verdict, headline deltas, idle by cause, both runs side by side, fixes."""
    a, b = c.before, c.after
    body = [f"<header><h1>gpuidle compare</h1><div class=\"muted\">{esc(_run_name(a))} → {esc(_run_name(b))}"
            "</div></header>"]
    if c.comparable:
        verdict = ('<section class="verdict"><b>Comparable runs</b>: the same GPU model, world size and batch, '
                   "as far as the runs record them.")
    else:
        verdict = ('<section class="verdict no"><b>Not comparable</b>: the work per step changed.<ul>'
                   + "".join(f"<li>{esc(d)}</li>" for d in c.differences) + "</ul>")
    verdict += "".join(f'<p class="note">{esc(n)}</p>' for n in c.notes) + "</section>"
    body.append(verdict)
    speed = "n/a" if c.speedup is None else f"{c.speedup:.2f}×"
    rows = [
        ("utilization", util_words(a.utilization), util_words(b.utilization),
         "n/a" if c.utilization_delta is None else
         _delta(c.utilization_delta, f"{abs(c.utilization_delta) * 100:.1f} pts", False)),
        ("steady step", ms(a.step_s), ms(b.step_s), _delta(c.step_s_delta, ms(abs(c.step_s_delta)), True)
         + f" <span class=\"muted\">({speed})</span>"),
        ("idle per steady step", ms(a.idle_s), ms(b.idle_s),
         _delta(b.idle_s - a.idle_s, ms(abs(b.idle_s - a.idle_s)), True)),
    ]
    if c.cost is not None:
        k = c.cost
        rows.append((f"cost of {k.steps:,} steps at {k.price_per_gpu_hour:g}/GPU-h", money(k.before),
                     money(k.after), _delta(-k.saved, money(abs(k.saved)), True)))
    body.append('<section id="headline"><h2>Before and after</h2><table><tr><th></th><th class="num">before</th>'
                '<th class="num">after</th><th class="num">change</th></tr>'
                + "".join(f'<tr><td>{esc(n)}</td><td class="num">{x}</td><td class="num">{y}</td>'
                          f'<td class="num">{d}</td></tr>' for n, x, y, d in rows) + "</table></section>")
    body.append('<section id="causes"><h2>Idle per step, by cause</h2>' + cause_delta_chart(c)
                + '<p class="note">light: before; full colour: after.</p></section>')
    y_max = max([s.dur_s for r in (_shown_rank(before), _shown_rank(after)) for s in r.steps] + [1e-9])
    body.append('<section id="side-by-side"><h2>Side by side</h2><div class="side">'
                + _side("before", a, before, y_max) + _side("after", b, after, y_max) + "</div>" + legend()
                + "</section>")
    groups = {"resolved": "Resolved", "new": "New", "remaining": "Still recommended"}
    parts = []
    for status, title in groups.items():
        items = [x for x in c.recommendations if x.status == status]
        if not items:
            continue
        lis = "".join(
            f'<li><span class="chip" style="background:{CAUSE_COLOR.get(x.cause, "#546e7a")}">{esc(x.cause)}</span>'
            f"{esc(x.title)} <span class=\"muted\">({esc(x.id)}; gain "
            f"{'-' if x.gain_before_s is None else ms(x.gain_before_s)} → "
            f"{'-' if x.gain_after_s is None else ms(x.gain_after_s)} per step)</span></li>" for x in items)
        parts.append(f"<h3>{title}</h3><ul>{lis}</ul>")
    body.append('<section id="recommendations"><h2>Recommendations</h2>'
                + ("".join(parts) or "<p>None in either run.</p>") + "</section>")
    return page("gpuidle compare", body)


class HtmlRenderer:
    """The report without the timeline (that needs the trace again: ``gpuidle analyze --html``)."""

    name = "html"
    extensions: tuple[str, ...] = (".html", ".htm")

    def render(self, report: AnalysisReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        return render_report(report, None, options)
