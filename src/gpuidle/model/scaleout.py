"""The scale-out what-if (``analyze --scale-to N``): the job's step, utilization and throughput at N GPUs."""

from __future__ import annotations

import msgspec


class Span(msgspec.Struct, kw_only=True):
    """A figure now and at the target size: a range whose ends are the assumptions' two ends."""

    now: float
    low: float
    high: float


class CommFit(msgspec.Struct, kw_only=True):
    """``time = α × ring steps + bytes × bus factor / bandwidth`` per collective call (nccl-tests' factors)."""

    alpha_s: float
    """Latency per step of the ring (all-reduce: 2(N−1) steps; all-gather, reduce-scatter, all-to-all: N−1)."""
    busbw_gbps: float | None
    """Bus bandwidth, GB/s; None: the times do not grow with the bytes (latency alone)."""
    source: str
    """``trace`` (fitted across the trace's message sizes), ``trace, one size`` or ``allreduce results``."""
    sizes: int = 0
    """Distinct message sizes the fit stands on."""
    inter_node_gbps: float | None = None
    """The bandwidth taken once the ring crosses a node, where it does."""


class ScaleOut(msgspec.Struct, kw_only=True):
    gpus_now: int
    gpus: int
    """The size asked for (``--scale-to``)."""
    dim: str = "dp"
    scaling: str = "weak"
    """``weak``: the per-GPU batch is kept; ``strong``: the global batch is kept (each GPU gets N₀/N of it)."""
    gpus_per_node: int = 8
    rank: int | None = None
    """The rank that sets the pace at the target size (its own step the longest)."""
    step_s: Span
    utilization: Span
    throughput_x: Span
    """Samples/s at N as a multiple of samples/s now (N/N₀ × step now / step at N; strong scaling: step now / step
    at N): its ``low`` is the pessimistic end (the longest step)."""
    samples_per_s: Span | None = None
    """Samples/s of the whole job, where the per-GPU batch is known (``--batch-size``)."""
    parts_s: dict[str, Span] = {}
    """The pace-setting rank's step at N by part: ``compute`` (busy), each idle cause, ``communication``."""
    comm: CommFit | None = None
    comm_per_step_s: Span | None = None
    """The collectives' time per step (overlapped or not) now and at N."""
    limit: str
    """The cause that stops the job scaling: ``data_loading``, ``communication``, ``compute`` (strong scaling) or
    ``none``."""
    answer: str
    """One sentence: will more GPUs raise utilization, and what stops it, with its figure."""
    assumptions: list[str] = []
    missing: list[str] = []
    """What the input lacks for a part of the figure (the part is then left as it is now, and said so)."""
