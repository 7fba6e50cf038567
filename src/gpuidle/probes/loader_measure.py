"""One DataLoader setting measured: start-up apart, then the steady-state rate and its noise.

``iter(loader)`` to the first batch is the start-up (worker processes, the first fetch); the
batches the workers prefetched meanwhile (``num_workers × prefetch_factor``) are drained
untimed; the steady-state rate is taken over at least :data:`PER_WORKER` batches per worker
after them, in whole rounds (workers deliver in rounds, so a count cut mid-round reads high),
at the consumer as a training loop sees them. The timed batches are split into
:data:`CHUNKS` parts; the spread of their rates gives the noise of the rate.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gpuidle.errors import GpuidleError
from gpuidle.probes.common import import_torch

MIN_BATCHES = 4
"""Steady-state batches needed for a rate, and per worker (:data:`PER_WORKER`)."""
PER_WORKER = 4
CHUNKS = 4
"""The timed batches are split in this many parts for the noise of the rate."""
DEFAULT_PREFETCH = 2

Clock = Callable[[], float]


class LoaderConfig(msgspec.Struct, frozen=True):
    num_workers: int
    pin_memory: bool = False
    prefetch_factor: int | None = None
    """None with 0 workers (the DataLoader then forbids it); 2 is torch's default otherwise."""
    persistent_workers: bool = False


class LoaderPoint(msgspec.Struct):
    config: LoaderConfig
    startup_s: float
    """``iter(loader)`` to the first batch: worker start-up, excluded from the rate."""
    batches: int
    """Steady-state batches timed."""
    seconds: float
    batches_per_s: float | None
    samples_per_s: float | None
    oversubscribed: bool
    """``num_workers × local ranks > cores``: more processes than cores (by count alone)."""
    epoch_ended: bool = False
    error: str | None = None
    noise: float | None = None
    """Relative standard error of ``batches_per_s``, from the spread of its parts."""
    step_per_s: float | None = None
    """With a target: the steps per second a training loop would get (0 workers: load and compute in series)."""
    contended: bool = False
    """Oversubscribed, and its rate per worker fell against the setting before it: the numbers show contention."""



def _loader(dataset: Any, cfg: LoaderConfig, batch_size: int, collate_fn: Any, sampler: Any) -> Any:
    torch = import_torch()
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    kwargs: dict[str, Any] = {"batch_size": batch_size, "num_workers": cfg.num_workers,
                              "pin_memory": cfg.pin_memory, "collate_fn": collate_fn}
    if sampler is not None:
        kwargs["sampler"] = sampler
    elif not iterable:
        kwargs["shuffle"] = True  # the access order of training
    if cfg.num_workers > 0:
        kwargs["prefetch_factor"] = cfg.prefetch_factor or DEFAULT_PREFETCH
        kwargs["persistent_workers"] = cfg.persistent_workers
    return torch.utils.data.DataLoader(dataset, **kwargs)


def measure_point(dataset: Any, cfg: LoaderConfig, *, batch_size: int, window_s: float, collate_fn: Any = None,
                  sampler: Any = None, oversubscribed: bool = False, clock: Clock = time.perf_counter,
                  max_s: float | None = None, caught: list[str] | None = None) -> LoaderPoint:
    """One setting: start-up, then the steady-state rate over about ``window_s`` seconds.

    The window stretches (up to ``max_s`` after the first batch, 3 × ``window_s`` by default)
    until :data:`PER_WORKER` batches per worker are timed. torch's own warnings (its
    oversubscription warning, printed at each ``iter``) go to ``caught``, once each.
    """
    w = max(cfg.num_workers, 1)
    prefilled = cfg.num_workers * (cfg.prefetch_factor or DEFAULT_PREFETCH) if cfg.num_workers else 0
    need = max(MIN_BATCHES, PER_WORKER * w)
    cap = max_s if max_s is not None else 3 * window_s
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = _loader(dataset, cfg, batch_size, collate_fn, sampler)
        t0 = clock()
        it = iter(loader)
        try:
            next(it)
        except StopIteration:
            raise GpuidleError("the dataset gave no batch", "check its length, or lower --batch-size") from None
        first = clock()
        stamps = [first]
        ended = False
        while True:
            elapsed = stamps[-1] - first
            steady = len(stamps) - 1 - prefilled
            if (elapsed >= window_s and steady >= need) or elapsed >= cap:
                break
            try:
                next(it)
            except StopIteration:
                ended = True
                break
            stamps.append(clock())
        del it, loader  # shuts the workers down, outside the timing
    if caught is not None:
        caught.extend(m for m in (str(x.message) for x in seen) if m not in caught)
    rate, n, secs, noise = steady_rate(stamps, prefilled, w)
    return LoaderPoint(cfg, first - t0, n, secs, rate, None if rate is None else rate * batch_size,
                       oversubscribed, ended, noise=noise)


def steady_rate(stamps: Sequence[float], skip: int, rounds_of: int) -> tuple[float | None, int, float, float | None]:
    """``(batches/s, batches, seconds, relative noise)`` from the arrival time of each batch.

    The first ``skip`` batches after the first (prefetched while the workers started) are
    left out when enough remain; the count is a whole number of rounds of ``rounds_of``
    batches. The noise is the standard error of the mean of :data:`CHUNKS` parts' rates,
    relative to the rate; None with fewer than two parts.
    """
    k = min(skip, max(len(stamps) - 1 - MIN_BATCHES, 0))
    n = len(stamps) - 1 - k
    if n >= rounds_of:
        n -= n % rounds_of
    secs = stamps[k + n] - stamps[k] if n > 0 else 0.0
    if n <= 0 or secs <= 0:
        return None, max(n, 0), secs, None
    rate = n / secs
    parts = min(CHUNKS, n // rounds_of)
    noise = None
    if parts >= 2:
        size = (n // rounds_of // parts) * rounds_of
        rates = [size / d for i in range(parts)
                 if (d := stamps[k + (i + 1) * size] - stamps[k + i * size]) > 0]
        if len(rates) >= 2:
            noise = statistics.stdev(rates) / statistics.fmean(rates) / math.sqrt(len(rates))
    return rate, n, secs, noise


def measure_restart(dataset: Any, cfg: LoaderConfig, *, batch_size: int, collate_fn: Any = None,
                    clock: Clock = time.perf_counter) -> tuple[float, float]:
    """``(fresh start, persistent start)``: first batch of epoch 1 and of epoch 2, with persistent workers.

    A subset of a few batches keeps each epoch short; epoch 1 is run to its end so that
    epoch 2 starts as it would in training.
    """
    torch = import_torch()
    per = cfg.num_workers * (cfg.prefetch_factor or DEFAULT_PREFETCH) + MIN_BATCHES
    size = min(len(dataset), per * batch_size)
    subset = torch.utils.data.Subset(dataset, range(size))
    loader = _loader(subset, msgspec.structs.replace(cfg, persistent_workers=True), batch_size, collate_fn, None)
    t0 = clock()
    it = iter(loader)
    next(it)
    fresh = clock() - t0
    for _ in it:
        pass
    t0 = clock()
    it = iter(loader)
    next(it)
    again = clock() - t0
    for _ in it:
        pass
    del it, loader
    return fresh, again
