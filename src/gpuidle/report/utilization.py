"""The utilization summary (``gpuidle run``/``monitor``/``summarize``): terminal, JSON, and the live view.

Renderers only format what :class:`~gpuidle.model.UtilizationReport` and the samples
already hold; they compute nothing new.
"""

from __future__ import annotations

import io
import shlex
from typing import Protocol

import msgspec
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuidle.model import DeviceUtil, GpuInfo, GpuSample, HostSample, HostUtil, UtilizationReport, ranges
from gpuidle.report.code import code_block
from gpuidle.report.common import DEFAULT_OPTIONS, RenderOptions, ms, pct, printable_report
from gpuidle.report.registry import pick

BAR = 24


def _bar(pct_value: float | None, width: int = BAR) -> Text:
    if pct_value is None:
        return Text("·" * width, style="bright_black")
    filled = max(0, min(width, round(pct_value / 100 * width)))
    style = "green" if pct_value >= 90 else ("yellow" if pct_value >= 60 else "red")
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="bright_black")


def _s(seconds: float) -> str:
    if seconds == 0:
        return "0 s"
    if seconds >= 1.0:
        return f"{seconds:,.1f} s"
    return ms(seconds)


def _gib(mib: float | None) -> str:
    return "N/A" if mib is None else f"{mib / 1024:.1f}"


def _num(v: float | None, unit: str, digits: int = 0) -> str:
    return "N/A" if v is None else f"{v:,.{digits}f} {unit}"


def _idle(count: int, seconds: float) -> str:
    """The count and their total ("5 periods, 40.0 s in all"), never read as five periods of 40 s each."""
    if count == 0:
        return "none"
    if count == 1:
        return f"1 period, {seconds:,.1f} s"
    return f"{count} periods, {seconds:,.1f} s in all"


DEVICE_COLUMNS = (("device", "left"), ("mean", "right"), ("", "left"), ("median", "right"), ("< 80 %", "right"),
                  ("< 90 %", "right"), ("idle", "right"), ("memory GiB", "right"), ("power W", "right"),
                  ("SM clock", "right"), ("temp", "right"))
NARROW_DROPS = ("", "temp", "SM clock", "power W", "< 90 %", "memory GiB", "idle")
"""The device table's columns a narrow terminal goes without, first to last: a figure is never cut."""


def _devices_table(devs: list[DeviceUtil], width: int) -> tuple[Table, list[str]]:
    """The device table in ``width`` columns, and the columns left out to fit (every cell whole)."""
    rows: list[dict[str, str | Text]] = []
    for d in devs:
        mem = "N/A" if d.mem_used_max_mib is None else f"{_gib(d.mem_used_max_mib)} / {_gib(d.mem_total_mib)}"
        power = "N/A" if d.power_mean_w is None else (
            f"{d.power_mean_w:.0f}" + (f" / {d.power_limit_w:.0f}" if d.power_limit_w else ""))
        rows.append(dict(zip([c for c, _ in DEVICE_COLUMNS], [
            str(d.device), f"{d.mean_util_pct:.1f} %", _bar(d.mean_util_pct, 12), f"{d.median_util_pct:.1f} %",
            pct(d.below_80_share, 0), pct(d.below_90_share, 0), _idle(d.idle_period_count, d.idle_s), mem, power,
            _num(d.sm_clock_mean_mhz, "MHz"), _num(d.temp_max_c, "°C")], strict=True)))
    columns = [c for c, _ in DEVICE_COLUMNS]

    def wide(cols: list[str]) -> int:
        return sum(max([len(c), *(len(r[c]) for r in rows)]) for c in cols) + 2 * (len(cols) - 1)

    while wide(columns) > width and (drop := [c for c in NARROW_DROPS if c in columns]):
        columns.remove(drop[0])
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, just in DEVICE_COLUMNS:
        if col in columns:
            t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*(row[c] for c in columns))
    return t, [c or "bar" for c, _ in DEVICE_COLUMNS if c not in columns]


def _device_details(devs: list[DeviceUtil]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for d in devs:
        bits = []
        if d.idle_periods:
            longest = ", ".join(f"{_s(p.dur_s)} at {_s(p.start_s)}" for p in d.idle_periods[:3])
            bits.append(f"longest idle: {longest}")
        if d.mem_util_mean_pct is not None:
            bits.append(f"memory busy {d.mem_util_mean_pct:.0f} %")
        if d.pcie_rx_mean_mib_s is not None or d.pcie_tx_mean_mib_s is not None:
            bits.append(f"PCIe rx/tx {_num(d.pcie_rx_mean_mib_s, 'MiB/s')} / {_num(d.pcie_tx_mean_mib_s, 'MiB/s')}")
        if d.nvlink_rx_mean_mib_s is not None or d.nvlink_tx_mean_mib_s is not None:
            bits.append(f"NVLink rx/tx {_num(d.nvlink_rx_mean_mib_s, 'MiB/s')} / "
                        f"{_num(d.nvlink_tx_mean_mib_s, 'MiB/s')}")
        if d.sm_active_mean is not None:
            dcgm = f"SM active {pct(d.sm_active_mean)}"
            if d.sm_occupancy_mean is not None:
                dcgm += f", occupancy {pct(d.sm_occupancy_mean)}"
            if d.tensor_active_mean is not None:
                dcgm += f", tensor {pct(d.tensor_active_mean)}"
            if d.dram_active_mean is not None:
                dcgm += f", DRAM {pct(d.dram_active_mean)}"
            bits.append(dcgm)
        if d.throttle_share:
            bits.append("clock events: " + ", ".join(f"{k} {pct(v, 0)}" for k, v in d.throttle_share.items()))
        if bits:
            out.append(Text(f"  {d.device}: " + " · ".join(bits), style="bright_black"))
    return out


def _host(h: HostUtil) -> list[RenderableType]:
    line = f"host: {h.cores} cores, CPU {h.cpu_mean_pct:.1f} % busy on average"
    if h.cpu_when_starved_pct is not None or h.cpu_when_busy_pct is not None:
        line += (f" ({_num(h.cpu_when_starved_pct, '%', 1)} while the GPUs were starved, "
                 f"{_num(h.cpu_when_busy_pct, '%', 1)} while busy)")
    if h.proc_cpu_mean_pct is not None:
        line += f" · command {h.proc_cpu_mean_pct:,.0f} % of a core"
    if h.proc_rss_max_mib is not None:
        line += f", {_gib(h.proc_rss_max_mib)} GiB peak RSS"
    if h.mem_used_max_mib is not None:
        line += f" · memory {_gib(h.mem_used_max_mib)} / {_gib(h.mem_total_mib)} GiB"
    if h.disk_read_mean_mib_s is not None:
        line += f" · disk reads {h.disk_read_mean_mib_s:,.1f} MiB/s"
    out: list[RenderableType] = [Text(line)]
    if h.cpu_limits is not None:
        out.append(Text(f"CPU: {h.cpu_limits.summary}"))
    if h.starved_s > 0:
        out.append(Text(f"GPUs starved for {_s(h.starved_s)}: CPU saturated {_s(h.starved_cpu_saturated_s)} "
                        f"· CPU idle {_s(h.starved_cpu_idle_s)} · other {_s(h.starved_other_s)}"))
    return out


class UtilTerminalRenderer:
    name = "terminal"
    extensions: tuple[str, ...] = (".txt",)

    def render(self, report: UtilizationReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        report = printable_report(report)
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=options.color, no_color=not options.color,
                          width=options.width, highlight=False)
        src = report.source
        n = len(report.devices)
        head = f"gpuidle · utilization · {n} device{'s' if n != 1 else ''} · {src.format}"
        if src.paths:
            head += f" · {', '.join(src.paths)}"
        console.print(Text(head, style="bold"))
        if src.command:
            code = "" if src.exit_code is None else f" · exit code {src.exit_code}"
            console.print(Text(f"command: {shlex.join(src.command)}{code}", style="bright_black"))
        w = report.window
        console.print(Text(f"window: {_s(w.start_s)} → {_s(w.start_s + w.dur_s)} ({_s(w.dur_s)}; idle excluded: "
                           f"{_s(w.leading_idle_s)} at the start, {_s(w.trailing_idle_s)} at the end) · a sample "
                           f"every {_s(w.interval_s)}", style="bright_black"))
        if report.gpu_unavailable:
            console.print(Text(f"GPUs: unavailable ({report.gpu_unavailable}); CPU-side figures only",
                               style="yellow"))
        if report.devices:
            names: dict[str, list[int]] = {}
            for d in report.devices:
                names.setdefault(d.name or "GPU", []).append(d.device)
            console.print(Text("devices: " + "; ".join(f"{ranges(ix)}: {n}" for n, ix in names.items()),
                               style="bright_black"))
            table, left_out = _devices_table(report.devices, options.width)
            console.print(table)
            if left_out:
                console.print(Text(f"(not shown at {options.width} columns: {', '.join(left_out)}; --format json "
                                   "has every field)", style="bright_black"))
            for item in _device_details(report.devices):
                console.print(item)
        for d in report.devices:
            if d.periodic is not None:
                p = d.periodic
                steps = "" if p.period_steps is None else f" (every ~{p.period_steps:.0f} steps)"
                console.print(Text(f"periodic: device {d.device} drops below {p.threshold_pct:g} % every "
                                   f"{p.period_s:.1f} s for ~{p.drop_s:.1f} s ({p.count} times){steps}",
                                   style="magenta"))
        if report.host is not None:
            for item in _host(report.host):
                console.print(item)
        if report.findings:
            console.print(Text("Findings", style="bold underline"))
            for f in report.findings:
                console.print(Text(f"- {f.summary}"))
        recs = report.recommendations[: options.top]
        if report.devices:
            console.print(Text("Top fixes" if recs else "No fix stands out from the counters.",
                               style="bold underline"))
        for i, rec in enumerate(recs, 1):
            g = rec.gain
            bound = "up to " if g.basis == "modelled" and (g.utilization_after or 0.0) > (g.utilization_before or 1.0) \
                else ""
            gain = Text(f"   → utilization {bound}{pct(g.utilization_after or 0.0)}"
                        + (f", saves {bound}{ms(g.step_s_saved)}/step" if g.step_s_saved else "")
                        + f"  [{rec.confidence} confidence · {rec.cause}]", style="green")
            console.print(Group(Text(f"{i}. {rec.title}", style="bold"), gain, code_block(rec.fix, 5)), crop=False)
        if len(report.recommendations) > len(recs):
            console.print(Text(f"(+{len(report.recommendations) - len(recs)} more: --top N or --json)",
                               style="bright_black"))
        for note in report.notes:
            console.print(Text(f"note: {note}", style="bright_black"))
        return buf.getvalue()


class UtilJsonRenderer:
    name = "json"
    extensions: tuple[str, ...] = (".json",)

    def render(self, report: UtilizationReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
        return msgspec.json.format(msgspec.json.encode(report).decode(), indent=2) + "\n"


def load_util_report(text: bytes | str) -> UtilizationReport:
    return msgspec.json.decode(text, type=UtilizationReport)


class UtilRenderer(Protocol):
    name: str
    extensions: tuple[str, ...]

    def render(self, report: UtilizationReport, options: RenderOptions = ...) -> str: ...


UTIL_RENDERERS: dict[str, type[UtilRenderer]] = {
    r.name: r for r in (UtilTerminalRenderer, UtilJsonRenderer)
}


def util_renderer_for(name: str | None = None, path: str | None = None) -> type[UtilRenderer]:
    return pick(UTIL_RENDERERS, UtilTerminalRenderer, name, path)


# ----------------------------------------------------------------------------------
# The live view: a few lines, redrawn in place while a command runs
# ----------------------------------------------------------------------------------


def live_lines(gpus: list[GpuInfo], latest: dict[int, GpuSample], host: HostSample | None, width: int,
               elapsed_s: float, unavailable: str | None = None) -> list[str]:
    """One line per GPU (bar, utilization, memory, power) and one for the host, with ANSI colour.

    When there are more GPUs than fit, one compact line shows them all.
    """
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=max(width, 20), highlight=False, color_system="standard")
    lines: list[Text] = []
    head = Text(f"gpuidle {elapsed_s:6.0f} s", style="bold")
    if host is not None and host.cpu_pct:
        cpu = sum(host.cpu_pct) / len(host.cpu_pct)
        head += Text(f" · CPU {cpu:3.0f} % of {len(host.cpu_pct)}")
    if unavailable:
        head += Text(" · GPUs unavailable", style="yellow")
    lines.append(head)
    bar = max(8, min(BAR, width - 60))
    for g in gpus:
        s = latest.get(g.index)
        u = None if s is None else s.util_pct
        t = Text(f"GPU {g.index:<2} ") + _bar(u, bar) + Text(f" {_num(u, '%'):>6}")
        if s is not None:
            total = s.mem_total_mib or g.mem_total_mib
            t += Text(f"  mem {_gib(s.mem_used_mib)}/{_gib(total)} GiB")
            if s.power_w is not None:
                t += Text(f"  {s.power_w:.0f}" + (f"/{s.power_limit_w:.0f}" if s.power_limit_w else "") + " W")
        lines.append(t)
    for t in lines:
        t.truncate(width, overflow="ellipsis")
        console.print(t, end="\n", soft_wrap=True)
    return buf.getvalue().rstrip("\n").split("\n")


def live_line_compact(gpus: list[GpuInfo], latest: dict[int, GpuSample], width: int, elapsed_s: float) -> str:
    """All GPUs in one line: ``gpuidle 42 s · GPU ▇▅▃█ 81 % avg``."""
    blocks = " ▁▂▃▄▅▆▇█"
    utils = [latest[g.index].util_pct if g.index in latest else None for g in gpus]
    known = [u for u in utils if u is not None]
    spark = "".join(" " if u is None else blocks[min(8, int(u / 100 * 8 + 0.5))] for u in utils)
    avg = f" {sum(known) / len(known):.0f} % avg" if known else ""
    return f"gpuidle {elapsed_s:.0f} s · GPU {spark}{avg}"[:width]
