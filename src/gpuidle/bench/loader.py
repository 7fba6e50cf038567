"""``tune loader``: sweep DataLoader settings on the user's own Dataset, recommend the smallest that keeps up.

Every setting is measured the same way: ``iter(loader)`` to the first batch is the
start-up (worker processes, the first fetch), reported apart; the batches the workers
prefetched meanwhile (``num_workers × prefetch_factor``) are drained untimed; the
steady-state rate is the number of batches after them over the time they took, taken
at the consumer as a training loop sees them. The consumer does no work of its own, so
the rate is the most the loader can deliver.

``num_workers`` is swept from 0 to the usable cores, then ``prefetch_factor`` 4,
``pin_memory`` (with a GPU only) and ``persistent_workers`` (its epoch start, on a
small subset, against a fresh start) are tried on the winner. The recommendation is
the fewest workers that reach the rate the GPU consumes (``1 / compute time per
step``), or without a target the fewest within 5 % of the best rate; settings with
``workers × local ranks > cores`` come last, as they oversubscribe the CPUs.
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gpuidle.bench.common import import_torch, usable_cores
from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport

SCHEMA = "gpuidle.bench.loader/1"
KNEE = 0.95
"""Without a target: the fewest workers within this share of the best rate."""
MIN_WINDOW_S = 0.25
MIN_BATCHES = 3
"""Steady-state batches needed for a rate; the window stretches (up to 3×) to get them."""
DEFAULT_PREFETCH = 2
PERSISTENT_HELPS = 0.5
"""persistent_workers is recommended when its epoch start takes under half a fresh start."""

Progress = Callable[[str, int, int], None]
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
    """``num_workers × local ranks > cores``."""
    epoch_ended: bool = False
    error: str | None = None


class PersistentCheck(msgspec.Struct):
    num_workers: int
    fresh_start_s: float
    """First batch of an epoch with new worker processes."""
    persistent_start_s: float
    """First batch of the second epoch with ``persistent_workers=True``."""
    helps: bool


class LoaderResult(msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    dataset: str
    dataset_len: int | None
    batch_size: int
    cores: int
    local_ranks: int
    cuda: bool
    budget_s: float
    elapsed_s: float
    target_batches_per_s: float | None
    target_source: str | None
    points: list[LoaderPoint]
    persistent: PersistentCheck | None = None
    recommended: LoaderConfig | None = None
    recommended_batches_per_s: float | None = None
    reaches_target: bool | None = None
    snippet: str | None = None
    warnings: list[str] = []
    notes: list[str] = []


def load_object(spec: str, what: str = "object") -> Any:
    """``package.module:name`` (name may be dotted), imported with the current folder on the path."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise GpuidleError(f"{what} {spec!r} is not module:name", "e.g. --dataset mypkg.data:make_dataset")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise GpuidleError(f"cannot import {module_name!r} for the {what}: {err}",
                           "run from the folder that holds the package, or pip install it") from None
    except Exception as err:
        raise GpuidleError(f"importing {module_name!r} raised {type(err).__name__}: {err}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise GpuidleError(f"{module_name!r} has no {attr!r} for the {what}") from None
    return obj


def make_dataset(spec: str) -> Any:
    """The Dataset a ``module:function`` factory returns (or the Dataset object named directly)."""
    obj = load_object(spec, "dataset")
    if not _is_dataset(obj) and callable(obj):
        try:
            obj = obj()
        except Exception as err:
            raise GpuidleError(f"the dataset factory {spec} raised {type(err).__name__}: {err}") from None
    if not _is_dataset(obj):
        raise GpuidleError(f"{spec} gave a {type(obj).__name__}, not a Dataset",
                           "point at a function that returns a torch.utils.data.Dataset")
    return obj


def _is_dataset(obj: Any) -> bool:
    return not isinstance(obj, type) and (hasattr(obj, "__getitem__") or hasattr(obj, "__iter__"))


def target_from_report(report: AnalysisReport) -> float:
    """Batches per second the GPU consumes: 1 / the median compute (busy) time per step over all ranks."""
    busy = [s.busy_s for r in report.ranks for s in r.steps if s.busy_s > 0]
    if not busy:
        raise GpuidleError("the report has no steps with compute time",
                           "give --target-batches-per-s, or a report of a trace with profiler steps")
    return 1.0 / statistics.median(busy)


def default_workers(cores: int) -> list[int]:
    """0, 1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    out, w = [0], 1
    while w <= cores:
        out.append(w)
        w *= 2
    if cores not in out:
        out.append(cores)
    return out


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
                  sampler: Any = None, oversubscribed: bool = False, clock: Clock = time.perf_counter) -> LoaderPoint:
    """One setting: start-up, then the steady-state rate over about ``window_s`` seconds."""
    loader = _loader(dataset, cfg, batch_size, collate_fn, sampler)
    prefilled = cfg.num_workers * (cfg.prefetch_factor or DEFAULT_PREFETCH) if cfg.num_workers else 0
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
        if elapsed >= window_s and (steady >= MIN_BATCHES or elapsed >= 3 * window_s):
            break
        try:
            next(it)
        except StopIteration:
            ended = True
            break
        stamps.append(clock())
    del it, loader  # shuts the workers down, outside the timing
    k = min(prefilled, max(len(stamps) - 1 - MIN_BATCHES, 0))
    n, secs = len(stamps) - 1 - k, stamps[-1] - stamps[k]
    rate = n / secs if n > 0 and secs > 0 else None
    return LoaderPoint(cfg, first - t0, n, secs, rate, None if rate is None else rate * batch_size,
                       oversubscribed, ended)


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


def recommend(points: Sequence[LoaderPoint], target: float | None,
              knee: float = KNEE) -> tuple[LoaderPoint | None, bool | None]:
    """The smallest setting that reaches ``target`` (batches/s); without one, within ``knee`` of the best.

    Returns ``(point, reaches_target)``; when nothing reaches the target, the fastest point and False.
    """
    ok = [p for p in points if p.batches_per_s is not None and p.error is None]
    if not ok:
        return None, None

    def size(p: LoaderPoint) -> tuple[bool, int, bool, int]:
        c = p.config
        return (p.oversubscribed, c.num_workers, c.pin_memory, c.prefetch_factor or 0)

    best = max(ok, key=lambda p: p.batches_per_s or 0.0)
    if target is None:
        bar = knee * (best.batches_per_s or 0.0)
        return min((p for p in ok if (p.batches_per_s or 0.0) >= bar), key=size), None
    reaching = [p for p in ok if (p.batches_per_s or 0.0) >= target]
    if reaching:
        return min(reaching, key=size), True
    return best, False


def snippet(cfg: LoaderConfig, batch_size: int) -> str:
    args = [f"batch_size={batch_size}", f"num_workers={cfg.num_workers}", f"pin_memory={cfg.pin_memory}"]
    if cfg.num_workers > 0:
        args += [f"prefetch_factor={cfg.prefetch_factor or DEFAULT_PREFETCH}",
                 f"persistent_workers={cfg.persistent_workers}"]
    return f"DataLoader(dataset, {', '.join(args)})"


def tune_loader(dataset: Any, *, batch_size: int, budget_s: float = 60.0, target_batches_per_s: float | None = None,
                target_source: str | None = None, workers: Sequence[int] | None = None, local_ranks: int = 1,
                cores: int | None = None, variants: bool = True, collate_fn: Any = None, sampler: Any = None,
                dataset_name: str = "", progress: Progress | None = None,
                clock: Clock = time.perf_counter) -> LoaderResult:
    """Sweep, measure, recommend. ``budget_s`` is shared out over the settings as they run."""
    torch = import_torch()
    if batch_size < 1 or budget_s <= 0 or local_ranks < 1:
        raise GpuidleError("--batch-size, --budget-s and --local-ranks must be positive")
    cores = cores or usable_cores()
    sweep = sorted(set(workers)) if workers is not None else default_workers(cores)
    if not sweep or sweep[0] < 0:
        raise GpuidleError("worker counts must be 0 or more")
    cuda = bool(torch.cuda.is_available())
    planned = len(sweep) + (3 if variants else 0)
    start = clock()
    points: list[LoaderPoint] = []
    warnings: list[str] = []
    notes: list[str] = []

    def run(cfg: LoaderConfig) -> LoaderPoint:
        left = max(planned - len(points), 1)
        slice_s = max((budget_s - (clock() - start)) / left, MIN_WINDOW_S)
        # the start-up is not part of the window: guess it from the last point with as many workers
        startup = next((p.startup_s for p in reversed(points) if p.config.num_workers == cfg.num_workers), 0.0)
        over = cfg.num_workers * local_ranks > cores
        try:
            p = measure_point(dataset, cfg, batch_size=batch_size, window_s=max(slice_s - startup, MIN_WINDOW_S),
                              collate_fn=collate_fn, sampler=sampler, oversubscribed=over, clock=clock)
        except GpuidleError:
            raise
        except Exception as err:
            if cfg.num_workers == 0:
                raise GpuidleError(f"the dataset failed in the main process: {type(err).__name__}: {err}") from None
            p = LoaderPoint(cfg, 0.0, 0, 0.0, None, None, over, error=f"{type(err).__name__}: {err}")
        points.append(p)
        if progress is not None:
            progress(f"num_workers={cfg.num_workers}", len(points), planned)
        return p

    for w in sweep:
        run(LoaderConfig(w, prefetch_factor=DEFAULT_PREFETCH if w else None))
    best, _ = recommend(points, target_batches_per_s)
    persistent = None
    if variants and best is not None and best.config.num_workers > 0:
        base = best.config
        run(msgspec.structs.replace(base, prefetch_factor=2 * DEFAULT_PREFETCH))
        if cuda:
            run(msgspec.structs.replace(base, pin_memory=True))
        else:
            notes.append("no GPU here: pin_memory not measured (it matters only for copies to a GPU)")
        if hasattr(dataset, "__len__") and not isinstance(dataset, torch.utils.data.IterableDataset):
            fresh, again = measure_restart(dataset, base, batch_size=batch_size, collate_fn=collate_fn, clock=clock)
            persistent = PersistentCheck(base.num_workers, fresh, again, again < PERSISTENT_HELPS * fresh)
    chosen, reaches = recommend(points, target_batches_per_s)
    rec = None
    if chosen is not None:
        rec = msgspec.structs.replace(chosen.config, pin_memory=chosen.config.pin_memory or cuda,
                                      persistent_workers=bool(persistent and persistent.helps
                                                              and persistent.num_workers == chosen.config.num_workers))
        if rec.num_workers * local_ranks > cores:
            warnings.append(f"{rec.num_workers} workers × {local_ranks} local ranks = "
                            f"{rec.num_workers * local_ranks} processes on {cores} cores: oversubscribed; "
                            "the workers of the ranks will slow each other down")
        if reaches is False:
            warnings.append(f"no setting reaches {target_batches_per_s:.3g} batches/s; the best is "
                            f"{chosen.batches_per_s:.3g}: the per-item work itself is too slow "
                            "(decode/augment on the GPU, cache preprocessed data, or faster storage)")
    over = [p.config.num_workers for p in points if p.oversubscribed and p.config.prefetch_factor in (None, 2)]
    if over:
        notes.append(f"num_workers {sorted(set(over))} oversubscribe {cores} cores with {local_ranks} local rank(s)")
    if any(p.epoch_ended for p in points):
        notes.append("the dataset ran out within a measurement: its rates rest on few batches")
    return LoaderResult(
        dataset=dataset_name or type(dataset).__name__, dataset_len=_len(dataset), batch_size=batch_size,
        cores=cores, local_ranks=local_ranks, cuda=cuda, budget_s=budget_s, elapsed_s=clock() - start,
        target_batches_per_s=target_batches_per_s, target_source=target_source, points=points,
        persistent=persistent, recommended=rec, recommended_batches_per_s=chosen.batches_per_s if chosen else None,
        reaches_target=reaches, snippet=snippet(rec, batch_size) if rec else None, warnings=warnings, notes=notes)


def _len(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None
