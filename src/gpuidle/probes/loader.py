"""``tune loader``: sweep DataLoader settings on the user's own Dataset, recommend the smallest that keeps up.

Every setting is measured the same way: ``iter(loader)`` to the first batch is the
start-up (worker processes, the first fetch), reported apart; the batches the workers
prefetched meanwhile (``num_workers × prefetch_factor``) are drained untimed; the
steady-state rate is taken over at least :data:`PER_WORKER` batches per worker after
them (a whole number of rounds: workers deliver in rounds, so a count cut mid-round reads
high), at the consumer as a training loop sees them. The timed batches are split into
:data:`CHUNKS` parts; the spread of their rates gives the noise of the rate (its relative
standard error).

With 0 workers the main process loads in series with the step: a training loop then
runs at ``1 / (load + compute)`` per step, not at the loader's rate. With a target (the
rate the GPU consumes, ``1 / compute time per step``) every setting's step rate is
modelled so (:func:`step_rate`): 0 workers ``1 / (1 / rate + 1 / target)``, workers
``min(rate, target)``. The recommendation is the fewest workers whose step rate reaches
the target, within noise; without a target, the fewest workers within noise (at least
5 %) of the best rate, 0 workers only when every worker setting is slower.

``num_workers`` is swept 0, 1, 2, 4, … up to the usable cores, and on past them while
the rate per worker still holds (an I/O-bound dataset: sleeping workers leave the CPU
free); a setting is marked *contended* only when its rate per worker falls against the
one before it with more processes than cores. Then ``prefetch_factor`` 4, ``pin_memory``
(with a GPU only) and ``persistent_workers`` are tried on the winner, while the budget
lasts: nothing starts once it is spent.
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

from gpuidle.errors import GpuidleError
from gpuidle.model import AnalysisReport
from gpuidle.model.cores import usable_cores
from gpuidle.probes.common import import_torch
from gpuidle.probes.loader_choice import contended, default_workers, next_workers, recommend, snippet, step_rate
from gpuidle.probes.loader_measure import (
    DEFAULT_PREFETCH,
    Clock,
    LoaderConfig,
    LoaderPoint,
    measure_point,
    measure_restart,
)

SCHEMA = "gpuidle.bench.loader/1"
MIN_WINDOW_S = 0.25
PERSISTENT_HELPS = 0.5
"""persistent_workers is recommended when its epoch start takes under half a fresh start."""

Progress = Callable[[str, int, int], None]


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


def tune_loader(dataset: Any, *, batch_size: int, budget_s: float = 60.0, target_batches_per_s: float | None = None,
                target_source: str | None = None, workers: Sequence[int] | None = None, local_ranks: int = 1,
                cores: int | None = None, variants: bool = True, collate_fn: Any = None, sampler: Any = None,
                dataset_name: str = "", progress: Progress | None = None,
                clock: Clock = time.perf_counter) -> LoaderResult:
    """Sweep, measure, recommend. ``budget_s`` is shared out over the settings as they run; none starts after it."""
    torch = import_torch()
    if batch_size < 1 or budget_s <= 0 or local_ranks < 1:
        raise GpuidleError("--batch-size, --budget-s and --local-ranks must be positive")
    cores = cores or usable_cores()
    given = workers is not None
    sweep = sorted(set(workers)) if workers is not None else default_workers(cores)
    if not sweep or sweep[0] < 0:
        raise GpuidleError("worker counts must be 0 or more")
    cuda = bool(torch.cuda.is_available())
    # room for up to three doublings past the cores; unused, it goes to the settings after
    planned = len(sweep) + (3 if variants else 0) + (0 if given else 3)
    start = clock()
    points: list[LoaderPoint] = []
    warns: list[str] = []
    notes: list[str] = []
    caught: list[str] = []
    skipped: list[str] = []

    def left_s() -> float:
        return budget_s - (clock() - start)

    def run(cfg: LoaderConfig) -> LoaderPoint | None:
        # the start-up is not part of the window: guess it from the last point with as many workers
        startup = next((p.startup_s for p in reversed(points) if p.config.num_workers == cfg.num_workers), 0.0)
        if points and left_s() < startup + MIN_WINDOW_S:
            skipped.append(_cfg_text(cfg))
            return None
        left = max(planned - len(points), 1)
        slice_s = max(left_s() / left, MIN_WINDOW_S)
        over = cfg.num_workers * local_ranks > cores
        window = max(slice_s - startup, MIN_WINDOW_S)
        try:
            p = measure_point(dataset, cfg, batch_size=batch_size, window_s=window, collate_fn=collate_fn,
                              sampler=sampler, oversubscribed=over, clock=clock,
                              max_s=max(min(3 * window, left_s() - startup), window), caught=caught)
        except GpuidleError:
            raise
        except Exception as err:
            if cfg.num_workers == 0:
                raise GpuidleError(f"the dataset failed in the main process: {type(err).__name__}: {err}") from None
            p = LoaderPoint(cfg, 0.0, 0, 0.0, None, None, over, error=f"{type(err).__name__}: {err}")
        before = next((q for q in reversed(points) if q.config.prefetch_factor == p.config.prefetch_factor
                       and q.config.num_workers < p.config.num_workers and q.batches_per_s), None)
        p.contended = contended(p, before)
        if target_batches_per_s is not None and p.batches_per_s:
            p.step_per_s = step_rate(p.batches_per_s, cfg.num_workers, target_batches_per_s)
        points.append(p)
        if progress is not None:
            progress(f"num_workers={cfg.num_workers}", len(points), planned)
        return p

    for w in sweep:
        run(LoaderConfig(w, prefetch_factor=DEFAULT_PREFETCH if w else None))
    more = None if given else next_workers(points, cores)
    while more is not None and left_s() > 0:
        run(LoaderConfig(more, prefetch_factor=DEFAULT_PREFETCH))
        more = next_workers(points, cores)
    swept = [p.config.num_workers for p in points]
    if not given and swept and swept[-1] > cores:
        notes.append(f"swept past the {cores} cores to {swept[-1]} workers: the rate per worker still held "
                     "(the items wait on I/O or sleep, not on the CPU)")
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
            if left_s() > 2 * best.startup_s:
                fresh, again = measure_restart(dataset, base, batch_size=batch_size, collate_fn=collate_fn,
                                               clock=clock)
                persistent = PersistentCheck(base.num_workers, fresh, again, again < PERSISTENT_HELPS * fresh)
            else:
                skipped.append("persistent_workers")
    if skipped:
        notes.append(f"the {budget_s:g} s budget was spent: not measured: {', '.join(skipped)} (raise --budget-s)")
    chosen, reaches = recommend(points, target_batches_per_s)
    rec = None
    if chosen is not None:
        rec = msgspec.structs.replace(chosen.config, pin_memory=chosen.config.pin_memory or cuda,
                                      persistent_workers=bool(persistent and persistent.helps
                                                              and persistent.num_workers == chosen.config.num_workers))
        n = rec.num_workers * local_ranks
        if chosen.contended:
            warns.append(f"{rec.num_workers} workers × {local_ranks} local ranks = {n} processes on {cores} cores: "
                         "the rate per worker fell here, the workers contend for the cores")
        elif n > cores and local_ranks > 1:
            notes.append(f"{n} worker processes over {local_ranks} local ranks on {cores} cores: measured for one "
                         "rank; the other ranks' workers share the same cores")
        if reaches is False:
            warns.append(f"no setting reaches {target_batches_per_s:.3g} batches/s; the best step rate is "
                         f"{chosen.step_per_s or chosen.batches_per_s or 0:.3g}: the per-item work itself is too "
                         "slow (decode/augment on the GPU, cache preprocessed data, or faster storage)")
        if rec.num_workers == 0 and target_batches_per_s is None and chosen.batches_per_s:
            notes.append(f"with 0 workers each step also waits {1e3 / chosen.batches_per_s:.1f} ms for its batch "
                         "(loading runs in series with compute)")
    hot = sorted({p.config.num_workers for p in points if p.contended})
    if hot:
        notes.append(f"num_workers {hot}: the rate per worker fell with more processes than the {cores} cores")
    if caught:
        notes.append(f"torch warned ({len(caught)} kind(s), said once here): {caught[0]}"
                     + (" — the measured rates above say whether the setting really slows down" if hot or
                        any(p.oversubscribed for p in points) else ""))
    if any(p.epoch_ended for p in points):
        notes.append("the dataset ran out within a measurement: its rates rest on few batches")
    return LoaderResult(
        dataset=dataset_name or type(dataset).__name__, dataset_len=_len(dataset), batch_size=batch_size,
        cores=cores, local_ranks=local_ranks, cuda=cuda, budget_s=budget_s, elapsed_s=clock() - start,
        target_batches_per_s=target_batches_per_s, target_source=target_source, points=points,
        persistent=persistent, recommended=rec, recommended_batches_per_s=chosen.batches_per_s if chosen else None,
        reaches_target=reaches, snippet=snippet(rec, batch_size) if rec else None, warnings=warns, notes=notes)


def _cfg_text(cfg: LoaderConfig) -> str:
    bits = [f"num_workers={cfg.num_workers}"]
    if cfg.prefetch_factor not in (None, DEFAULT_PREFETCH):
        bits.append(f"prefetch_factor={cfg.prefetch_factor}")
    if cfg.pin_memory:
        bits.append("pin_memory=True")
    return " ".join(bits)


def _len(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None
