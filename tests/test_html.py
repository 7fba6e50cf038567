"""The HTML report in a real headless Chromium, offline: it loads, the charts are drawn, nothing errs.

Chromium is driven over the DevTools protocol through ``--remote-debugging-pipe`` (fds 3
and 4, NUL-separated JSON): no port, no extra package. Network access is cut three ways
(no DNS, a dead proxy, DevTools offline emulation), and every request the page makes is
recorded, so "works offline" means "asked for nothing but its own file".
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import re
import select
import struct
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import DATA
from gpuidle import api
from gpuidle.cli import main
from gpuidle.model import CAUSES
from gpuidle.report import html, svg
from gpuidle.report.common import combined_text, gain_text, ms
from gpuidle.report.terminal import TerminalRenderer
from minitrace import Trace

CHROMIUM = Path("/usr/bin/chromium")
HANG_GUARD_S = 300.0
"""Only so that a wedged browser fails the run instead of hanging it; never a performance bound."""
EXAMPLE = Path(__file__).parent.parent / "examples" / "ddp_a100_rank0.pt.trace.json.gz"
RANKS = [DATA / "trace_filter__sampled_rank-0.json.gz", DATA / "trace_filter__sampled_rank-1.json.gz"]
ALEXNET = DATA / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
US = 1e-6


# -- a minimal DevTools client over the pipe ------------------------------------------------


@dataclass
class Page:
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    loaded: bool = False


class Chromium:
    def __init__(self, profile: Path) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._resp_r, resp_w = os.pipe()

        def child_fds() -> None:  # the DevTools pipe is fds 3 (commands in) and 4 (replies out)
            a, b = os.dup(cmd_r), os.dup(resp_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             "--disable-default-apps", "--mute-audio", f"--user-data-dir={profile}",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=child_fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(resp_w)
        self._buf = b""
        self._next = 0
        self._pages: dict[str, Page] = {}

    def _recv(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._resp_r], [], [], HANG_GUARD_S)
            if not ready:
                raise RuntimeError("Chromium stopped answering")
            chunk = os.read(self._resp_r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited (code {self.proc.poll()})")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        event: dict[str, Any] = json.loads(msg)
        page = self._pages.get(event.get("sessionId", ""))
        if page is not None and "method" in event:
            self._on_event(page, event["method"], event.get("params", {}))
        return event

    @staticmethod
    def _on_event(page: Page, method: str, p: dict[str, Any]) -> None:
        if method == "Network.requestWillBeSent":
            page.requests.append(p["request"]["url"])
        elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert", "warning"):
            page.errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            page.errors.append(f"exception: {d.get('text', '')} {d.get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            page.errors.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
        elif method == "Page.loadEventFired":
            page.loaded = True

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._recv()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def open(self, path: Path) -> tuple[str, Page]:
        """Load ``path`` offline in a new tab, with every request and error recorded."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = self._pages[session] = Page()
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.call(f"{domain}.enable", session=session)
        self.call("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                       "uploadThroughput": -1}, session)
        self.call("Emulation.setDeviceMetricsOverride", {"width": 1200, "height": 1600, "deviceScaleFactor": 1,
                                                         "mobile": False}, session)
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session)
        while not page.loaded:
            self._recv()
        self.call("Runtime.evaluate", {"expression": "1", "awaitPromise": True}, session)  # drain queued events
        return session, page

    def js(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return result["result"].get("value")

    def screenshot(self, session: str) -> bytes:
        shot = self.call("Page.captureScreenshot", {"format": "png", "optimizeForSpeed": True}, session)
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._resp_r)


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    if not CHROMIUM.exists():
        pytest.skip(f"headless Chromium not found at {CHROMIUM} (Debian/Ubuntu: apt-get install chromium)")
    browser = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield browser
    finally:
        browser.close()


# -- PNG: decode the screenshot to count its colours -----------------------------------------


def png_pixels(png: bytes) -> np.ndarray:
    """The RGB pixels ``(height, width, 3)`` of an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = ctype = 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, interlace, ctype in (2, 6)) == (8, 0, True)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 3 if ctype == 2 else 4
    data = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, width * bpp + 1)
    out = np.zeros((height, width * bpp), dtype=np.uint8)
    prev = np.zeros(width * bpp, dtype=np.uint8)
    for y in range(height):
        f, line = int(data[y, 0]), data[y, 1:]
        if f == 0:
            row = line.copy()
        elif f == 1:  # Sub: a running sum along the row, per channel, modulo 256
            row = np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint8).reshape(-1)
        elif f == 2:  # Up
            row = line + prev
        else:  # Average or Paeth: byte by byte (Chromium's fast screenshots use neither)
            row = line.copy()
            for i in range(row.size):
                a = int(row[i - bpp]) if i >= bpp else 0
                b, c = int(prev[i]), (int(prev[i - bpp]) if i >= bpp else 0)
                if f == 3:
                    pred = (a + b) // 2
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                row[i] = (int(row[i]) + pred) & 0xFF
        out[y] = prev = row
    return out.reshape(height, width, bpp)[:, :, :3]


def assert_drawn(browser: Chromium, session: str, must_show: list[str], scroll_to: str | None = None) -> None:
    """The screenshot is a picture, not a blank page: many colours, and the chart colours among them.

    ``scroll_to`` brings the evidence into view first, below the decision the page leads with.
    """
    if scroll_to is not None:
        browser.js(session, f"document.querySelector({scroll_to!r}).scrollIntoView()")
    pixels = png_pixels(browser.screenshot(session))
    assert pixels.shape == (1600, 1200, 3)
    keys = (pixels[:, :, 0].astype(np.int64) << 16) | (pixels[:, :, 1].astype(np.int64) << 8) | pixels[:, :, 2]
    colours, counts = np.unique(keys, return_counts=True)
    assert colours.size > 50, colours.size
    for c in must_show:
        assert int(c[1:], 16) in set(colours.tolist()), c
    assert counts.max() < 0.8 * keys.size  # the most common colour, the background, is not everything


def assert_clean(page: Page, file: Path) -> None:
    assert page.errors == []
    assert page.requests == [file.resolve().as_uri()]  # offline: the page asked for nothing else


# -- the tests ---------------------------------------------------------------------------------


def test_the_harness_sees_errors_and_requests(chromium: Chromium, tmp_path: Path) -> None:
    """A negative control: a page that errs and fetches is caught, so a clean page means clean."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("boom"); undefinedFunction();</script>'
                   '<img src="https://example.com/x.png"></body></html>')
    _, page = chromium.open(bad)
    assert any("boom" in e for e in page.errors)
    assert any("undefinedFunction" in e for e in page.errors)
    assert "https://example.com/x.png" in page.requests


def test_single_trace_report(chromium: Chromium, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["analyze", str(EXAMPLE), "--html", str(out), "--no-ledger", "--out", str(tmp_path / "r.txt")]) == 0
    report = api.analyze([EXAMPLE])
    timeline = api.idle_timeline(EXAMPLE)
    assert out.read_text() == html.render_report(report, timeline)
    session, page = chromium.open(out)
    assert_clean(page, out)
    js = chromium.js
    assert js(session, "document.title") == "gpuidle report"
    assert js(session, "document.querySelectorAll('svg.timeline').length") == len(timeline.devices)
    assert js(session, "document.querySelectorAll('svg.steps').length") == 1
    assert js(session, "document.querySelectorAll('svg.heatmap').length") == 0  # one rank
    assert js(session, "document.querySelectorAll('.rec').length") == len(report.recommendations) > 0
    rank = report.ranks[0]
    assert js(session, "document.querySelectorAll('svg.steps rect.step').length") == len(rank.steps)
    (dev,) = timeline.devices
    if len(dev) <= svg.MAX_INTERVAL_RECTS:
        assert js(session, "document.querySelectorAll('svg.timeline rect.idle').length") == len(dev)
    else:  # too many: a path per cause that is the largest in some slice
        assert 1 <= js(session, "document.querySelectorAll('svg.timeline path.idle').length") <= len(CAUSES)
        assert js(session, "document.querySelectorAll('svg.timeline rect.idle').length") == 0
    # every chart has a real size on the page
    sizes = js(session, "[...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect())"
                        ".map(r => [r.width, r.height])")
    assert sizes
    assert all(w > 300 and h > 20 for w, h in sizes)
    titles = js(session, "[...document.querySelectorAll('svg.steps rect.step title')].map(t => t.textContent)")
    assert titles[0].startswith(f"step {rank.steps[0].step}: ")
    assert_drawn(chromium, session, [svg.BUSY_COLOR, svg.CAUSE_COLOR["launch_overhead"],
                                     svg.CAUSE_COLOR["cpu_compute"]], scroll_to="#summary")


def test_the_page_leads_with_the_decision(chromium: Chromium, tmp_path: Path) -> None:
    """As a reader scrolls: the headline, the ranked fixes, every fix together, then the evidence."""
    out = tmp_path / "report.html"
    report = api.analyze([EXAMPLE])
    out.write_text(html.render_report(report, api.idle_timeline(EXAMPLE)))
    session, page = chromium.open(out)
    assert_clean(page, out)
    js = chromium.js
    order = ["#headline", "#recommendations .rec", "#combined", "#summary", "#timeline", "#steps", "table.kernels"]
    tops = js(session, f"{order}.map(q => document.querySelector(q).getBoundingClientRect().top)")
    assert tops == sorted(tops), dict(zip(order, tops, strict=True))
    assert len(set(tops)) == len(tops)
    d = report.ranks[0].primary()
    headline = js(session, "document.querySelector('#headline').innerText")
    assert f"utilization {d.utilization * 100:.1f} %" in headline
    cause = max(d.idle_by_cause_s, key=lambda c: d.idle_by_cause_s[c])
    assert cause in headline
    # the cards in the report's order, each with its gain; the plan's figures are the report's own
    titles = js(session, "[...document.querySelectorAll('.rec h3')].map(h => h.textContent)")
    assert titles == [f"{i}. {r.title}" for i, r in enumerate(report.recommendations, 1)]
    gains = js(session, "[...document.querySelectorAll('.rec .good')].map(p => p.textContent)")
    assert gains == [gain_text(r) for r in report.recommendations]
    both = report.combined
    assert both is not None
    plan = js(session, "document.querySelector('#combined').textContent")
    assert plan == combined_text(both, {r.id for r in report.recommendations})
    assert plan.startswith(f"all {len(both.fixes)} fixes above together: {ms(both.step_s_before)} → "
                           f"{ms(both.step_s_after)}/step (saves {ms(both.step_s_saved)}")


def test_a_notebook_shows_the_same_page(chromium: Chromium, tmp_path: Path) -> None:
    """The report's ``_repr_html_`` in a page as Jupyter puts it: the framed page loads offline, decision first."""
    report = api.analyze([EXAMPLE])
    out = tmp_path / "notebook.html"
    out.write_text(f"<!DOCTYPE html><html><body><div class='output'>{report._repr_html_()}</div></body></html>")
    session, page = chromium.open(out)
    assert_clean(page, out)
    inner = "document.querySelector('iframe.gpuidle-report').contentDocument"
    assert chromium.js(session, f"{inner}.title") == "gpuidle report"
    ids = chromium.js(session, f"[...{inner}.querySelectorAll('section')].map(s => s.id)")
    assert ids[:3] == ["headline", "recommendations", "summary"]
    assert chromium.js(session, f"{inner}.querySelectorAll('.rec').length") == len(report.recommendations)
    height = chromium.js(session, "document.querySelector('iframe.gpuidle-report').getBoundingClientRect().height")
    assert height > 300


def test_long_kernel_names_stay_inside_the_page(chromium: Chromium, tmp_path: Path) -> None:
    """A rocBLAS kernel name of 500+ characters without a space (the MI300X JAX profile) wraps in its cell."""
    pytest.importorskip("google.protobuf")
    src = DATA / "jax08_conv_mi300x8__tw003.xplane.pb"
    report = api.analyze([src])
    assert max(len(k.name) for k in report.ranks[0].kernels.top) > 300
    out = tmp_path / "jax.html"
    out.write_text(html.render_report(report, api.idle_timeline(src)))
    session, page = chromium.open(out)
    assert_clean(page, out)
    assert chromium.js(session, "document.documentElement.scrollWidth <= window.innerWidth")
    inside = chromium.js(session, "[...document.querySelectorAll('table.kernels')].map(t => "
                                  "t.getBoundingClientRect().right <= "
                                  "t.closest('section').getBoundingClientRect().right)")
    assert inside == [True]


def test_few_intervals_are_drawn_one_by_one(chromium: Chromium, tmp_path: Path) -> None:
    src = DATA / "trace_compare__test__test.json.gz"
    report, timeline = api.analyze([src]), api.idle_timeline(src)
    out = tmp_path / "few.html"
    out.write_text(html.render_report(report, timeline))
    session, page = chromium.open(out)
    assert_clean(page, out)
    (dev,) = timeline.devices
    assert 0 < len(dev) <= svg.MAX_INTERVAL_RECTS
    assert chromium.js(session, "document.querySelectorAll('svg.timeline rect.idle').length") == len(dev)
    titles = chromium.js(session, "[...document.querySelectorAll('svg.timeline rect.idle title')]"
                                  ".map(t => t.textContent)")
    assert titles[0] == (f"{CAUSES[int(dev.seg_cause[0])].value} · step {int(dev.seg_step[0])} · "
                         f"{(dev.seg_end[0] - dev.seg_start[0]) / 1e3:.1f} µs")


def test_job_report_has_the_rank_step_heatmap(chromium: Chromium, tmp_path: Path) -> None:
    report = api.analyze(RANKS)
    timeline = api.timeline_for(report)
    out = tmp_path / "job.html"
    out.write_text(html.render_report(report, timeline))
    session, page = chromium.open(out)
    assert_clean(page, out)
    cells = sum(len(r.steps) for r in report.ranks)
    assert chromium.js(session, "document.querySelectorAll('svg.heatmap rect.cell').length") == cells
    assert chromium.js(session, "document.querySelectorAll('#job tr').length") == len(report.ranks) + 1
    note = chromium.js(session, "document.querySelector('#timeline .note').textContent")
    worst = min(report.ranks, key=lambda r: r.primary().utilization)
    assert note.startswith(f"rank {worst.rank} of 2, the lowest utilization")
    assert_drawn(chromium, session, [svg.BUSY_COLOR, svg.CAUSE_COLOR["communication"]], scroll_to="#summary")


def test_compare_page(chromium: Chromium, tmp_path: Path) -> None:
    def loader(load_us: float) -> Trace:
        t = Trace()
        for i in range(4):
            o = i * (load_us + 600)
            t.step(i + 1, o, load_us + 600)
            t.annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", o, load_us)
            t.op("aten::linear", o + load_us, 100)
            t.launch(at=o + load_us + 50, call_dur=10, start=o + load_us + 100, dur=500)
        return t

    assert main(["analyze", str(loader(400).write(tmp_path / "a.json.gz")), "--label", "baseline",
                 "--out", str(tmp_path / "a.txt")]) == 0
    assert main(["analyze", str(loader(10).write(tmp_path / "b.json.gz")), "--label", "workers",
                 "--out", str(tmp_path / "b.txt")]) == 0
    out = tmp_path / "compare.html"
    assert main(["compare", "baseline", "workers", "--html", str(out), "--price", "2.5",
                 "--out", str(tmp_path / "c.txt")]) == 0
    session, page = chromium.open(out)
    assert_clean(page, out)
    js = chromium.js
    assert js(session, "document.title") == "gpuidle compare"
    assert js(session, "document.querySelectorAll('#side-by-side svg.steps').length") == 2
    assert js(session, "document.querySelectorAll('svg.causedelta rect.after').length") == 2  # data, launch
    rows = js(session, "[...document.querySelectorAll('#headline tr')].map(r => r.textContent)")
    assert rows[1].startswith("utilization50.0 %82.0 %+32.0 pts")
    assert rows[2].startswith("steady step1.00 ms610.0 µs−390.0 µs")
    assert rows[4].startswith("cost of 1,000 steps at 2.5/GPU-h")
    assert "Resolved" in js(session, "document.querySelector('#recommendations').textContent")
    assert js(session, "document.querySelector('.verdict').className") == "verdict"
    assert_drawn(chromium, session, [svg.BUSY_COLOR, svg.CAUSE_COLOR["data_loading"]])


def test_a_report_needs_no_timeline(chromium: Chromium, tmp_path: Path) -> None:
    """The registry-style renderer (no trace re-read) is a valid page too."""
    report = api.analyze([DATA / "trace_compare__base__base.json.gz"])
    out = tmp_path / "plain.html"
    out.write_text(html.HtmlRenderer().render(report))
    session, page = chromium.open(out)
    assert_clean(page, out)
    assert chromium.js(session, "document.querySelectorAll('svg.timeline').length") == 0
    assert chromium.js(session, "document.querySelectorAll('svg.causebar rect.seg').length") >= 2


def test_page_is_self_contained() -> None:
    """No reference to anything outside the file, checked on the text itself."""
    report = api.analyze([EXAMPLE])
    text = html.render_report(report, api.idle_timeline(EXAMPLE))
    assert "Content-Security-Policy" in text
    assert "default-src 'none'" in text
    for needle in ("http://", "https://", "<script", "<link", "src=", "@import", "url(http"):
        assert needle not in text.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle



def _lane_widths(page: str) -> dict[str, float]:
    """Total drawn width per cause in the timeline's idle lane (paths of boxes and single rects)."""
    import re

    widths: dict[str, float] = {}
    for cause, d in re.findall(r'<path class="idle idle-(\w+)" fill="[^"]+" d="([^"]+)"', page):
        widths[cause] = widths.get(cause, 0.0) + sum(float(w) for w in re.findall(r"h([\d.]+)v", d))
    for cause, w in re.findall(r'<rect class="idle idle-(\w+)" x="[^"]+" y="[^"]+" width="([^"]+)"', page):
        widths[cause] = widths.get(cause, 0.0) + float(w)
    return widths


def test_the_idle_lane_is_to_scale_when_intervals_are_many(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the one-by-one limit, each cause still covers its true share of the lane; busy stays blank."""
    src = DATA / "trace_compare__test__test.json.gz"
    report, timeline = api.analyze([src]), api.idle_timeline(src)
    monkeypatch.setattr(svg, "MAX_INTERVAL_RECTS", 0)
    page = html.render_report(report, timeline)
    (dev,) = timeline.devices
    lo, hi = dev.window
    expected: dict[str, float] = {}
    for s, e, c in zip(dev.seg_start.tolist(), dev.seg_end.tolist(), dev.seg_cause.tolist(), strict=True):
        expected[CAUSES[c].value] = expected.get(CAUSES[c].value, 0.0) + (e - s) / (hi - lo) * svg.PLOT
    drawn = _lane_widths(page)
    assert set(drawn) == {k for k, v in expected.items() if v > 0.01}
    for cause, width in expected.items():
        if width > 0.01:
            assert drawn[cause] == pytest.approx(width, abs=0.02 * svg.PLOT / 100 + 0.01 * width)
    assert sum(drawn.values()) < svg.PLOT * (1 - report.ranks[0].devices[0].utilization) + 1.0


def test_heatmap_cells_print_their_utilization() -> None:
    report = api.analyze(RANKS)
    page = html.render_report(report, None)
    import re

    values = [int(v) for v in re.findall(r'<text class="value"[^>]*>(\d+)</text>', page)]
    expected = [round(s.busy_s / s.dur_s * 100) for r in report.ranks for s in r.steps]
    assert sorted(values) == sorted(expected)


def test_the_page_has_the_collectives_and_kernels_tables() -> None:
    report = api.analyze(RANKS)
    page = html.render_report(report, None)
    shown = min(report.ranks, key=lambda r: r.primary().utilization)
    assert page.count("<tr><td><code>") == len(shown.kernels.top)
    assert 'class="collectives"' in page
    assert page.count("</td></tr>", page.index('class="collectives"'), page.index('class="kernels"')) == len(
        shown.communication.collectives)


def test_the_page_shows_the_start_up_cost_the_terminal_shows() -> None:
    """AlexNet pays ~12.28 s once (context creation, a first launch loading cuDNN's module, a stream, allocations and
    a 525 ms free of the allocator's):
    the page says so in the terminal's words, every call listed, the figures those of the raw trace."""
    report = api.analyze([ALEXNET])
    rank = report.ranks[0]
    page = html.render_report(report, None)
    part = page[page.index('<div id="startup">'):]
    part = part[:part.index("</div>")]
    head = unescape(re.findall(r'<p class="note">(.*?)</p>', part)[0])
    items = [unescape(x) for x in re.findall(r"<li>(.*?)</li>", part)]
    # the same words as the terminal's, the figure the device's start-up idle
    assert head == f"start-up cost (once, left out of per-step figures and gains): {ms(rank.primary().startup_s)} " \
                   "of device idle"
    assert head in TerminalRenderer().render(report)
    assert len(items) == len(rank.startup) > 8        # every call: the first 8 as in the terminal, the rest folded
    assert part.count("<details><summary>") == 1
    # independently, from the raw events: the longest call of each of three names, and the kernel time under them
    events = json.loads(gzip.decompress(ALEXNET.read_bytes()))["traceEvents"]
    t0 = min(e["ts"] for e in events if e.get("ph") == "X")
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"]
    longest = {name: max((e for e in events if e.get("name") == name), key=lambda e: e["dur"])
               for name in ("cudaFree", "cudaLaunchKernel", "cudaStreamCreateWithFlags")}
    free, first, stream = (longest[n]["dur"] * US
                           for n in ("cudaFree", "cudaLaunchKernel", "cudaStreamCreateWithFlags"))
    assert f"{ms(free)} cudaFree (context)" in items
    assert f"{ms(stream)} cudaStreamCreateWithFlags (stream)" in items
    (module,) = [x for x in items if x.startswith(f"{ms(first)} cudaLaunchKernel (first launch of ")]
    assert module.endswith("(module load)")
    # the idle set apart is at least what the device idles under those three calls and at most the window's
    # span of every start-up call listed: 9.80 s ≤ 12.28 s ≤ the span
    lo, hi = rank.window.start_s, rank.window.start_s + rank.window.dur_s
    assert all(lo <= (e["ts"] - t0) * US and (e["ts"] + e["dur"] - t0) * US <= hi for e in longest.values())
    under = sum(max(0.0, min(end, e["ts"] + e["dur"]) - max(s, e["ts"])) for e in longest.values()
                for s, end in kernels) * US
    assert under < 1e-3                                # the first launch's own kernel, in its last 4 µs
    spans = sorted((max(c.start_s, lo), min(c.start_s + c.dur_s, hi)) for c in rank.startup
                   if c.start_s < hi and c.start_s + c.dur_s > lo)
    covered, reach = 0.0, lo
    for s, e in spans:
        covered += max(0.0, e - max(s, reach))
        reach = max(reach, e)
    assert free + first + stream - under <= rank.primary().startup_s <= covered
    assert rank.primary().startup_s == pytest.approx(12.28, abs=0.01)


def test_no_start_up_cost_no_start_up_section() -> None:
    report = api.analyze([EXAMPLE])
    assert report.ranks[0].startup == []
    assert 'id="startup"' not in html.render_report(report, None)
