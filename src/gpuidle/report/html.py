"""The HTML report: one self-contained file of inline SVG, readable offline, forever.

No script, no font, no stylesheet or image is fetched: the charts are SVG written
here, the style is inline, and a Content-Security-Policy forbids the page any request
at all, so it opens the same from a laptop on a plane as from a CI artifact.

What it shows: per device, utilization over time with idle intervals coloured by cause
(from :func:`gpuidle.api.idle_timeline`); per step, busy vs idle by cause as stacked
bars; for a job, a rank x step heatmap of utilization; the recommendations as cards
with their evidence and gain; and, for ``gpuidle compare``, the two runs side by side.
Every number comes from the report, the comparison or the timeline; this module only
places them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise

from gpuidle.model import (
    CAUSES,
    AnalysisReport,
    Comparison,
    DeviceReport,
    DeviceTimeline,
    IdleTimeline,
    JobReport,
    RankReport,
    Recommendation,
    RunSummary,
)
from gpuidle.report.common import DEFAULT_OPTIONS, TARGET_UTILIZATION, RenderOptions, ms, pct
from gpuidle.report.compare_text import money

CAUSE_COLOR = {
    "data_loading": "#8e44ad", "host_sync": "#e53935", "launch_overhead": "#f9a825", "cpu_compute": "#00acc1",
    "memcpy": "#1e88e5", "communication": "#43a047", "straggler_wait": "#ff7043", "unattributed": "#9e9e9e",
}
BUSY_COLOR = "#37474f"
MAX_INTERVAL_RECTS = 3000
"""Above this many idle intervals on a device, they are drawn as one path per cause, without tooltips."""
WIDTH = 1000
SIDE_WIDTH = 520
"""Charts in the half-width columns of the compare page: drawn narrower so their text stays legible."""
LEFT, RIGHT = 56, 12
PLOT = WIDTH - LEFT - RIGHT

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
:root{--fg:#1f2933;--muted:#616e7c;--line:#d9e2ec;--bg:#f5f7fa}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);
 background:var(--bg);margin:0;padding:24px}
main{max-width:1080px;margin:0 auto}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:15px;margin:0 0 6px}
.muted{color:var(--muted)}.note{color:var(--muted);font-size:13px;margin:4px 0}
section,.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:14px 16px;margin:12px 0}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:12px}
.big{font-size:28px;font-weight:600}.good{color:#2e7d32}.warn{color:#ef6c00}.bad{color:#c62828}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line)}td.num,th.num{text-align:right}
.chip{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;color:#fff;margin-right:6px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}
pre{background:#263238;color:#eceff1;padding:10px 12px;border-radius:6px;overflow-x:auto;font-size:12px}
svg{display:block;width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#52606d}
.verdict{border-left:5px solid #2e7d32}.verdict.no{border-left-color:#c62828}
.side{display:grid;grid-template-columns:1fr 1fr;gap:12px}
"""


# -- primitives ------------------------------------------------------------------------


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _f(x: float) -> str:
    """A coordinate, short."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _page(title: str, body: Iterable[str]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head>\n<body><main>\n"
            + "\n".join(body) + "\n</main></body></html>\n")


def _svg(height: float, content: Iterable[str], label: str, cls: str, width: int = WIDTH) -> str:
    return (f'<svg class="{cls}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {_f(height)}" '
            f'role="img" aria-label="{_e(label)}">' + "".join(content) + "</svg>")


def _title(text: str) -> str:
    return f"<title>{_e(text)}</title>"


def _legend(with_busy: bool = True) -> str:
    items = ([f'<span><i style="background:{BUSY_COLOR}"></i>busy</span>'] if with_busy else []) + [
        f'<span><i style="background:{CAUSE_COLOR[c.value]}"></i>{c.value}</span>' for c in CAUSES]
    return '<div class="legend">' + "".join(items) + "</div>"


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values covering ``[lo, hi]`` (1, 2, 5 x 10^k steps)."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _ms_label(seconds: float) -> str:
    v = seconds * 1e3
    return f"{v:.0f} ms" if abs(v) >= 10 or v == 0 else f"{v:.3g} ms"


def _util_class(u: float) -> str:
    return "good" if u >= TARGET_UTILIZATION else ("warn" if u >= 0.6 else "bad")


def _stack_path(color: str, boxes: list[tuple[float, float, float, float]], title: str, cls: str = "") -> str:
    """Many rectangles ``(x, y, w, h)`` of one colour as one path: light for the browser."""
    d = "".join(f"M{_f(x)} {_f(y)}h{_f(w)}v{_f(h)}h{_f(-w)}z" for x, y, w, h in boxes if w > 0 and h > 0)
    attr = f' class="{cls}"' if cls else ""
    return f'<path{attr} fill="{color}" d="{d}">{_title(title)}</path>' if d else ""


# -- charts ----------------------------------------------------------------------------


def cause_bar(d: DeviceReport, width: int = WIDTH) -> str:
    """One horizontal bar: the window, busy then each idle cause, to scale."""
    plot = width - LEFT - RIGHT
    parts = [("busy", d.busy_s, BUSY_COLOR)] + [
        (c.value, d.idle_by_cause_s.get(c.value, 0.0), CAUSE_COLOR[c.value]) for c in CAUSES]
    x, out = float(LEFT), []
    for name, seconds, color in parts:
        if seconds <= 0 or d.window_s <= 0:
            continue
        w = seconds / d.window_s * plot
        out.append(f'<rect class="seg" x="{_f(x)}" y="4" width="{_f(w)}" height="22" fill="{color}">'
                   f"{_title(f'{name}: {ms(seconds)} ({pct(seconds / d.window_s)} of the window)')}</rect>")
        x += w
    out.append(f'<text x="{LEFT - 6}" y="19" text-anchor="end">GPU {d.device}</text>')
    return _svg(30, out, f"device {d.device}: busy and idle by cause", "causebar", width)


def timeline_chart(tl: IdleTimeline, dt: DeviceTimeline) -> str:
    """Utilization over time (slices, busy at the bottom, idle causes stacked above) and the idle intervals."""
    lo, hi = dt.window
    span = max(hi - lo, 1)
    top, col_h, gap, lane_h = 16.0, 80.0, 8.0, 18.0
    lane_y = top + col_h + gap
    axis_y = lane_y + lane_h + 4

    def x(t: float) -> float:
        return LEFT + (t - lo) / span * PLOT

    out: list[str] = []
    # utilization columns
    edges = dt.bin_edges.tolist()
    series: list[list[tuple[float, float, float, float]]] = [[] for _ in range(len(CAUSES) + 1)]
    for i in range(len(edges) - 1):
        x0, x1 = x(edges[i]), x(edges[i + 1])
        base = top + col_h
        shares = [float(dt.bin_busy[i])] + [float(v) for v in dt.bin_idle[i]]
        for j, share in enumerate(shares):
            h = share * col_h
            if h > 0:
                series[j].append((x0, base - h, x1 - x0, h))
                base -= h
    busy_s = float((dt.bin_busy * (dt.bin_edges[1:] - dt.bin_edges[:-1])).sum()) / 1e9
    out.append(_stack_path(BUSY_COLOR, series[0], f"busy {ms(busy_s)}"))
    for j, c in enumerate(CAUSES, 1):
        out.append(_stack_path(CAUSE_COLOR[c.value], series[j], c.value))
    for v in (0.0, 0.5, 1.0):
        y = top + col_h - v * col_h
        out.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT}" y1="{_f(y)}" y2="{_f(y)}" stroke="#e4e7eb"/>'
                   f'<text x="{LEFT - 6}" y="{_f(y + 4)}" text-anchor="end">{v:.0%}</text>')
    # the idle intervals themselves
    out.append(f'<rect x="{LEFT}" y="{_f(lane_y)}" width="{PLOT}" height="{lane_h}" fill="{BUSY_COLOR}">'
               f"{_title('busy')}</rect>")
    out.append(_intervals(dt, x, lane_y, lane_h))
    out.append(f'<text x="{LEFT - 6}" y="{_f(lane_y + 13)}" text-anchor="end">idle</text>')
    # steps and time axis
    bounds = tl.step_bounds.tolist()
    label_every = max(1, math.ceil((len(bounds) - 1) / 40))
    for i, b in enumerate(bounds[:-1]):
        bx = x(b)
        out.append(f'<line x1="{_f(bx)}" x2="{_f(bx)}" y1="{top - 2}" y2="{_f(lane_y + lane_h)}" '
                   f'stroke="#1f2933" stroke-dasharray="2,2" stroke-width="0.7"/>')
        if i % label_every == 0:
            out.append(f'<text x="{_f(bx + 2)}" y="{top - 4}">#{int(tl.step_numbers[i])}</text>')
    for t in nice_ticks(0.0, span / 1e9):
        tx = x(lo + t * 1e9)
        anchor = "end" if tx > LEFT + PLOT - 25 else "middle"
        out.append(f'<line x1="{_f(tx)}" x2="{_f(tx)}" y1="{_f(axis_y)}" y2="{_f(axis_y + 4)}" stroke="#9aa5b1"/>'
                   f'<text x="{_f(tx)}" y="{_f(axis_y + 16)}" text-anchor="{anchor}">{_ms_label(t)}</text>')
    name = f" ({dt.name})" if dt.name else ""
    return _svg(axis_y + 20, out, f"GPU {dt.device}{name}: utilization over time, idle by cause", "timeline")


def _intervals(dt: DeviceTimeline, xf: Callable[[float], float], y: float, h: float) -> str:
    """Each idle interval as a rectangle with a tooltip; many, as one path per cause (touching ones merged)."""
    starts, ends = dt.seg_start.tolist(), dt.seg_end.tolist()
    causes, steps = dt.seg_cause.tolist(), dt.seg_step.tolist()
    names = [c.value for c in CAUSES]
    if len(starts) <= MAX_INTERVAL_RECTS:
        out = []
        for s, e, c, step in zip(starts, ends, causes, steps, strict=True):
            x0 = xf(s)
            w = max(xf(e) - x0, 0.5)
            out.append(f'<rect class="idle" x="{_f(x0)}" y="{_f(y)}" width="{_f(w)}" height="{h}" '
                       f'fill="{CAUSE_COLOR[names[c]]}">{_title(f"{names[c]} · step {step} · {ms((e - s) / 1e9)}")}'
                       "</rect>")
        return "".join(out)
    # too many to draw one by one: each slice of the window shows its largest idle cause
    edges = dt.bin_edges.tolist()
    boxes: dict[int, list[tuple[float, float, float, float]]] = {}
    last = -1
    for i, shares in enumerate(dt.bin_idle.tolist()):
        c = max(range(len(shares)), key=shares.__getitem__)
        if shares[c] <= 0:
            last = -1
            continue
        x0, x1 = xf(edges[i]), xf(edges[i + 1])
        if c == last:
            px, py, _, ph = boxes[c][-1]
            boxes[c][-1] = (px, py, x1 - px, ph)
        else:
            boxes.setdefault(c, []).append((x0, y, x1 - x0, h))
        last = c
    note = f"{len(starts):,} idle intervals, too many to draw one by one: each slice shows its largest cause"
    return "".join(_stack_path(CAUSE_COLOR[names[c]], b, f"{names[c]} · {note}", "idle")
                   for c, b in sorted(boxes.items()))


def steps_chart(r: RankReport, y_max_s: float | None = None, width: int = WIDTH) -> str:
    """Per step: a bar as tall as the step, busy at the bottom, idle causes stacked above."""
    steps = r.steps
    plot = width - LEFT - RIGHT
    top, plot_h = 10.0, 180.0
    y_max = y_max_s or max((s.dur_s for s in steps), default=0.0) or 1.0
    n = max(len(steps), 1)
    slot = plot / n
    bar = max(slot * 0.8, 0.5)
    series: list[list[tuple[float, float, float, float]]] = [[] for _ in range(len(CAUSES) + 1)]
    hover: list[str] = []
    for i, s in enumerate(steps):
        bx = LEFT + i * slot + (slot - bar) / 2
        base = top + plot_h
        for j, v in enumerate([s.busy_s] + [s.idle_by_cause_s.get(c.value, 0.0) for c in CAUSES]):
            h = v / y_max * plot_h
            if h > 0:
                series[j].append((bx, base - h, bar, h))
                base -= h
        causes = ", ".join(f"{k} {ms(v)}" for k, v in s.idle_by_cause_s.items() if v > 0) or "no idle time"
        hover.append(f'<rect class="step" x="{_f(bx)}" y="{top}" width="{_f(bar)}" height="{plot_h}" '
                     f'fill="transparent">{_title(f"step {s.step}: {ms(s.dur_s)}, busy {ms(s.busy_s)}; {causes}")}'
                     "</rect>")
    out = [_stack_path(BUSY_COLOR, series[0], "busy")]
    out += [_stack_path(CAUSE_COLOR[c.value], series[j], c.value) for j, c in enumerate(CAUSES, 1)]
    for t in nice_ticks(0.0, y_max, 4):
        y = top + plot_h - t / y_max * plot_h
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot}" y1="{_f(y)}" y2="{_f(y)}" stroke="#e4e7eb"/>'
                   f'<text x="{LEFT - 6}" y="{_f(y + 4)}" text-anchor="end">{_ms_label(t)}</text>')
    label_every = max(1, math.ceil(n / (30 * width / WIDTH)))
    for i, s in enumerate(steps):
        if i % label_every == 0:
            out.append(f'<text x="{_f(LEFT + (i + 0.5) * slot)}" y="{top + plot_h + 14}" '
                       f'text-anchor="middle">{s.step}</text>')
    out += hover
    return _svg(top + plot_h + 20, out, f"rank {r.rank}: per-step busy and idle by cause", "steps", width)


def _heat_color(u: float) -> str:
    """Red (0 %) through amber (50 %) to green (100 %)."""
    stops = [(0.0, (198, 40, 40)), (0.5, (249, 168, 37)), (1.0, (46, 125, 50))]
    u = min(max(u, 0.0), 1.0)
    for (a, ca), (b, cb) in pairwise(stops):
        if u <= b:
            t = (u - a) / (b - a)
            r, g, bl = (round(ca[k] + (cb[k] - ca[k]) * t) for k in range(3))
            return f"#{r:02x}{g:02x}{bl:02x}"
    return "#2e7d32"


def heatmap_chart(ranks: Sequence[RankReport]) -> str:
    """Rank x step, coloured by the step's utilization (busy / step time) on the rank's primary device."""
    numbers = sorted({s.step for r in ranks for s in r.steps})
    col = {n: i for i, n in enumerate(numbers)}
    cell_w = PLOT / max(len(numbers), 1)
    cell_h = max(4.0, min(22.0, 480.0 / max(len(ranks), 1)))
    top = 18.0
    out = []
    for i, n in enumerate(numbers):
        if i % max(1, math.ceil(len(numbers) / 30)) == 0:
            out.append(f'<text x="{_f(LEFT + (i + 0.5) * cell_w)}" y="{top - 5}" text-anchor="middle">{n}</text>')
    label_every = max(1, math.ceil(12 / cell_h))
    for row, r in enumerate(ranks):
        y = top + row * cell_h
        if row % label_every == 0:
            out.append(f'<text x="{LEFT - 6}" y="{_f(y + cell_h / 2 + 4)}" text-anchor="end">rank {r.rank}</text>')
        for s in r.steps:
            u = s.busy_s / s.dur_s if s.dur_s > 0 else 0.0
            out.append(f'<rect class="cell" x="{_f(LEFT + col[s.step] * cell_w)}" y="{_f(y)}" '
                       f'width="{_f(cell_w - 0.5)}" height="{_f(cell_h - 0.5)}" fill="{_heat_color(u)}">'
                       f"{_title(f'rank {r.rank} · step {s.step}: utilization {pct(u)}, {ms(s.dur_s)}')}</rect>")
    scale_y = top + len(ranks) * cell_h + 10
    stops = "".join(f'<stop offset="{v}" stop-color="{_heat_color(v)}"/>' for v in (0.0, 0.25, 0.5, 0.75, 1.0))
    out.append(f'<defs><linearGradient id="heat">{stops}</linearGradient></defs>'
               f'<rect x="{LEFT}" y="{_f(scale_y)}" width="200" height="10" fill="url(#heat)"/>'
               f'<text x="{LEFT}" y="{_f(scale_y + 24)}">0 %</text>'
               f'<text x="{LEFT + 200}" y="{_f(scale_y + 24)}" text-anchor="end">100 % utilization</text>')
    return _svg(scale_y + 30, out, "utilization by rank and step", "heatmap")


def cause_delta_chart(c: Comparison) -> str:
    """Idle per step by cause, before (light) and after (full colour), as paired horizontal bars."""
    rows = [x.value for x in CAUSES if c.before.idle_by_cause_s[x.value] > 0 or c.after.idle_by_cause_s[x.value] > 0]
    peak = max([c.before.idle_by_cause_s[k] for k in rows] + [c.after.idle_by_cause_s[k] for k in rows] + [1e-12])
    left, row_h = 130.0, 30.0
    width = WIDTH - left - 150
    out = []
    for i, k in enumerate(rows):
        y = 6 + i * row_h
        a, b = c.before.idle_by_cause_s[k], c.after.idle_by_cause_s[k]
        out.append(f'<text x="{left - 8}" y="{_f(y + 17)}" text-anchor="end">{_e(k)}</text>')
        out.append(f'<rect class="before" x="{left}" y="{_f(y + 2)}" width="{_f(a / peak * width)}" height="11" '
                   f'fill="{CAUSE_COLOR[k]}" fill-opacity="0.35">{_title(f"before: {ms(a)} per step")}</rect>')
        out.append(f'<rect class="after" x="{left}" y="{_f(y + 14)}" width="{_f(b / peak * width)}" height="11" '
                   f'fill="{CAUSE_COLOR[k]}">{_title(f"after: {ms(b)} per step")}</rect>')
        out.append(f'<text x="{_f(left + width + 8)}" y="{_f(y + 17)}">{ms(a)} → {ms(b)}</text>')
    if not rows:
        out.append(f'<text x="{left}" y="20">no idle time in either run</text>')
    return _svg(12 + max(len(rows), 1) * row_h, out, "idle per step by cause, before and after", "causedelta")


# -- sections --------------------------------------------------------------------------


def _device_card(r: RankReport, d: DeviceReport) -> str:
    name = f" · {_e(d.name)}" if d.name else ""
    smi = (f'<div class="note">nvidia-smi would count {pct(d.active_s / d.window_s)} (collectives included)</div>'
           if d.active_s > d.busy_s and d.window_s else "")
    return (f'<div class="card"><h3>rank {r.rank} · GPU {d.device}{name}</h3>'
            f'<div class="big {_util_class(d.utilization)}">{pct(d.utilization)}</div>'
            f'<div class="muted">utilization · idle {ms(d.idle_s)} of {ms(d.window_s)}</div>{smi}</div>')


def _cause_table(d: DeviceReport) -> str:
    rows = "".join(
        f'<tr><td><i class="chip" style="background:{CAUSE_COLOR[c.value]}">&nbsp;</i>{c.value}</td>'
        f'<td class="num">{ms(d.idle_by_cause_s[c.value])}</td>'
        f'<td class="num">{pct(d.idle_by_cause_s[c.value] / d.window_s if d.window_s else 0.0)}</td></tr>'
        for c in CAUSES if d.idle_by_cause_s.get(c.value, 0.0) > 0)
    return ('<table><tr><th>idle cause</th><th class="num">time</th><th class="num">of window</th></tr>'
            + (rows or '<tr><td colspan="3">no idle time</td></tr>') + "</table>")


def recommendation_card(i: int, rec: Recommendation) -> str:
    ev = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rec.evidence.items())
    color = CAUSE_COLOR.get(rec.cause, "#546e7a")
    where = f" · rank {rec.rank}" if rec.rank is not None else ""
    return (f'<div class="card rec"><h3>{i}. {_e(rec.title)}</h3>'
            f'<div><span class="chip" style="background:{color}">{_e(rec.cause)}</span>'
            f'<span class="muted">{_e(rec.confidence)} confidence{where}</span></div>'
            f'<p class="good"><b>saves {ms(rec.gain.step_s_saved)} per step</b> → utilization '
            f"{pct(rec.gain.utilization_after)}</p>"
            f"<table><tr><th>evidence</th><th></th></tr>{ev}</table>"
            f"<pre><code>{_e(rec.fix)}</code></pre></div>")


def _job_section(job: JobReport) -> str:
    rows = "".join(f'<tr><td>{r.rank}</td><td class="num">{ms(r.step_s)}</td>'
                   f'<td class="num">{pct(r.utilization)}</td><td>{_e(r.top_cause)}</td></tr>' for r in job.rank_table)
    skew = "n/a" if job.step_skew is None else f"{job.step_skew:.3f}"
    world = f" of {job.world_size}" if job.world_size else ""
    items = [f"<li class=\"bad\">straggler: rank {s.rank}, late by {ms(s.lateness_s)} in steps {s.steps}, "
             f"score {s.score:.2f}: {_e(s.why)}</li>" for s in job.stragglers]
    c = job.communication
    items.append(f"<li>communication exposed {ms(c.exposed_s)}, waiting for stragglers {ms(c.straggler_wait_s)}, "
                 f"overlap {'n/a' if c.overlap_ratio is None else pct(c.overlap_ratio)}</li>")
    items += [f'<li class="muted">{_e(n)}</li>' for n in job.notes]
    return (f'<section id="job"><h2>Job: {len(job.ranks_found)} ranks{world} · step-time skew {skew}</h2>'
            '<table><tr><th>rank</th><th class="num">step</th><th class="num">utilization</th><th>top cause</th></tr>'
            f"{rows}</table><ul>{''.join(items)}</ul></section>")


def _shown_rank(report: AnalysisReport) -> RankReport:
    return report.ranks[0] if len(report.ranks) == 1 else min(report.ranks, key=lambda r: r.primary().utilization)


def render_report(report: AnalysisReport, timeline: IdleTimeline | None = None,
                  options: RenderOptions = DEFAULT_OPTIONS) -> str:
    """The full page for one analysis; ``timeline`` adds the utilization-over-time charts."""
    n = len(report.ranks)
    shown = _shown_rank(report)
    body = [f"<header><h1>gpuidle · {n} rank{'s' if n != 1 else ''} · {_e(report.source.format)}</h1>"
            f'<div class="muted">{_e(", ".join(report.source.paths))}</div></header>']
    w = shown.window
    body.append(f'<section id="summary"><h2>Utilization</h2><p class="note">window: {_e(w.kind.replace("_", " "))}, '
                f"{len(shown.steps)} step(s), {ms(w.dur_s)}; steps from {_e(shown.step_source)}"
                + (f"; rank {shown.rank} has the lowest utilization of the job" if n > 1 else "") + "</p>"
                + '<div class="grid">' + "".join(_device_card(shown, d) for d in shown.devices) + "</div>"
                + "".join(cause_bar(d) for d in shown.devices) + _legend() + _cause_table(shown.primary())
                + "".join(f'<p class="note">note: {_e(x)}</p>' for x in shown.notes) + "</section>")
    if timeline is not None:
        note = f'<p class="note">{_e(timeline.note)}</p>' if timeline.note else ""
        body.append(f'<section id="timeline"><h2>Over time: rank {timeline.rank}</h2>{note}'
                    '<p class="note">top: utilization in slices of the window, busy at the bottom and idle causes '
                    "above; below: the idle intervals, coloured by cause (hover for step and length; "
                    f"above {MAX_INTERVAL_RECTS:,} intervals, each slice shows its largest cause). "
                    "Dashed lines are step starts.</p>"
                    + "".join(f"<h3>GPU {d.device}{' · ' + _e(d.name) if d.name else ''}</h3>"
                              + timeline_chart(timeline, d) for d in timeline.devices)
                    + _legend() + "</section>")
    if shown.steps:
        body.append(f'<section id="steps"><h2>Per step: rank {shown.rank}, GPU {shown.primary().device}</h2>'
                    + steps_chart(shown) + _legend() + "</section>")
    if n > 1:
        body.append('<section id="heatmap"><h2>Utilization by rank and step</h2>' + heatmap_chart(report.ranks)
                    + "</section>")
    if report.job is not None:
        body.append(_job_section(report.job))
    recs = report.recommendations
    body.append('<section id="recommendations"><h2>What to change first</h2>'
                + ("".join(recommendation_card(i, r) for i, r in enumerate(recs, 1))
                   or "<p>No idle cause above its threshold: nothing stands out.</p>") + "</section>")
    return _page("gpuidle report", body)


# -- comparison ------------------------------------------------------------------------


def _run_name(s: RunSummary) -> str:
    return f"{s.label} ({s.ref})" if s.label and s.ref else (s.label or s.ref or "run")


def _delta(v: float, fmt: str, better_when_lower: bool) -> str:
    cls = "muted" if v == 0 else ("good" if (v < 0) == better_when_lower else "bad")
    sign = "+" if v > 0 else ("−" if v < 0 else "±")
    return f'<span class="{cls}">{sign}{fmt}</span>'


def _side(title: str, s: RunSummary, report: AnalysisReport, y_max: float) -> str:
    r = _shown_rank(report)
    gpus = f"{s.world_size} × {s.gpu_model}" if s.gpu_model else f"{s.world_size} GPU(s)"
    batch = f" · batch {s.batch_size}" if s.batch_size is not None else ""
    return (f'<div class="card"><h3>{_e(title)}: {_e(_run_name(s))}</h3>'
            f'<div class="muted">{_e(gpus)}{batch} · {s.ranks} rank(s) · {s.steps} step(s)</div>'
            f'<div class="big {_util_class(s.utilization)}">{pct(s.utilization)}</div>'
            f'<div class="muted">utilization · step {ms(s.step_s)} · idle {ms(s.idle_s)} per step</div>'
            + cause_bar(r.primary(), SIDE_WIDTH) + f'<p class="note">per step, rank {r.rank}:</p>'
            + steps_chart(r, y_max, SIDE_WIDTH)
            + "</div>")


def render_comparison(c: Comparison, before: AnalysisReport, after: AnalysisReport) -> str:
    """The compare page: verdict, headline deltas, idle by cause, both runs side by side, fixes."""
    a, b = c.before, c.after
    body = [f"<header><h1>gpuidle compare</h1><div class=\"muted\">{_e(_run_name(a))} → {_e(_run_name(b))}"
            "</div></header>"]
    if c.comparable:
        verdict = ('<section class="verdict"><b>Comparable runs</b>: the same GPU model, world size and batch, '
                   "as far as the runs record them.")
    else:
        verdict = ('<section class="verdict no"><b>Not comparable</b>: the work per step changed.<ul>'
                   + "".join(f"<li>{_e(d)}</li>" for d in c.differences) + "</ul>")
    verdict += "".join(f'<p class="note">{_e(n)}</p>' for n in c.notes) + "</section>"
    body.append(verdict)
    speed = "n/a" if c.speedup is None else f"{c.speedup:.2f}×"
    rows = [
        ("utilization", pct(a.utilization), pct(b.utilization),
         _delta(c.utilization_delta, f"{abs(c.utilization_delta) * 100:.1f} pts", False)),
        ("median step", ms(a.step_s), ms(b.step_s), _delta(c.step_s_delta, ms(abs(c.step_s_delta)), True)
         + f" <span class=\"muted\">({speed})</span>"),
        ("idle per step", ms(a.idle_s), ms(b.idle_s), _delta(b.idle_s - a.idle_s, ms(abs(b.idle_s - a.idle_s)), True)),
    ]
    if c.cost is not None:
        k = c.cost
        rows.append((f"cost of {k.steps:,} steps at {k.price_per_gpu_hour:g}/GPU-h", money(k.before),
                     money(k.after), _delta(-k.saved, money(abs(k.saved)), True)))
    body.append('<section id="headline"><h2>Before and after</h2><table><tr><th></th><th class="num">before</th>'
                '<th class="num">after</th><th class="num">change</th></tr>'
                + "".join(f'<tr><td>{_e(n)}</td><td class="num">{x}</td><td class="num">{y}</td>'
                          f'<td class="num">{d}</td></tr>' for n, x, y, d in rows) + "</table></section>")
    body.append('<section id="causes"><h2>Idle per step, by cause</h2>' + cause_delta_chart(c)
                + '<p class="note">light: before; full colour: after.</p></section>')
    y_max = max([s.dur_s for r in (_shown_rank(before), _shown_rank(after)) for s in r.steps] + [1e-9])
    body.append('<section id="side-by-side"><h2>Side by side</h2><div class="side">'
                + _side("before", a, before, y_max) + _side("after", b, after, y_max) + "</div>" + _legend()
                + "</section>")
    groups = {"resolved": "Resolved", "new": "New", "remaining": "Still recommended"}
    parts = []
    for status, title in groups.items():
        items = [x for x in c.recommendations if x.status == status]
        if not items:
            continue
        lis = "".join(
            f'<li><span class="chip" style="background:{CAUSE_COLOR.get(x.cause, "#546e7a")}">{_e(x.cause)}</span>'
            f"{_e(x.title)} <span class=\"muted\">({_e(x.id)}; gain "
            f"{'-' if x.gain_before_s is None else ms(x.gain_before_s)} → "
            f"{'-' if x.gain_after_s is None else ms(x.gain_after_s)} per step)</span></li>" for x in items)
        parts.append(f"<h3>{title}</h3><ul>{lis}</ul>")
    body.append('<section id="recommendations"><h2>Recommendations</h2>'
                + ("".join(parts) or "<p>None in either run.</p>") + "</section>")
    return _page("gpuidle compare", body)


class HtmlRenderer:
    """The report without the timeline (that needs the trace again: ``gpuidle analyze --html``)."""

    name = "html"
    extensions: tuple[str, ...] = (".html", ".htm")

    def render(self, report: AnalysisReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        return render_report(report, None, options)
