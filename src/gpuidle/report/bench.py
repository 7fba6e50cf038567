"""Terminal and JSON output of the probes and the calculator. Renders; computes nothing new.

The renderer is picked by the result's type from :data:`TERMINAL`, so a new probe is one
new entry, not another branch.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuidle.advice.calc import CalcReport
from gpuidle.errors import GpuidleError
from gpuidle.model import CalcLine, CostResult
from gpuidle.probes.allreduce import AllReduceResult, SizeRow
from gpuidle.probes.common import human_bytes
from gpuidle.probes.loader import LoaderResult
from gpuidle.probes.loader_measure import LoaderConfig
from gpuidle.probes.net import NetResult
from gpuidle.probes.storage import StorageResult
from gpuidle.report.code import code_block
from gpuidle.report.common import DEFAULT_OPTIONS, RenderOptions, ms, pct, printable_report

BAR = 40
_REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}


def to_json(result: msgspec.Struct) -> str:
    return msgspec.json.format(msgspec.json.encode(result).decode(), indent=2) + "\n"


def _console(buf: io.StringIO, options: RenderOptions) -> Console:
    return Console(file=buf, force_terminal=options.color, no_color=not options.color, width=options.width,
                   highlight=False)


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _verdict(ok: bool | None) -> Text:
    if ok is None:
        return Text("?", style="bright_black")
    return Text("ok", style="green") if ok else Text("below", style="red")


def _notes(console: Console, notes: list[str], style: str = "bright_black", prefix: str = "note") -> None:
    for n in notes:
        console.print(Text(f"{prefix}: {n}", style=style))


# ------------------------------------------------------------------ bench allreduce


def _size_table(op: str, rows: list[SizeRow], dtype: str) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False, title=f"{op}", title_justify="left",
              title_style="bold underline")
    for col in ("size (B)", "count", "type", "redop", "root", "iters", "runs", "time (us)", "min-p90 (us)",
                "algbw (GB/s)", "busbw (GB/s)"):
        t.add_column(col, justify="left" if col in ("type", "redop") else "right")
    for r in rows:
        root = "0" if op == "broadcast" else "-1"
        if r.error is not None:  # the reason follows the table: a narrow column would break it
            t.add_row(str(r.bytes), str(r.count), dtype, _REDOP.get(op, "none"), root, "-", "-",
                      Text("see below", style="yellow"), "", "", "")
            continue
        spread = "-" if r.time_min_us is None or r.time_p90_us is None else \
            f"{r.time_min_us:.1f}-{r.time_p90_us:.1f}"
        t.add_row(str(r.bytes), str(r.count), dtype, _REDOP.get(op, "none"), root, str(r.iters),
                  str(len(r.runs_us)), _f(r.time_us, ".1f"), spread, _f(r.algbw_gbps), _f(r.busbw_gbps))
    return t


def render_allreduce(r: AllReduceResult, options: RenderOptions = DEFAULT_OPTIONS) -> str:
    buf = io.StringIO()
    c = _console(buf, options)
    dev = f"{r.device} ({r.device_name})" if r.device_name else r.device
    threads = "" if r.threads_per_rank is None else f" · {r.threads_per_rank} thread(s) per rank"
    c.print(Text(f"gpuidle bench allreduce · {r.backend} on {dev} · {r.world_size} ranks on {r.nodes} node(s)"
                 f"{threads} · {r.dtype} · warm-up {r.warmup}, {r.runs} runs of up to {r.iters} iterations "
                 f"per size (median run shown) · torch {r.torch_version}", style="bold"))
    for op in dict.fromkeys(row.op for row in r.rows):
        c.print(_size_table(op, [row for row in r.rows if row.op == op], r.dtype))
        for row in r.rows:
            if row.op == op and row.error is not None:
                c.print(Text(f"{op} at {row.bytes} B: {row.error}", style="yellow"))
    s = Table(box=None, header_style="bold", pad_edge=False, title="summary", title_justify="left",
              title_style="bold underline")
    for col in ("op", "bus factor", "latency", "runs: fastest / p90", "sizes", "peak busbw (GB/s)", "at size"):
        s.add_column(col, justify="left" if col == "op" else "right")
    for x in r.summaries:
        if not x.supported:
            s.add_row(x.op, f"{x.bus_factor:.3g}", Text(x.error or "not measured", style="yellow"), "", "", "", "")
            continue
        spread = "-" if x.latency_min_us is None or x.latency_p90_us is None else \
            f"{ms(x.latency_min_us / 1e6)} / {ms(x.latency_p90_us / 1e6)}"
        s.add_row(x.op, f"{x.bus_factor:.3g}", "-" if x.latency_us is None else ms(x.latency_us / 1e6), spread,
                  f"≤ {human_bytes(x.latency_bytes or 0)}", _f(x.peak_busbw_gbps), human_bytes(x.peak_at_bytes or 0))
    c.print(s)
    for ch in r.checks:
        value = "-" if ch.value is None else (ms(ch.value) if ch.unit == "s" else f"{ch.value:.3g} {ch.unit}")
        limit = ms(ch.threshold) if ch.unit == "s" else f"{ch.threshold:.3g} {ch.unit}"
        c.print(Text.assemble(f"{ch.name}: {value} (guide: {'<' if ch.unit == 's' else '>'} {limit}) ",
                              _verdict(ch.ok), Text(f"  {ch.detail}", style="bright_black")))
    if r.comparison:
        t = Table(box=None, header_style="bold", pad_edge=False, title="training collectives vs this benchmark",
                  title_justify="left", title_style="bold underline")
        for col in ("collective", "group", "mean size", "training busbw", "benchmark busbw", "share", "note"):
            t.add_column(col, justify="left" if col in ("collective", "group", "note") else "right")
        for y in r.comparison:
            bench = _f(y.bench_busbw_gbps) + (" (extrapolated)" if y.basis == "extrapolated" else "")
            t.add_row(y.collective, y.process_group or "-", human_bytes(y.mean_bytes), f"{y.training_busbw_gbps:.2f}",
                      bench, "-" if y.ratio is None else pct(y.ratio, 0), y.note)
        c.print(t)
    _notes(c, r.mismatches, "yellow", "warning")
    _notes(c, r.notes)
    return buf.getvalue()


# ------------------------------------------------------------------ bench net


def render_net(r: NetResult, options: RenderOptions = DEFAULT_OPTIONS) -> str:
    buf = io.StringIO()
    c = _console(buf, options)
    threads = "" if r.threads_per_rank is None else f" · {r.threads_per_rank} thread(s) per rank"
    c.print(Text(f"gpuidle bench net · {r.backend} on {r.device} · {r.world_size} ranks on {r.nodes} node(s){threads}"
                 f" · links between {r.level}s · latency {human_bytes(r.latency_bytes)}, bandwidth "
                 f"{human_bytes(r.bytes)} · {r.runs} runs of {r.iters} round trips (median run shown)", style="bold"))
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("link", "hosts", "latency", "runs: fastest / p90", "bandwidth (GB/s)", ""):
        t.add_column(col, justify="right" if col in ("latency", "runs: fastest / p90", "bandwidth (GB/s)")
                     else "left")
    for x in r.links:
        spread = "-" if x.latency_min_us is None or x.latency_p90_us is None else \
            f"{ms(x.latency_min_us / 1e6)} / {ms(x.latency_p90_us / 1e6)}"
        t.add_row(f"{x.a} ↔ {x.b}", f"{x.host_a} ↔ {x.host_b}", ms(x.latency_us / 1e6), spread,
                  f"{x.bandwidth_gbps:.3f}",
                  Text(f"slow: {x.why}", style="red") if x.slow else Text("ok", style="green"))
    c.print(t)
    if r.slowest is not None and r.median_bandwidth_gbps is not None:
        s = r.slowest
        c.print(Text(f"slowest link: rank {s.a} ({s.host_a}) ↔ rank {s.b} ({s.host_b}), "
                     f"{s.bandwidth_gbps:.3f} GB/s against a median of {r.median_bandwidth_gbps:.3f} GB/s",
                     style="bold red" if s.slow else "bold"))
    _notes(c, r.notes)
    return buf.getvalue()


# ------------------------------------------------------------------ tune loader


def _cfg(cfg: LoaderConfig) -> str:
    parts = [f"workers={cfg.num_workers}"]
    if cfg.num_workers:
        parts.append(f"prefetch={cfg.prefetch_factor}")
    if cfg.pin_memory:
        parts.append("pin")
    if cfg.persistent_workers:
        parts.append("persistent")
    return " ".join(parts)


def _plot(r: LoaderResult) -> Table:
    """Throughput against workers (the num_workers sweep), with the target marked on each bar."""
    sweep = [p for p in r.points if p.batches_per_s is not None and not p.config.pin_memory
             and p.config.prefetch_factor in (None, 2)]
    top = max([p.batches_per_s or 0.0 for p in sweep] + [r.target_batches_per_s or 0.0]) or 1.0
    mark = None if r.target_batches_per_s is None else min(BAR - 1, round(r.target_batches_per_s / top * BAR))
    t = Table(box=None, pad_edge=False, show_header=False, title="batches/s vs num_workers", title_justify="left",
              title_style="bold underline")
    t.add_column(justify="right")
    t.add_column()
    t.add_column(justify="right")
    for p in sweep:
        rate = p.batches_per_s or 0.0
        filled = round(rate / top * BAR)
        cells = ["█" if i < filled else " " for i in range(BAR)]
        if mark is not None:
            cells[mark] = "┃" if mark >= filled else "╋"
        style = "yellow" if p.oversubscribed else "cyan"
        t.add_row(str(p.config.num_workers), Text("".join(cells), style=style), f"{rate:.1f}")
    return t


def render_loader(r: LoaderResult, options: RenderOptions = DEFAULT_OPTIONS) -> str:
    buf = io.StringIO()
    c = _console(buf, options)
    size = "?" if r.dataset_len is None else f"{r.dataset_len:,}"
    c.print(Text(f"gpuidle tune loader · {r.dataset} ({size} items) · batch {r.batch_size} · {r.cores} cores, "
                 f"{r.local_ranks} local rank(s) · {r.elapsed_s:.1f} s of a {r.budget_s:g} s budget", style="bold"))
    if r.target_batches_per_s is not None:
        c.print(Text(f"target: {r.target_batches_per_s:.2f} batches/s ({r.target_source or 'given'})"))
    t = Table(box=None, header_style="bold", pad_edge=False)
    stepped = r.target_batches_per_s is not None
    cols = ("setting", "start-up", "batches/s", "±", *(("steps/s",) if stepped else ()), "samples/s",
            "batches timed", "")
    for col in cols:
        t.add_column(col, justify="left" if col in ("setting", "") else "right")
    for p in r.points:
        flag = Text(p.error, style="red") if p.error else (
            Text("contended", style="yellow") if p.contended else
            Text("more processes than cores", style="bright_black") if p.oversubscribed else Text(""))
        noise = "" if p.noise is None else f"{p.noise * 100:.1f} %"
        t.add_row(_cfg(p.config), ms(p.startup_s), _f(p.batches_per_s, ".1f"), noise,
                  *((_f(p.step_per_s, ".2f"),) if stepped else ()), _f(p.samples_per_s, ".0f"), str(p.batches), flag)
    c.print(t)
    if stepped:
        c.print(Text("steps/s: what a training loop gets; with 0 workers loading and compute run in series, "
                     "1 / (1 / batches/s + 1 / target)", style="bright_black"))
    c.print(_plot(r))
    if r.persistent is not None:
        ps = r.persistent
        c.print(Text(f"epoch start with {ps.num_workers} workers: {ms(ps.fresh_start_s)} fresh, "
                     f"{ms(ps.persistent_start_s)} with persistent_workers=True", style="bright_black"))
    if r.recommended is not None:
        reach = {True: "reaches the target", False: "falls short of the target",
                 None: "the fewest workers within noise of the best"}
        c.print(Text(f"recommended: {_cfg(r.recommended)} — {_f(r.recommended_batches_per_s, '.1f')} batches/s, "
                     f"{reach[r.reaches_target]}", style="bold green" if r.reaches_target is not False else "bold"))
        if r.snippet:
            c.print(code_block(r.snippet, 2), crop=False)
    _notes(c, r.warnings, "yellow", "warning")
    _notes(c, r.notes)
    return buf.getvalue()


# ------------------------------------------------------------------ bench storage


def render_storage(r: StorageResult, options: RenderOptions = DEFAULT_OPTIONS) -> str:
    buf = io.StringIO()
    c = _console(buf, options)
    ls = r.listing
    c.print(Text(f"gpuidle bench storage · {r.path} · {ls.files:,} files{'' if ls.complete else '+'}, "
                 f"{human_bytes(ls.total_bytes)}, median {human_bytes(ls.median_bytes)}, largest "
                 f"{human_bytes(ls.largest_bytes)}" + (" · page cache dropped" if r.drop_cache else ""), style="bold"))
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("phase", "MB/s", "files/s", "IOPS", "reads of", "mean read", "reads", "read", "files",
                "from cache"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for p in r.phases:
        t.add_row(p.name, _f(p.mb_per_s, ",.1f"), _f(p.files_per_s, ",.0f"), _f(p.iops, ",.0f"),
                  "whole file" if p.block_bytes is None else human_bytes(p.block_bytes),
                  human_bytes(p.mean_read_bytes), f"{p.reads:,}", human_bytes(p.bytes), f"{p.files:,}",
                  "?" if p.cached_share is None else pct(p.cached_share, 0))
    c.print(t)
    _notes(c, r.advice, "bold yellow", "advice")
    _notes(c, r.notes)
    return buf.getvalue()


# ------------------------------------------------------------------ cost


def _lines(lines: list[CalcLine]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("", "value", "formula", "worked", "rounding"):
        t.add_column(col, justify="right" if col == "value" else "left")
    for x in lines:
        t.add_row(x.name.replace("_", " "), Text(x.shown, style="bold"), x.formula,
                  Text(x.worked, style="bright_black"), Text(x.rounding, style="bright_black"))
    return t


def render_cost(r: CalcReport, options: RenderOptions = DEFAULT_OPTIONS) -> str:
    buf = io.StringIO()
    c = _console(buf, options)
    cost: CostResult | None = r.cost
    if cost is not None:
        gpus = f"{cost.gpus} GPU{'' if cost.gpus == 1 else 's'}"
        head = f"gpuidle cost · {gpus} × {cost.hours:g} h at {pct(cost.utilization)} utilization"
        if cost.price_per_gpu_hour is not None:
            head += f" · {cost.price_per_gpu_hour:g} per GPU-hour"
        if cost.target is not None:
            head += f" · target {pct(cost.target)}"
        c.print(Text(head, style="bold"))
        c.print(_lines(cost.lines))
        _notes(c, cost.notes)
    if r.lines:
        c.print(_lines(r.lines))
    _notes(c, r.notes)
    return buf.getvalue()


TERMINAL: dict[type[Any], Callable[[Any, RenderOptions], str]] = {
    AllReduceResult: render_allreduce,
    NetResult: render_net,
    LoaderResult: render_loader,
    StorageResult: render_storage,
    CalcReport: render_cost,
}


def render(result: msgspec.Struct, options: RenderOptions = DEFAULT_OPTIONS, fmt: str = "terminal") -> str:
    """``terminal`` or ``json`` for any probe result."""
    if fmt == "json":
        return to_json(result)
    if fmt != "terminal":
        raise GpuidleError(f"unknown format {fmt!r} for this command", "choose terminal or json")
    return TERMINAL[type(result)](printable_report(result), options)
