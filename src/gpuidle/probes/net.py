"""``bench net``: point-to-point latency and bandwidth of every link, and which one is slow.

One rank per node (the lowest rank on each host) pairs with every other such rank, one
pair at a time while the other ranks wait, and plays ping-pong through
``torch.distributed.send``/``recv``: half the round trip of a small message is the
latency, a large message over half its round trip is the bandwidth. Each is the median
of ``runs`` runs, the latency with its fastest run and 90th percentile; when those
disagree by more than :data:`~gpuidle.probes.allreduce.DISAGREE` (a loaded machine makes
latency bimodal) the pair makes as many latency runs again. On a single node
every pair of ranks is measured instead (``level="rank"``). A link is slow when its
bandwidth is under half the median link's or its latency over twice the median's, or
when it misses the guide's rules of thumb (latency under 1 ms, over 10 Gbit/s).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence

import msgspec
import numpy as np

from gpuidle.errors import GpuidleError
from gpuidle.model import duration
from gpuidle.probes.allreduce import DISAGREE, spread
from gpuidle.probes.common import GUIDE_BANDWIDTH_GBPS, GUIDE_LATENCY_S, MIB, import_dist, import_torch
from gpuidle.probes.ranks import Progress, RankContext, run_on_ranks

SCHEMA = "gpuidle.bench.net/1"
DEFAULT_BYTES = {"cuda": 64 * MIB, "cpu": 16 * MIB}
SLOW_BANDWIDTH = 0.5
"""A link under this share of the median link's bandwidth is slow."""
SLOW_LATENCY = 2.0
"""A link over this multiple of the median link's latency is slow."""


class NetConfig(msgspec.Struct, frozen=True):
    bytes: int | None = None
    """Message size for bandwidth; None: 64 MiB on a GPU, 16 MiB on the CPU."""
    latency_bytes: int = 8
    warmup: int = 3
    iters: int = 20
    """Round trips per run."""
    runs: int = 5
    """Runs per measurement; as many latency runs again when they disagree."""
    level: str = "auto"
    """``node`` (one rank per host), ``rank`` (every rank) or ``auto`` (node when there are several)."""


class Link(msgspec.Struct):
    a: int
    """Rank at one end (the lower)."""
    b: int
    host_a: str
    host_b: str
    latency_us: float
    """Half the round trip of a ``latency_bytes`` message, median run."""
    bandwidth_gbps: float
    """``bytes`` / half the round trip of a ``bytes`` message (median run), GB/s."""
    slow: bool = False
    why: str | None = None
    latency_runs_us: list[float] = []
    """The latency of every run, in the order run."""
    latency_min_us: float | None = None
    latency_p90_us: float | None = None


class NetResult(msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    backend: str
    device: str
    world_size: int
    nodes: int
    level: str
    bytes: int
    latency_bytes: int
    iters: int
    links: list[Link]
    runs: int = 1
    threads_per_rank: int | None = None
    slowest: Link | None
    """The link with the least bandwidth."""
    median_latency_us: float | None
    median_bandwidth_gbps: float | None
    notes: list[str] = []


def run_net(config: NetConfig | None = None, *, nproc: int | None = None, device: str = "auto",
            timeout_s: float = 300.0, progress: Progress | None = None,
            start_method: str | None = None) -> NetResult | None:
    """Measure every link (ranks spawned locally, or the launcher's); rank 0 gets the result."""
    config = config or NetConfig()
    if config.level not in ("auto", "node", "rank"):
        raise GpuidleError(f"unknown level {config.level!r}", "choose auto, node or rank")
    if config.warmup < 0 or config.iters < 1 or config.runs < 1 or config.latency_bytes < 1 \
            or (config.bytes or 1) < 1:
        raise GpuidleError("--iters, --runs and message sizes must be at least 1")
    return run_on_ranks(measure_links, config, nproc=nproc, device=device, timeout_s=timeout_s,
                        progress=progress, start_method=start_method)


def endpoints(hosts: Sequence[str], level: str) -> tuple[list[int], str]:
    """The ranks to pair: the first rank of each host, or every rank on a single node."""
    firsts = sorted({h: r for r, h in reversed(list(enumerate(hosts)))}.values())
    if level == "node" or (level == "auto" and len(firsts) > 1):
        return firsts, "node"
    return list(range(len(hosts))), "rank"


def _pingpong(ctx: RankContext, peer: int, buf: object, lead: bool, iters: int) -> float:
    """Mean round-trip seconds; the leading rank sends first."""
    dist = import_dist()
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        if lead:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
    ctx.sync()
    return (time.perf_counter() - t0) / iters


def measure_links(ctx: RankContext, cfg: NetConfig, progress: Progress | None) -> NetResult:
    torch = import_torch()
    ends, level = endpoints(ctx.hosts, cfg.level)
    pairs = list(itertools.combinations(ends, 2))
    if not pairs:
        raise GpuidleError("one rank: no link to measure", "give --nproc 2 or more, or run under torchrun")
    nbytes = cfg.bytes or DEFAULT_BYTES[ctx.device_type]
    small = torch.zeros(max(cfg.latency_bytes, 1), dtype=torch.uint8, device=ctx.device)
    big = torch.zeros(nbytes, dtype=torch.uint8, device=ctx.device)
    mine: list[tuple[int, int, list[float], float]] = []
    for i, (a, b) in enumerate(pairs):
        ctx.agree([0.0])  # one link at a time: nothing else on the wire
        if ctx.rank in (a, b):
            peer, lead = (b, True) if ctx.rank == a else (a, False)
            if cfg.warmup:
                _pingpong(ctx, peer, small, lead, cfg.warmup)
                _pingpong(ctx, peer, big, lead, cfg.warmup)
            lats = _latency_runs(ctx, peer, small, lead, cfg)
            bw_iters = max(1, min(cfg.iters, 5 if nbytes >= 256 * MIB else cfg.iters))
            half = statistics.median(_pingpong(ctx, peer, big, lead, bw_iters) / 2 for _ in range(cfg.runs))
            if lead:
                mine.append((a, b, lats, half))
        if progress is not None:
            progress("links", i + 1, len(pairs))
    gathered = ctx.gather_objects(mine)
    parts: list[list[tuple[int, int, list[float], float]]] = gathered  # type: ignore[assignment]
    links = [Link(a, b, ctx.hosts[a], ctx.hosts[b], statistics.median(lats) * 1e6, nbytes / half / 1e9,
                  latency_runs_us=[x * 1e6 for x in lats], latency_min_us=min(lats) * 1e6,
                  latency_p90_us=float(np.percentile(lats, 90)) * 1e6)
             for part in parts for (a, b, lats, half) in part]
    links.sort(key=lambda link: (link.a, link.b))
    notes = []
    if level == "rank":
        notes.append("all ranks on one node: links between processes, not between nodes")
    if ctx.device_type == "cpu":
        notes.append("measured over the CPU with gloo")
    for x in links:
        lo, hi = x.latency_min_us, x.latency_p90_us
        if lo and hi and hi / lo > DISAGREE:
            notes.append(f"link {x.a} ↔ {x.b}: latency varies between runs (fastest {duration(lo * 1e-6)}, median "
                         f"{duration(x.latency_us * 1e-6)}, 90th percentile {duration(hi * 1e-6)}): other work "
                         "shares the cores or the network; the median is used")
    result = summarize_links(links, backend=ctx.backend, device=ctx.device_type, world_size=ctx.world_size,
                             nodes=ctx.nodes, level=level, nbytes=nbytes, latency_bytes=cfg.latency_bytes,
                             iters=cfg.iters, notes=notes)
    return msgspec.structs.replace(result, runs=cfg.runs, threads_per_rank=ctx.threads)


def _latency_runs(ctx: RankContext, peer: int, small: object, lead: bool, cfg: NetConfig) -> list[float]:
    """Half round trips of ``cfg.runs`` runs; the leading rank decides whether they disagree and tells its peer."""
    torch, dist = import_torch(), import_dist()
    lats = [_pingpong(ctx, peer, small, lead, cfg.iters) / 2 for _ in range(cfg.runs)]
    again = torch.tensor([1 if lead and spread(lats) > DISAGREE else 0], dtype=torch.uint8, device=ctx.device)
    if lead:
        dist.send(again, peer)
    else:
        dist.recv(again, peer)
    if int(again.item()):
        lats += [_pingpong(ctx, peer, small, lead, cfg.iters) / 2 for _ in range(cfg.runs)]
    return lats


def flag_slow(links: Sequence[Link]) -> list[Link]:
    """Mark the slow links, each with its reason in numbers. Pure: same links in, flagged copies out."""
    if not links:
        return []
    med_bw = statistics.median(link.bandwidth_gbps for link in links)
    med_lat = statistics.median(link.latency_us for link in links)
    out = []
    for link in links:
        why = []
        if len(links) > 1 and link.bandwidth_gbps < SLOW_BANDWIDTH * med_bw:
            why.append(f"bandwidth {link.bandwidth_gbps:.3g} GB/s is under half the median link's {med_bw:.3g}")
        if len(links) > 1 and link.latency_us > SLOW_LATENCY * med_lat:
            why.append(f"latency {duration(link.latency_us * 1e-6)} is over twice the median link's "
                       f"{duration(med_lat * 1e-6)}")
        if link.latency_us > GUIDE_LATENCY_S * 1e6:
            why.append(f"latency {duration(link.latency_us * 1e-6)} is over the guide's 1 ms")
        if link.bandwidth_gbps < GUIDE_BANDWIDTH_GBPS:
            why.append(f"bandwidth {link.bandwidth_gbps:.3g} GB/s is under the guide's 10 Gbit/s (1.25 GB/s)")
        out.append(msgspec.structs.replace(link, slow=bool(why), why="; ".join(why) or None))
    return out


def summarize_links(links: Sequence[Link], *, backend: str, device: str, world_size: int, nodes: int, level: str,
                    nbytes: int, latency_bytes: int, iters: int, notes: list[str]) -> NetResult:
    flagged = flag_slow(links)
    slowest = min(flagged, key=lambda link: link.bandwidth_gbps) if flagged else None
    return NetResult(
        backend=backend, device=device, world_size=world_size, nodes=nodes, level=level, bytes=nbytes,
        latency_bytes=latency_bytes, iters=iters, links=flagged, slowest=slowest,
        median_latency_us=statistics.median(x.latency_us for x in flagged) if flagged else None,
        median_bandwidth_gbps=statistics.median(x.bandwidth_gbps for x in flagged) if flagged else None,
        notes=notes)
