"""``bench allreduce``: collective bandwidth over torch.distributed, as nccl-tests measures it.

For each operation and each message size (×2 from ``min_bytes`` up to ``max_bytes``,
bounded by the memory of every rank) the ranks run warm-up iterations, then ``runs``
timed runs of ``iters`` iterations. A run starts on a barrier and lasts until the
slowest rank is done (a broadcast root that returns early does not shorten it); the
row's time is the median run, with the fastest run and the 90th percentile beside it,
and when those disagree by more than :data:`DISAGREE` as many runs again are made (a
loaded machine makes runs bimodal). ``algbw = bytes / time`` and
``busbw = algbw × factor`` with the factors of :func:`gpuidle.analysis.comm.bus_factor`.
``bytes`` is counted as nccl-tests counts it: the larger of a rank's input and output
(all_gather: the gathered output; reduce_scatter: the full input). The small-message latency is the median time over
the sizes up to 1 KiB, steadier than any one size, with the spread of all their runs.
Checks compare with the guide's rules of thumb; :mod:`gpuidle.probes.training` sets the
figures beside what a profiled training run's own collectives reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from gpuidle.advice.calc import busbw
from gpuidle.analysis.comm import bus_factor
from gpuidle.errors import GpuidleError
from gpuidle.model import duration
from gpuidle.probes.common import (
    GIB,
    GUIDE_BANDWIDTH_GBPS,
    GUIDE_LATENCY_S,
    MIB,
    import_dist,
    import_torch,
    ram_bytes,
)
from gpuidle.probes.ranks import Progress, RankContext, run_on_ranks

SCHEMA = "gpuidle.bench.allreduce/1"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64")
DEFAULT_MAX_BYTES = {"cuda": GIB, "cpu": 64 * MIB}
"""1 GiB as nccl-tests sweeps on a GPU; gloo over the CPU gets slow above tens of MiB."""
MEMORY_SHARE = 0.5
"""At most this share of free memory goes to buffers (two per rank: input and output)."""
SMALL_MESSAGE = 1 << 10
"""Sizes up to this are latency-bound: their median time is the small-message latency."""
DISAGREE = 2.0
"""Runs disagree when the 90th percentile run is over this multiple of the fastest: measure again."""


class AllReduceConfig(msgspec.Struct, frozen=True):
    ops: tuple[str, ...] = OPS
    min_bytes: int = 8
    max_bytes: int | None = None
    """None: 1 GiB on a GPU, 64 MiB on the CPU."""
    warmup: int = 5
    iters: int = 20
    """Iterations per run, fewer where a size is slow (``max_s_per_size``)."""
    runs: int = 5
    """Timed runs per size; as many again when they disagree."""
    max_s_per_size: float = 2.0
    """Fewer timed iterations where a size would take longer than this (agreed over ranks)."""
    dtype: str = "float32"


class SizeRow(msgspec.Struct):
    op: str
    bytes: int
    count: int
    """Elements in the message (``bytes`` / element size)."""
    iters: int
    time_us: float | None
    """Time per iteration of the median run (a run lasts until the slowest rank is done)."""
    algbw_gbps: float | None
    busbw_gbps: float | None
    error: str | None = None
    """Why there is no figure, e.g. ``not supported by backend gloo``."""
    runs_us: list[float] = []
    """Time per iteration of every run, in the order run."""
    time_min_us: float | None = None
    time_p90_us: float | None = None


class OpSummary(msgspec.Struct):
    op: str
    bus_factor: float
    supported: bool
    latency_us: float | None
    """Median time over the sizes up to 1 KiB (the smallest size when none is that small)."""
    latency_bytes: int | None
    """The largest size in that median."""
    peak_busbw_gbps: float | None
    peak_at_bytes: int | None
    error: str | None = None
    latency_min_us: float | None = None
    """Fastest of all the runs of the sizes up to 1 KiB."""
    latency_p90_us: float | None = None
    """90th percentile of those runs."""


class Check(msgspec.Struct):
    """A measured figure against one of the guide's rules of thumb."""

    name: str
    value: float | None
    threshold: float
    unit: str
    ok: bool | None
    detail: str


class TrainingComparison(msgspec.Struct):
    collective: str
    process_group: str
    mean_bytes: int
    """Mean message size of the training's calls: total bytes / calls."""
    training_busbw_gbps: float
    bench_busbw_gbps: float | None
    """The benchmark's busbw at ``mean_bytes``: interpolated over log2(size) inside the sizes measured,
    extrapolated with the latency + bytes / bandwidth fit outside (``basis``)."""
    ratio: float | None
    note: str
    basis: str = "measured"
    """``measured`` (interpolated) or ``extrapolated``; ``none`` when not measured."""
    size_ratio: float | None = None
    """``mean_bytes`` / the largest size measured (above it), or / the smallest (below it); None inside."""


class AllReduceResult(msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    backend: str
    device: str
    device_name: str | None
    torch_version: str
    world_size: int
    nodes: int
    local_world_size: int
    dtype: str
    warmup: int
    iters: int
    runs: int = 1
    threads_per_rank: int | None = None
    max_bytes: int
    rows: list[SizeRow]
    summaries: list[OpSummary]
    checks: list[Check]
    comparison: list[TrainingComparison] = []
    mismatches: list[str] = []
    """How the benchmark differs from the compared training's setup (world size, backend, device)."""
    notes: list[str] = []


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """``min_bytes`` doubled until above ``max_bytes``: 8, 16, ..., 1 GiB."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise GpuidleError(f"no message sizes between {min_bytes} and {max_bytes} bytes",
                           "--min-bytes must be at least 1 and at most --max-bytes")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out


def element_count(op: str, nbytes: int, elem: int, n: int) -> int:
    """Elements for a message of ``nbytes``; split operations need a multiple of ``n`` (at least ``n``)."""
    count = max(nbytes // elem, 1)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(count // n * n, n)
    return count


def run_allreduce(config: AllReduceConfig | None = None, *, nproc: int | None = None, device: str = "auto",
                  timeout_s: float = 300.0, progress: Progress | None = None,
                  start_method: str | None = None) -> AllReduceResult | None:
    """Measure on every rank (spawned locally, or the launcher's); rank 0 gets the result."""
    config = config or AllReduceConfig()
    unknown = [op for op in config.ops if op not in OPS]
    if unknown:
        raise GpuidleError(f"unknown operation {', '.join(unknown)}", f"choose from {', '.join(OPS)}")
    if config.dtype not in DTYPES:
        raise GpuidleError(f"unknown dtype {config.dtype!r}", f"choose one of {', '.join(DTYPES)}")
    if config.warmup < 1 or config.iters < 1 or config.runs < 1:
        raise GpuidleError("--warmup, --iters and --runs must be at least 1")
    return run_on_ranks(measure_collectives, config, nproc=nproc, device=device, timeout_s=timeout_s,
                        progress=progress, start_method=start_method)


def _runner(op: str, count: int, n: int, ctx: RankContext, dtype: Any) -> Callable[[], None]:
    """One iteration of ``op`` on fresh zero buffers (zeros: a sum never overflows)."""
    torch, dist = import_torch(), import_dist()

    def zeros(k: int) -> Any:
        return torch.zeros(k, dtype=dtype, device=ctx.device)

    # all_gather_single/reduce_scatter_single replace the *_tensor names from torch 2.11 on
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        buf = zeros(count)
        return lambda: dist.all_reduce(buf)
    if op == "broadcast":
        buf = zeros(count)
        return lambda: dist.broadcast(buf, 0)
    if op == "all_gather":
        part, full = zeros(count // n), zeros(count)
        return lambda: gather(full, part)
    if op == "reduce_scatter":
        part, full = zeros(count // n), zeros(count)
        return lambda: scatter(part, full)
    inp, out = zeros(count), zeros(count)
    return lambda: dist.all_to_all_single(out, inp)


def _memory_cap(ctx: RankContext) -> float:
    """Largest message this rank can hold twice (input and output) in its share of free memory."""
    torch = import_torch()
    if ctx.device_type == "cuda":
        free, _ = torch.cuda.mem_get_info(ctx.device)
        return float(free) * MEMORY_SHARE / 2
    _, avail = ram_bytes()
    if avail is None:
        return float("inf")
    return avail * MEMORY_SHARE / (2 * ctx.local_world_size)


def _unsupported(err: Exception, backend: str) -> str:
    text = str(err).lower()
    if any(w in text for w in ("not supported", "does not support", "unsupported", "not implemented")):
        return f"not supported by backend {backend}"
    return f"failed on backend {backend}: {type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"


def measure_collectives(ctx: RankContext, cfg: AllReduceConfig, progress: Progress | None) -> AllReduceResult:
    """The sweep, on one rank. Every rank runs the same calls in the same order."""
    torch = import_torch()
    dtype = getattr(torch, cfg.dtype)
    elem = torch.empty(0, dtype=dtype).element_size()
    n = ctx.world_size
    notes: list[str] = []
    wanted = cfg.max_bytes if cfg.max_bytes is not None else DEFAULT_MAX_BYTES[ctx.device_type]
    (cap,) = ctx.agree([min(_memory_cap(ctx), 2.0**62)], "min")
    max_bytes = int(min(wanted, cap))
    if max_bytes < wanted:
        notes.append(f"largest size bounded by memory: {max_bytes} of the {wanted} bytes asked for")
    sizes = message_sizes(cfg.min_bytes, max(max_bytes, cfg.min_bytes))
    total = len(sizes) * len(cfg.ops)
    rows: list[SizeRow] = []
    done = 0
    for op in cfg.ops:
        broken = False  # after a failure the larger sizes are not tried: one row says why
        seen: set[int] = set()
        for nbytes in sizes:
            done += 1
            count = element_count(op, nbytes, elem, n)
            actual = count * elem
            if actual not in seen and not broken:
                seen.add(actual)
                rows.append(_one_size(ctx, op, count, actual, n, dtype, cfg))
                broken = rows[-1].error is not None
            if progress is not None:
                progress(op, done, total)
    summaries = [_summary(op, [r for r in rows if r.op == op], n) for op in cfg.ops]
    dev_name = torch.cuda.get_device_name(ctx.device) if ctx.device_type == "cuda" else None
    if ctx.device_type == "cpu":
        notes.append("measured over the CPU with gloo: the figures show the host network path, not NCCL's")
    notes += unsteady_notes(summaries)
    return AllReduceResult(
        backend=ctx.backend, device=ctx.device_type, device_name=dev_name, torch_version=str(torch.__version__),
        world_size=n, nodes=ctx.nodes, local_world_size=ctx.local_world_size, dtype=cfg.dtype,
        warmup=cfg.warmup, iters=cfg.iters, runs=cfg.runs, threads_per_rank=ctx.threads, max_bytes=max_bytes,
        rows=rows, summaries=summaries, checks=guide_checks(summaries, ctx.nodes), notes=notes)


def _one_size(ctx: RankContext, op: str, count: int, nbytes: int, n: int, dtype: Any,
              cfg: AllReduceConfig) -> SizeRow:
    error = None
    t0 = time.perf_counter()
    try:
        run = _runner(op, count, n, ctx, dtype)
        run()
        ctx.sync()
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as err:
        error = _unsupported(err, ctx.backend)
    # an error is raised by the backend before any traffic, on every rank alike: agree, then skip
    (failed,) = ctx.agree([1.0 if error else 0.0], "max")
    if failed:
        return SizeRow(op, nbytes, count, 0, None, None, None, error or f"failed on another rank ({ctx.backend})")
    warm = time.perf_counter() - t0
    if cfg.warmup > 1:
        t0 = time.perf_counter()
        for _ in range(cfg.warmup - 1):
            run()
        ctx.sync()
        warm = (time.perf_counter() - t0) / (cfg.warmup - 1)
    (warm,) = ctx.agree([warm], "max")
    iters = max(1, min(cfg.iters, int(cfg.max_s_per_size / (warm * cfg.runs)) if warm > 0 else cfg.iters))
    times = [_timed_run(ctx, run, iters) for _ in range(cfg.runs)]
    if spread(times) > DISAGREE:  # the same decision on every rank: the times are agreed
        times += [_timed_run(ctx, run, iters) for _ in range(cfg.runs)]
    median = float(np.median(times))
    algbw = nbytes / median / 1e9
    return SizeRow(op, nbytes, count, iters, median * 1e6, algbw, busbw(algbw, bus_factor(op, n)),
                   runs_us=[t * 1e6 for t in times], time_min_us=min(times) * 1e6,
                   time_p90_us=float(np.percentile(times, 90)) * 1e6)


def _timed_run(ctx: RankContext, run: Callable[[], None], iters: int) -> float:
    """Seconds per iteration from a common start until the slowest rank is done."""
    ctx.agree([0.0])
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    ctx.sync()
    (slowest,) = ctx.agree([time.perf_counter() - t0], "max")
    return slowest / iters


def spread(times: Sequence[float]) -> float:
    """90th percentile over the fastest: 1 for steady runs, large for bimodal ones."""
    fastest = min(times)
    return float(np.percentile(times, 90)) / fastest if fastest > 0 else 1.0


def _summary(op: str, rows: Sequence[SizeRow], n: int) -> OpSummary:
    ok = [r for r in rows if r.time_us is not None]
    if not ok:
        err = rows[0].error if rows else "no sizes measured"
        return OpSummary(op, bus_factor(op, n), False, None, None, None, None, err)
    peak = max(ok, key=lambda r: r.busbw_gbps or 0.0)
    small = [r for r in ok if r.bytes <= SMALL_MESSAGE] or ok[:1]
    latency = float(np.median([r.time_us for r in small if r.time_us is not None]))
    pooled = [t for r in small for t in r.runs_us]
    return OpSummary(op, bus_factor(op, n), True, latency, small[-1].bytes, peak.busbw_gbps, peak.bytes,
                     latency_min_us=min(pooled) if pooled else None,
                     latency_p90_us=float(np.percentile(pooled, 90)) if pooled else None)


def unsteady_notes(summaries: Sequence[OpSummary]) -> list[str]:
    """A note for each operation whose small-message runs disagree: the machine or network is shared."""
    out = []
    for x in summaries:
        lo, hi = x.latency_min_us, x.latency_p90_us
        if x.latency_us is None or lo is None or hi is None or lo <= 0 or hi / lo <= DISAGREE:
            continue
        out.append(f"{x.op} small-message latency varies between runs: fastest {duration(lo / 1e6)}, median "
                   f"{duration(x.latency_us / 1e6)}, 90th percentile {duration(hi / 1e6)}; other work shares "
                   "the cores or the network (the check uses the median)")
    return out


def guide_checks(summaries: Sequence[OpSummary], nodes: int) -> list[Check]:
    """all_reduce small-message latency < 1 ms and peak busbw > 10 Gbit/s, the guide's rules of thumb."""
    ar = next((s for s in summaries if s.op == "all_reduce" and s.supported), None)
    if ar is None:
        return []
    where = "between nodes" if nodes > 1 else "on one node (run across nodes to test the network)"
    lat = None if ar.latency_us is None else ar.latency_us / 1e6
    bw = ar.peak_busbw_gbps
    return [
        Check("small-message latency", lat, GUIDE_LATENCY_S, "s",
              None if lat is None else lat < GUIDE_LATENCY_S,
              f"all_reduce of up to {ar.latency_bytes} B {where}; the guide asks for under 1 ms"),
        Check("bus bandwidth", bw, GUIDE_BANDWIDTH_GBPS, "GB/s",
              None if bw is None else bw > GUIDE_BANDWIDTH_GBPS,
              f"peak all_reduce busbw {where}; the guide asks for over 10 Gbit/s (1.25 GB/s)"),
    ]
