"""Inline SVG charts for the HTML report: colours, primitives and the charts themselves.

Every number comes from the report or the timeline; these functions only place them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise

from gpuidle.model import (
    CAUSES,
    Comparison,
    DeviceReport,
    DeviceTimeline,
    RankReport,
)
from gpuidle.report.common import CAUSE_MEANING, TARGET_UTILIZATION, ms, pct
from gpuidle.report.text import printable

CAUSE_COLOR = {
    "data_loading": "#8e44ad", "host_sync": "#e53935", "launch_overhead": "#f9a825", "cpu_compute": "#00acc1",
    "memcpy": "#1e88e5", "communication": "#43a047", "straggler_wait": "#ff7043", "unattributed": "#9e9e9e",
}
BUSY_COLOR = "#37474f"
MAX_INTERVAL_RECTS = 3000
"""Above this many idle intervals on a device, they are drawn as one path per cause, without tooltips."""
HEAT_LABEL_MIN_W, HEAT_LABEL_MIN_H = 22.0, 12.0
"""Heatmap cells at least this big (px) print their utilization."""
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
td code{overflow-wrap:anywhere}td.num{white-space:nowrap}
.chip{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;color:#fff;margin-right:6px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}
pre{background:#263238;color:#eceff1;padding:10px 12px;border-radius:6px;overflow-x:auto;font-size:12px}
svg{display:block;width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#52606d}
.verdict{border-left:5px solid #2e7d32}.verdict.no{border-left-color:#c62828}
.side{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.lead{font-size:16px;margin:4px 0}.combined{border-left:5px solid #2e7d32;padding:6px 12px;margin:12px 0}
"""


# -- primitives ------------------------------------------------------------------------


def esc(text: object) -> str:
    """HTML-escaped, control characters shown as escapes (a browser would drop them silently)."""
    return html.escape(printable(str(text), keep_newlines=True), quote=True)


def num(x: float) -> str:
    """A coordinate, short."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def page(title: str, body: Iterable[str]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n<body><main>\n"
            + "\n".join(body) + "\n</main></body></html>\n")


def svg(height: float, content: Iterable[str], label: str, cls: str, width: int = WIDTH) -> str:
    return (f'<svg class="{cls}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {num(height)}" '
            f'role="img" aria-label="{esc(label)}">' + "".join(content) + "</svg>")


def tooltip(text: str) -> str:
    return f"<title>{esc(text)}</title>"


def legend(with_busy: bool = True) -> str:
    items = ([f'<span><i style="background:{BUSY_COLOR}"></i>busy</span>'] if with_busy else []) + [
        f'<span title="{html.escape(CAUSE_MEANING[c.value])}"><i style="background:{CAUSE_COLOR[c.value]}"></i>'
        f'{c.value}</span>' for c in CAUSES]
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


def ms_label(seconds: float) -> str:
    v = seconds * 1e3
    return f"{v:.0f} ms" if abs(v) >= 10 or v == 0 else f"{v:.3g} ms"


def util_class(u: float) -> str:
    return "good" if u >= TARGET_UTILIZATION else ("warn" if u >= 0.6 else "bad")


def stack_path(color: str, boxes: list[tuple[float, float, float, float]], title: str, cls: str = "") -> str:
    """Many rectangles ``(x, y, w, h)`` of one colour as one path: light for the browser."""
    d = "".join(f"M{num(x)} {num(y)}h{num(w)}v{num(h)}h{num(-w)}z" for x, y, w, h in boxes if w > 0 and h > 0)
    attr = f' class="{cls}"' if cls else ""
    return f'<path{attr} fill="{color}" d="{d}">{tooltip(title)}</path>' if d else ""


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
        out.append(f'<rect class="seg" x="{num(x)}" y="4" width="{num(w)}" height="22" fill="{color}">'
                   f"{tooltip(f'{name}: {ms(seconds)} ({pct(seconds / d.window_s)} of the window)')}</rect>")
        x += w
    out.append(f'<text x="{LEFT - 6}" y="19" text-anchor="end">GPU {d.device}</text>')
    return svg(30, out, f"device {d.device}: busy and idle by cause", "causebar", width)


def timeline_chart(dt: DeviceTimeline) -> str:
    """Utilization over time (slices, busy at the bottom, idle causes stacked above) and the idle intervals, with
    the device's own steps."""
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
    out.append(stack_path(BUSY_COLOR, series[0], f"busy {ms(busy_s)}"))
    for j, c in enumerate(CAUSES, 1):
        out.append(stack_path(CAUSE_COLOR[c.value], series[j], c.value))
    for v in (0.0, 0.5, 1.0):
        y = top + col_h - v * col_h
        out.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT}" y1="{num(y)}" y2="{num(y)}" stroke="#e4e7eb"/>'
                   f'<text x="{LEFT - 6}" y="{num(y + 4)}" text-anchor="end">{v:.0%}</text>')
    # the idle intervals themselves
    out.append(f'<rect class="lane" x="{LEFT}" y="{num(lane_y)}" width="{PLOT}" height="{lane_h}" fill="none" '
               f'stroke="#cbd2d9">{tooltip("blank: busy")}</rect>')
    out.append(intervals(dt, x, lane_y, lane_h))
    out.append(f'<text x="{LEFT - 6}" y="{num(lane_y + 13)}" text-anchor="end">idle</text>')
    # steps and time axis
    bounds = dt.step_bounds.tolist()
    label_every = max(1, math.ceil((len(bounds) - 1) / 40))
    for i, b in enumerate(bounds[:-1]):
        bx = x(b)
        out.append(f'<line x1="{num(bx)}" x2="{num(bx)}" y1="{top - 2}" y2="{num(lane_y + lane_h)}" '
                   f'stroke="#1f2933" stroke-dasharray="2,2" stroke-width="0.7"/>')
        if i % label_every == 0:
            out.append(f'<text x="{num(bx + 2)}" y="{top - 4}">#{int(dt.step_numbers[i])}</text>')
    for t in nice_ticks(0.0, span / 1e9):
        tx = x(lo + t * 1e9)
        anchor = "end" if tx > LEFT + PLOT - 25 else "middle"
        out.append(f'<line x1="{num(tx)}" x2="{num(tx)}" y1="{num(axis_y)}" y2="{num(axis_y + 4)}" stroke="#9aa5b1"/>'
                   f'<text x="{num(tx)}" y="{num(axis_y + 16)}" text-anchor="{anchor}">{ms_label(t)}</text>')
    name = f" ({dt.name})" if dt.name else ""
    return svg(axis_y + 20, out, f"GPU {dt.device}{name}: utilization over time, idle by cause", "timeline")


def intervals(dt: DeviceTimeline, xf: Callable[[float], float], y: float, h: float) -> str:
    """Each idle interval as a rectangle with a tooltip; many, as one path per cause (touching ones merged)."""
    starts, ends = dt.seg_start.tolist(), dt.seg_end.tolist()
    causes, steps = dt.seg_cause.tolist(), dt.seg_step.tolist()
    names = [c.value for c in CAUSES]
    if len(starts) <= MAX_INTERVAL_RECTS:
        out = []
        for s, e, c, step in zip(starts, ends, causes, steps, strict=True):
            x0 = xf(s)
            w = max(xf(e) - x0, 0.5)
            out.append(f'<rect class="idle idle-{names[c]}" x="{num(x0)}" y="{num(y)}" width="{num(w)}" height="{h}" '
                       f'fill="{CAUSE_COLOR[names[c]]}">{tooltip(f"{names[c]} · step {step} · {ms((e - s) / 1e9)}")}'
                       "</rect>")
        return "".join(out)
    # too many to draw one by one: each slice of the window is split left to right in proportion to
    # its idle time by cause, busy left blank, so every cause covers its true share of the lane
    edges = dt.bin_edges.tolist()
    boxes: dict[int, list[tuple[float, float, float, float]]] = {}
    for i, shares in enumerate(dt.bin_idle.tolist()):
        x0, x1 = xf(edges[i]), xf(edges[i + 1])
        cursor = x0
        for c, share in enumerate(shares):
            if share > 0:
                w = share * (x1 - x0)
                boxes.setdefault(c, []).append((cursor, y, w, h))
                cursor += w
    note = f"{len(starts):,} idle intervals, drawn per slice in proportion to their time"
    return "".join(stack_path(CAUSE_COLOR[names[c]], b, f"{names[c]} · {note}", f"idle idle-{names[c]}")
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
        hover.append(f'<rect class="step" x="{num(bx)}" y="{top}" width="{num(bar)}" height="{plot_h}" '
                     f'fill="transparent">{tooltip(f"step {s.step}: {ms(s.dur_s)}, busy {ms(s.busy_s)}; {causes}")}'
                     "</rect>")
    out = [stack_path(BUSY_COLOR, series[0], "busy")]
    out += [stack_path(CAUSE_COLOR[c.value], series[j], c.value) for j, c in enumerate(CAUSES, 1)]
    for t in nice_ticks(0.0, y_max, 4):
        y = top + plot_h - t / y_max * plot_h
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot}" y1="{num(y)}" y2="{num(y)}" stroke="#e4e7eb"/>'
                   f'<text x="{LEFT - 6}" y="{num(y + 4)}" text-anchor="end">{ms_label(t)}</text>')
    label_every = max(1, math.ceil(n / (30 * width / WIDTH)))
    for i, s in enumerate(steps):
        if i % label_every == 0:
            out.append(f'<text x="{num(LEFT + (i + 0.5) * slot)}" y="{top + plot_h + 14}" '
                       f'text-anchor="middle">{s.step}</text>')
    out += hover
    return svg(top + plot_h + 20, out, f"rank {r.rank}: per-step busy and idle by cause", "steps", width)


def heat_color(u: float) -> str:
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
            out.append(f'<text x="{num(LEFT + (i + 0.5) * cell_w)}" y="{top - 5}" text-anchor="middle">{n}</text>')
    label_every = max(1, math.ceil(12 / cell_h))
    labelled = cell_w >= HEAT_LABEL_MIN_W and cell_h >= HEAT_LABEL_MIN_H
    for row, r in enumerate(ranks):
        y = top + row * cell_h
        if row % label_every == 0:
            out.append(f'<text x="{LEFT - 6}" y="{num(y + cell_h / 2 + 4)}" text-anchor="end">rank {r.rank}</text>')
        for s in r.steps:
            u = s.busy_s / s.dur_s if s.dur_s > 0 else 0.0
            cx = LEFT + col[s.step] * cell_w
            out.append(f'<rect class="cell" x="{num(cx)}" y="{num(y)}" '
                       f'width="{num(cell_w - 0.5)}" height="{num(cell_h - 0.5)}" fill="{heat_color(u)}">'
                       f"{tooltip(f'rank {r.rank} · step {s.step}: utilization {pct(u)}, {ms(s.dur_s)}')}</rect>")
            if labelled:
                out.append(f'<text class="value" x="{num(cx + cell_w / 2)}" y="{num(y + cell_h / 2 + 4)}" '
                           f'text-anchor="middle" fill="#fff">{u * 100:.0f}</text>')
    scale_y = top + len(ranks) * cell_h + 10
    stops = "".join(f'<stop offset="{v}" stop-color="{heat_color(v)}"/>' for v in (0.0, 0.25, 0.5, 0.75, 1.0))
    out.append(f'<defs><linearGradient id="heat">{stops}</linearGradient></defs>'
               f'<rect x="{LEFT}" y="{num(scale_y)}" width="200" height="10" fill="url(#heat)"/>'
               f'<text x="{LEFT}" y="{num(scale_y + 24)}">0 %</text>'
               f'<text x="{LEFT + 200}" y="{num(scale_y + 24)}" text-anchor="end">100 % utilization</text>'
               + (f'<text x="{LEFT + 216}" y="{num(scale_y + 9)}">cells: utilization in %</text>' if labelled else
                  f'<text x="{LEFT + 216}" y="{num(scale_y + 9)}">cells too small for numbers: hover a cell</text>'))
    return svg(scale_y + 30, out, "utilization by rank and step", "heatmap")


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
        out.append(f'<text x="{left - 8}" y="{num(y + 17)}" text-anchor="end">{esc(k)}</text>')
        out.append(f'<rect class="before" x="{left}" y="{num(y + 2)}" width="{num(a / peak * width)}" height="11" '
                   f'fill="{CAUSE_COLOR[k]}" fill-opacity="0.35">{tooltip(f"before: {ms(a)} per step")}</rect>')
        out.append(f'<rect class="after" x="{left}" y="{num(y + 14)}" width="{num(b / peak * width)}" height="11" '
                   f'fill="{CAUSE_COLOR[k]}">{tooltip(f"after: {ms(b)} per step")}</rect>')
        out.append(f'<text x="{num(left + width + 8)}" y="{num(y + 17)}">{ms(a)} → {ms(b)}</text>')
    if not rows:
        out.append(f'<text x="{left}" y="20">no idle time in either run</text>')
    return svg(12 + max(len(rows), 1) * row_h, out, "idle per step by cause, before and after", "causedelta")


