"""Scale-out: the job's step, utilization and throughput at N GPUs (data parallel), from its own measurements.

Each rank's steady step (the what-if model's :func:`~gpuidle.advice.whatif.rank_state`) is taken apart and each
part carried to N GPUs by what makes it grow or shrink:

- **compute** (busy): the same per GPU when the per-GPU batch is kept (weak scaling, the default); N₀/N of it
  when the global batch is kept (strong scaling);
- **data loading**: each GPU still loads its own batch (N₀/N of it under strong scaling), and a host's cores are
  shared by more loaders once more ranks sit on it: from unchanged (cores to spare) to slowed by the ratio of
  loaders per host;
- **communication**: the trace's own collectives, fitted as ``time = α × ring steps + bytes × bus factor /
  bandwidth`` (nccl-tests' factors: 2(N−1)/N over 2(N−1) steps for all-reduce, (N−1)/N over N−1 steps for
  all-gather, reduce-scatter and all-to-all), α and the bandwidth fitted across the trace's message sizes or
  taken from ``gpuidle bench allreduce`` results; the overlap the trace shows is kept, as the hidden share (the
  optimistic end) or the hidden seconds (every added second exposed); once the ring crosses a node the
  inter-node bandwidth is taken;
- the wait for slower ranks (``straggler_wait``), in a job with no straggler the ranks' step-to-step jitter: from
  grown as the expected maximum of N normal samples grows over N₀'s (independent delays, the slowest sets the pace)
  to grown with the ring's hops, (N−1)/(N₀−1) (each rank's delay passed on hop by hop, adding up);
- every other cause stays as measured. The job's step is the slowest rank's at each end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuidle.advice.whatif import RankState, rank_state
from gpuidle.analysis.comm import bus_factor
from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport, Cause, CommFit, RankReport, ScaleOut, Span
from gpuidle.model.units import duration

DIMS = ("dp", "tp", "pp")
INTER_NODE_SLOWER = 8.0
"""Without ``--inter-node-gbps``: a node's links carry up to 8× the bandwidth of its network (NVLink 4 at
450 GB/s per GPU against a 400 Gbit/s NIC per GPU), so the pessimistic end takes an eighth of the fitted one."""
DDP_BUCKET_BYTES = 25 << 20
"""DDP's default ``bucket_cap_mb``: a gradient of G bytes is all-reduced in ⌈G / 25 MiB⌉ calls."""
BACKWARD_SHARE = 2 / 3
"""The share of compute a DDP backward takes, under which its all-reduces can hide."""
GRAD_BYTES = (2, 4)
"""Bytes per gradient element: bf16/fp16 to fp32."""


@dataclass(frozen=True, slots=True)
class ScaleOptions:
    gpus: int
    dim: str = "dp"
    strong: bool = False
    gpus_per_node: int = 8
    params: int | None = None
    """The model's parameter count, for a trace with no collective to size the gradient from."""
    link: CommFit | None = None
    """α and bandwidth from ``gpuidle bench allreduce`` results; None: fitted on the trace."""
    inter_node_gbps: float | None = None
    batch_per_gpu: int | None = None
    """The per-GPU batch now, for samples/s (under strong scaling each GPU's share at N is N₀/N of it)."""


def _ring(kind: str, n: int) -> tuple[int, float]:
    """Ring steps and nccl-tests' bus factor (:func:`~gpuidle.analysis.comm.bus_factor`) of one call on ``n``
    ranks; (0, 0) for one rank."""
    if n <= 1:
        return 0, 0.0
    if "all_reduce" in kind or kind.startswith("allreduce"):
        return 2 * (n - 1), bus_factor("all_reduce", n)
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "all_gather+reduce_scatter"):
        return n - 1, bus_factor("all_gather", n)
    return 1, 1.0


@dataclass(frozen=True, slots=True)
class _Call:
    kind: str
    per_step: float
    """Calls of this size per step."""
    nbytes: float
    """Mean message size."""
    seconds: float
    """Mean time of one call."""


def _calls(r: RankReport) -> list[_Call]:
    steps = max(len(r.steps), 1)
    return [_Call(c.collective, c.count / steps, c.bytes / c.count, c.total_s / c.count)
            for c in r.communication.collectives if c.count > 0 and c.bytes > 0 and c.total_s > 0]


def fit(calls: Sequence[_Call], n0: int) -> tuple[CommFit, CommFit]:
    """The optimistic and pessimistic fits: the same one where the sizes tell α from the bandwidth; from all
    bandwidth (α = 0) to half latency where the trace holds one message size."""
    a = [_ring(c.kind, n0)[0] for c in calls]
    b = [c.nbytes * _ring(c.kind, n0)[1] for c in calls]
    t = [c.seconds for c in calls]
    w = [c.per_step for c in calls]
    if len({round(x) for x in b}) >= 2:
        alpha, inv = _lstsq(a, b, t, w)
        one = CommFit(alpha_s=alpha, busbw_gbps=1 / inv / 1e9 if inv > 0 else None, source="trace",
                      sizes=len({round(x) for x in b}))
        return one, one
    i = max(range(len(calls)), key=lambda k: w[k])
    bw = CommFit(alpha_s=0.0, busbw_gbps=b[i] / t[i] / 1e9, source="trace, one size", sizes=1)
    lat = CommFit(alpha_s=t[i] / 2 / max(a[i], 1), busbw_gbps=b[i] / (t[i] / 2) / 1e9, source="trace, one size",
                  sizes=1)
    return bw, lat


def _lstsq(a: Sequence[int], b: Sequence[float], t: Sequence[float], w: Sequence[float]) -> tuple[float, float]:
    """Weighted least squares ``t = α a + b / B`` with α ≥ 0 and 1/B ≥ 0: returns (α, 1/B)."""
    saa = sum(wi * ai * ai for wi, ai in zip(w, a, strict=True))
    sbb = sum(wi * bi * bi for wi, bi in zip(w, b, strict=True))
    sab = sum(wi * ai * bi for wi, ai, bi in zip(w, a, b, strict=True))
    sat = sum(wi * ai * ti for wi, ai, ti in zip(w, a, t, strict=True))
    sbt = sum(wi * bi * ti for wi, bi, ti in zip(w, b, t, strict=True))
    det = saa * sbb - sab * sab
    if det > 0:
        alpha, inv = (sat * sbb - sbt * sab) / det, (saa * sbt - sab * sat) / det
        if alpha >= 0 and inv >= 0:
            return alpha, inv
    if sbb > 0 and sbt / sbb > 0 and (saa == 0 or sbt * sbt / sbb >= sat * sat / saa):
        return 0.0, sbt / sbb
    return (sat / saa if saa else 0.0), 0.0


def _call_s(f: CommFit, kind: str, nbytes: float, n: int, crossing_gbps: float | None) -> float:
    steps, factor = _ring(kind, n)
    bw = crossing_gbps if crossing_gbps is not None else f.busbw_gbps
    return f.alpha_s * steps + (nbytes * factor / (bw * 1e9) if bw else 0.0)


@dataclass(frozen=True, slots=True)
class _Comm:
    """Per step on one rank: the collectives' time now, their time at N (low, high), the exposed part at N."""

    now: float
    low: float
    high: float
    exposed_low: float
    exposed_high: float


def _job_size(report: AnalysisReport) -> int:
    sizes = [report.job.world_size if report.job is not None else None] + [r.world_size for r in report.ranks]
    return max([s for s in sizes if s], default=max(len(report.ranks), 1))


def _crossing(opt: ScaleOptions, n0: int, fitted: float | None) -> tuple[float | None, float | None, str | None]:
    """The bandwidth at N at both ends where the ring crosses a node it did not cross before; else (None, None)."""
    if opt.gpus <= opt.gpus_per_node or n0 > opt.gpus_per_node or fitted is None:
        return None, None, None
    if opt.inter_node_gbps is not None:
        return (opt.inter_node_gbps, opt.inter_node_gbps,
                f"{opt.gpus} GPUs span {math.ceil(opt.gpus / opt.gpus_per_node)} nodes of {opt.gpus_per_node}: "
                f"the ring runs at the inter-node {opt.inter_node_gbps:g} GB/s given")
    return (fitted, fitted / INTER_NODE_SLOWER,
            f"{opt.gpus} GPUs span {math.ceil(opt.gpus / opt.gpus_per_node)} nodes of {opt.gpus_per_node}: the ring "
            f"crosses the network, from the fitted {fitted:.3g} GB/s to an eighth of it (--inter-node-gbps pins it)")


def _comm(r: RankReport, state: RankState, calls: list[_Call], fits: tuple[CommFit, CommFit], n0: int,
          opt: ScaleOptions, cross: tuple[float | None, float | None]) -> _Comm:
    steps = max(len(r.steps), 1)
    now = r.communication.comm_s / steps
    exposed = state.idle.get(Cause.COMMUNICATION.value, 0.0)
    at = []
    for f, x in zip(fits, cross, strict=True):
        t0 = sum(c.per_step * _call_s(f, c.kind, c.nbytes, n0, None) for c in calls)
        at.append(sum(c.per_step * _call_s(f, c.kind, c.nbytes, opt.gpus, x) for c in calls) / t0 if t0 else 1.0)
    lo, hi = min(at), max(at)
    hidden = max(now - exposed, 0.0)
    ends = [exposed * lo, max(now * lo - hidden, 0.0), exposed * hi, max(now * hi - hidden, 0.0)]
    return _Comm(now, now * lo, now * hi, min(ends), max(ends))


def _grad_comm(state: RankState, opt: ScaleOptions, link: CommFit) -> _Comm:
    """A trace with no collective: the gradient from ``--params`` all-reduced once per step in DDP's buckets."""
    params = opt.params or 0
    ts = []
    for per in GRAD_BYTES:
        g = params * per
        calls = max(math.ceil(g / DDP_BUCKET_BYTES), 1)
        ts.append(calls * _call_s(link, "all_reduce", g / calls, opt.gpus, None))
    lo, hi = min(ts), max(ts)
    hide = state.busy_s * BACKWARD_SHARE
    return _Comm(0.0, lo, hi, max(lo - hide, 0.0), hi)


def scale_out(report: AnalysisReport, opt: ScaleOptions) -> ScaleOut:
    """The job at ``opt.gpus`` GPUs; :class:`GpuidleError` for a size the job cannot scale to."""
    n0 = _job_size(report)
    if opt.dim != "dp":
        raise GpuidleError(f"--scale-dim {opt.dim}: only data-parallel scale-out (dp) is modelled",
                           "leave out --scale-dim, or give --scale-dim dp")
    if opt.gpus < n0:
        raise GpuidleError(f"--scale-to {opt.gpus} is smaller than the job's {n0} GPUs",
                           f"give a number of GPUs of {n0} or more")
    states = {r.rank: rank_state(r, report.include_warmup) for r in report.ranks if r.steps}
    if not states:
        raise GpuidleError("no steps in the input: nothing to scale", "profile a few training steps")
    ranks = {r.rank: r for r in report.ranks if r.rank in states}
    assumptions: list[str] = []
    if len(states) < n0:
        assumptions.append(f"the {len(states)} rank(s) traced of {n0} stand for the job: a rank not traced may set "
                           f"its pace")
    missing: list[str] = []
    calls = {k: _calls(r) for k, r in ranks.items()}
    have_calls = any(calls.values()) and n0 > 1
    comm_fit: CommFit | None = None
    comms: dict[int, _Comm] = {}
    if have_calls:
        fits = (opt.link, opt.link) if opt.link is not None else fit([c for v in calls.values() for c in v], n0)
        lo_x, hi_x, said = _crossing(opt, n0, fits[0].busbw_gbps)
        comm_fit = CommFit(alpha_s=fits[0].alpha_s, busbw_gbps=fits[0].busbw_gbps, source=fits[0].source,
                           sizes=fits[0].sizes, inter_node_gbps=hi_x)
        if said:
            assumptions.append(said)
        if opt.link is None and any(st.idle.get(Cause.STRAGGLER_WAIT.value, 0.0) > 0 for st in states.values()):
            assumptions.append("the collectives' times include waits for late ranks, which the fit reads as latency "
                               "or bandwidth (--allreduce-results takes both from a benchmark instead)")
        if fits[0] is not fits[1]:
            assumptions.append("the trace holds one message size: α and the bandwidth from all bandwidth (α = 0) to "
                               "half of each call's time latency (--allreduce-results fits them on measured sizes)")
        assumptions.append("the overlap the trace shows kept: from the same share of the collectives hidden to the "
                           "same seconds hidden (every added second exposed)")
        comms = {k: _comm(ranks[k], states[k], calls[k], fits, n0, opt, (lo_x, hi_x)) for k in states if calls[k]}
    else:
        if opt.params is None:
            why = ("its collectives carry no message size (PyTorch records one in record_param_comms' In msg nelems)"
                   if n0 > 1 else "the trace has no collective")
            missing.append(f"the gradient size: {why}; pass --params N (the model's parameter count)"
                           + ("" if n0 > 1 else " or profile the job on 2 or more GPUs"))
        elif opt.link is None:
            missing.append("the link's latency and bandwidth: pass --allreduce-results "
                           "(gpuidle bench allreduce --json on the target machines)")
        else:
            comm_fit = opt.link
            assumptions.append(f"{opt.params:,} parameters, their gradients bf16 to fp32, all-reduced once per step "
                               f"in DDP's 25 MiB buckets, from hidden under the backward (2/3 of compute) to exposed")
            comms = {k: _grad_comm(s, opt, opt.link) for k, s in states.items()}
        if missing:
            assumptions.append("communication left as measured: " + "; ".join(missing))
    return _assemble(opt, n0, states, comms, comm_fit, assumptions, missing)


def _assemble(opt: ScaleOptions, n0: int, states: dict[int, RankState],
              comms: dict[int, _Comm], comm_fit: CommFit | None, assumptions: list[str],
              missing: list[str]) -> ScaleOut:
    n = opt.gpus
    k0, k = min(n0, opt.gpus_per_node), min(n, opt.gpus_per_node)
    share = n0 / n if opt.strong else 1.0
    hosts = k / k0
    if opt.strong:
        assumptions.append(f"the global batch kept: compute, data loading and copies per GPU × {n0}/{n}")
    else:
        assumptions.append("the per-GPU batch kept: compute per GPU unchanged")
    if hosts > 1 and any(s.idle.get(Cause.DATA_LOADING.value, 0.0) > 0 for s in states.values()):
        assumptions.append(f"data loading per GPU from unchanged (cores to spare) to × {k}/{k0}: {k} loaders share "
                           f"a host's cores instead of {k0}")
    wait = Cause.STRAGGLER_WAIT.value
    jitter = expected_max(n) / expected_max(n0) if n0 > 1 else 1.0
    hops = (n - 1) / (n0 - 1) if n0 > 1 else 1.0
    if hops > 1 and any(st.idle.get(wait, 0.0) > 0 for st in states.values()):
        assumptions.append(f"the wait for slower ranks × {jitter:.2f} to × {hops:.2f}: the expected maximum of {n} "
                           f"ranks' step-to-step jitter against {n0}'s (normal samples), to the ring's {n - 1} hops "
                           f"against {n0 - 1} passing each delay on")
    parts_lo: dict[int, dict[str, float]] = {}
    parts_hi: dict[int, dict[str, float]] = {}
    for rank, s in states.items():
        base = {"compute": s.busy_s * share}
        for cause, sec in s.idle.items():
            base[cause] = sec * share if cause in (Cause.DATA_LOADING.value, Cause.MEMCPY.value) else sec
        lo, hi = dict(base), dict(base)
        hi[Cause.DATA_LOADING.value] = base.get(Cause.DATA_LOADING.value, 0.0) * hosts
        lo[wait], hi[wait] = base.get(wait, 0.0) * jitter, base.get(wait, 0.0) * hops
        c = comms.get(rank)
        if c is not None:
            lo[Cause.COMMUNICATION.value], hi[Cause.COMMUNICATION.value] = c.exposed_low, c.exposed_high
        parts_lo[rank], parts_hi[rank] = lo, hi
    step0 = max(st.step_s for st in states.values())
    u0 = sum(st.busy_s for st in states.values()) / len(states) / step0 if step0 else 0.0
    pace_lo = max(parts_lo, key=lambda r: (sum(parts_lo[r].values()), -r))
    pace = max(parts_hi, key=lambda r: (sum(parts_hi[r].values()), -r))
    step_lo, step_hi = sum(parts_lo[pace_lo].values()), sum(parts_hi[pace].values())
    busy = sum(p["compute"] for p in parts_hi.values()) / len(parts_hi)
    u_lo, u_hi = (busy / step_hi if step_hi else 0.0), (busy / step_lo if step_lo else 0.0)
    scale = 1.0 if opt.strong else n / n0
    tput = Span(now=1.0, low=scale * step0 / step_hi if step_hi else 0.0,
                high=scale * step0 / step_lo if step_lo else 0.0)
    s0 = states[pace]
    parts = {key: Span(now=(s0.busy_s if key == "compute" else s0.idle.get(key, 0.0)),
                       low=parts_lo[pace][key], high=parts_hi[pace][key])
             for key in parts_hi[pace] if parts_hi[pace][key] > 0 or parts_lo[pace][key] > 0}
    c = comms.get(pace)
    samples = None
    if opt.batch_per_gpu is not None and step0 > 0:
        now_sps = n0 * opt.batch_per_gpu / step0
        samples = Span(now=now_sps, low=now_sps * tput.low, high=now_sps * tput.high)
    out = ScaleOut(
        gpus_now=n0, gpus=n, dim=opt.dim, scaling="strong" if opt.strong else "weak",
        gpus_per_node=opt.gpus_per_node, rank=pace,
        step_s=Span(now=step0, low=step_lo, high=step_hi), utilization=Span(now=u0, low=u_lo, high=u_hi),
        throughput_x=tput, samples_per_s=samples, parts_s=parts, comm=comm_fit,
        comm_per_step_s=Span(now=c.now, low=c.low, high=c.high) if c is not None else None,
        limit="none", answer="", assumptions=assumptions, missing=missing,
    )
    out.limit, out.answer = _answer(out, k0, k)
    return out


def expected_max(n: int) -> float:
    """The expected maximum of ``n`` standard normal samples (0 for one; 0.564 for two, 1.029 for four)."""
    if n <= 1:
        return 0.0
    dx, total = 0.01, 0.0
    for i in range(-800, 801):
        x = i * dx
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * cdf ** (n - 1) * dx
    return total


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def _range(s: Span, f: str = "ms") -> str:
    if f == "%":
        return _pct(s.low) if round(s.low * 100) == round(s.high * 100) else f"{_pct(s.low)}–{_pct(s.high)}"
    if f == "x":
        return f"×{s.low:.2f}" if abs(s.high - s.low) < 0.005 else f"×{s.low:.2f}–{s.high:.2f}"
    a, b = duration(s.low), duration(s.high)
    return a if a == b else f"{a}–{b}"


def _answer(o: ScaleOut, k0: int, k: int) -> tuple[str, str]:
    """The cause that stops the job scaling, and the one sentence that says so with its figures."""
    step = o.step_s.high or 1.0
    data = o.parts_s.get(Cause.DATA_LOADING.value)
    comm = o.parts_s.get(Cause.COMMUNICATION.value)
    tail = (f"utilization {_pct(o.utilization.now)} → {_range(o.utilization, '%')}, samples/s "
            f"{_range(o.throughput_x, 'x')} at {o.gpus} GPUs")
    where = f" on rank {o.rank}" if o.rank is not None else ""
    data_s = data.high if data is not None else 0.0
    comm_s = comm.high if comm is not None else 0.0
    if data is not None and data_s >= comm_s and data_s >= 0.1 * step:
        hosts = (f"; {k} loaders share a host's cores instead of {k0}" if k > k0 else "")
        return Cause.DATA_LOADING.value, (
            f"More GPUs will not raise utilization: data loading takes {duration(data.now)} of each "
            f"{duration(o.step_s.now)} step{where} and stays per GPU at {o.gpus} GPUs ({_range(data)}{hosts}); {tail}.")
    if comm is not None and comm_s >= 0.05 * step and comm.high > comm.now * 1.05:
        return Cause.COMMUNICATION.value, (
            f"Communication grows with the ring: exposed {duration(comm.now)} → {_range(comm)} per step at {o.gpus} "
            f"GPUs (the collectives {_range(o.comm_per_step_s) if o.comm_per_step_s else 'unknown'}); {tail}.")
    if o.scaling == "strong":
        compute = o.parts_s["compute"]
        return "compute", (
            f"Compute shrinks under strong scaling: {duration(compute.now)} → {duration(compute.high)} per step per "
            f"GPU while the rest of the step stays; {tail}.")
    return "none", (f"More GPUs scale this job: step {duration(o.step_s.now)} → {_range(o.step_s)}; {tail}.")
