"""Which DataLoader setting to recommend, and which to try next, from the measured points.

With 0 workers the main process loads in series with the step: a training loop then
runs at ``1 / (load + compute)`` per step, not at the loader's rate. With a target (the
rate the GPU consumes, ``1 / compute time per step``) every setting's step rate is
modelled so (:func:`step_rate`). Two rates are the same within their combined noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuidle.probes.loader_measure import DEFAULT_PREFETCH, LoaderConfig, LoaderPoint

KNEE = 0.95
"""Without a target: the fewest workers within this share of the best rate (or its noise, if larger)."""
NOISE_SIGMAS = 2.0
"""Two rates differ when they are further apart than this many combined standard errors."""
SCALING = 0.75
"""Past the cores the sweep goes on while doubling the workers keeps this share of the rate per worker."""
MAX_WORKERS_PER_CORE = 8


def default_workers(cores: int) -> list[int]:
    """0, 1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    out, w = [0], 1
    while w <= cores:
        out.append(w)
        w *= 2
    if cores not in out:
        out.append(cores)
    return out


def step_rate(batches_per_s: float, workers: int, target: float) -> float:
    """Steps per second of a training loop whose GPU computes ``1 / target`` per step.

    0 workers: the batch is loaded in series with the step, ``1 / (1 / rate + 1 / target)``;
    workers load while the GPU computes, ``min(rate, target)``.
    """
    if workers == 0:
        return 1.0 / (1.0 / batches_per_s + 1.0 / target)
    return min(batches_per_s, target)


def _margin(p: LoaderPoint, q: LoaderPoint | None = None) -> float:
    """Relative margin within which two rates are the same: their combined noise, ``NOISE_SIGMAS`` wide."""
    a, b = p.noise or 0.0, (q.noise or 0.0) if q is not None else 0.0
    return NOISE_SIGMAS * math.hypot(a, b)


def recommend(points: Sequence[LoaderPoint], target: float | None,
              knee: float = KNEE) -> tuple[LoaderPoint | None, bool | None]:
    """The fewest workers that reach ``target`` (batches/s) within noise; without one, within noise of the best.

    With a target, 0 workers is judged by its serial step rate (:func:`step_rate`). Without one,
    the bar is ``knee`` of the best rate or its noise margin, whichever is lower, and 0 workers
    is chosen only when it beats every worker setting beyond noise and ``knee`` (its loading
    would add to each step). Returns ``(point, reaches_target)``; when nothing reaches the target, the one
    with the highest step rate and False.
    """
    ok = [p for p in points if p.batches_per_s is not None and p.error is None]
    if not ok:
        return None, None

    def size(p: LoaderPoint) -> tuple[bool, int, bool, int]:
        c = p.config
        return (p.contended, c.num_workers, c.pin_memory, c.prefetch_factor or 0)

    def rate(p: LoaderPoint) -> float:
        return p.batches_per_s or 0.0

    if target is None:
        workers = [p for p in ok if p.config.num_workers > 0]
        best = max(workers or ok, key=rate)
        serial = [p for p in ok if p.config.num_workers == 0]
        if not workers or (serial and rate(serial[0]) * (1 - _margin(serial[0], best)) * knee > rate(best)):
            return (serial or ok)[0], None
        return min((p for p in workers if rate(p) >= rate(best) * min(knee, 1 - _margin(p, best))), key=size), None

    def steps(p: LoaderPoint) -> float:
        return step_rate(rate(p), p.config.num_workers, target)

    reaching = [p for p in ok if steps(p) * (1 + _margin(p)) >= target]
    if reaching:
        return min(reaching, key=size), True
    return max(ok, key=steps), False


def next_workers(points: Sequence[LoaderPoint], cores: int) -> int | None:
    """Past the cores: double the workers while doubling kept :data:`SCALING` of the rate per worker."""
    measured = sorted((p for p in points if p.batches_per_s and p.error is None and p.config.prefetch_factor
                       in (None, DEFAULT_PREFETCH)), key=lambda p: p.config.num_workers)
    if len(measured) < 2 or measured[-1].config.num_workers == 0:
        return None
    a, b = measured[-2], measured[-1]
    w = b.config.num_workers
    # 0 workers is one loading process: the main one
    per_a, per_b = (a.batches_per_s or 0.0) / max(a.config.num_workers, 1), (b.batches_per_s or 0.0) / w
    if w < cores or 2 * w > MAX_WORKERS_PER_CORE * cores or per_b < SCALING * per_a:
        return None
    return 2 * w


def contended(p: LoaderPoint, before: LoaderPoint | None) -> bool:
    """Oversubscribed and slower per worker than the setting before it, beyond noise and :data:`SCALING`."""
    if not p.oversubscribed or before is None or not p.batches_per_s or not before.batches_per_s:
        return False
    per, per_before = p.batches_per_s / p.config.num_workers, before.batches_per_s / max(before.config.num_workers, 1)
    return per * (1 + _margin(p, before)) < SCALING * per_before


def snippet(cfg: LoaderConfig, batch_size: int) -> str:
    args = [f"batch_size={batch_size}", f"num_workers={cfg.num_workers}", f"pin_memory={cfg.pin_memory}"]
    if cfg.num_workers > 0:
        args += [f"prefetch_factor={cfg.prefetch_factor or DEFAULT_PREFETCH}",
                 f"persistent_workers={cfg.persistent_workers}"]
    return f"DataLoader(dataset, {', '.join(args)})"
