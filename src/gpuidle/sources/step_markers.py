"""The steps a profile marks itself, checked before use and taken in one order for every format.

What the profiler or the framework wrote comes before anything inferred (``docs/numbers.md``, "Where steps
come from"): the profiler's step ranges (``ProfilerStep#N``, ``step_num`` markers), the profile's own ``Steps``
line (XSpace), an inference engine's iteration ranges, ranges named like steps (``train_step 3``, NVTX
``iteration 7``). Each reader lists the candidates its format can hold, in that order; the first sound one is
used, and one that is broken (steps overlapping, zero-length or unterminated) is named in one note and passed
over, never mixed with the next.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from gpuidle.model import I64, HostEvents, HostKind, Steps
from gpuidle.model.arrays import distinct
from gpuidle.model.name_search import found_in

PROFILER_STEP = "profiler_step"
DEVICE_STEPS = "device_steps"
ENGINE_ITERATIONS = "engine_iterations"
NAMED_RANGES = "named_ranges"
NONE = "none"

PROFILER_STEP_NAME = re.compile(r"^ProfilerStep#([0-9]{1,18})$")
"""PyTorch's ``prof.step()`` ranges; step numbers past 18 digits do not fit the model's int64 and are not steps."""
STEP_NAME = re.compile(r"^(?:train(?:ing)?[ _-]?)?(?:step|iteration|iter)\s*[#:_ -]?\s*([0-9]{1,18})$",
                       re.IGNORECASE)
"""A range a user named as a step: ``step 12``, ``train_step#3``, ``iteration 7``."""
ENGINE_ITERATION_NAME = re.compile("|".join(f"^{re.escape(name)}$" for name in (
    "core step: execute_model", "EngineCore.step", "execute_model", "LLMEngine.step", "Scheduler.run_batch",
    "run_batch", "forward_batch_generation")))
"""One iteration of a serving engine's loop: vLLM's engine core and worker (``core step: execute_model``,
``execute_model``), SGLang's scheduler (``run_batch``, ``forward_batch_generation``)."""

OVERLAP_TOLERANCE_NS = 1_000
"""Steps written in whole microseconds may touch by a rounding: an overlap below this is none."""


def none() -> Steps:
    empty = np.zeros(0, dtype=np.int64)
    return Steps(empty, empty.copy(), empty.copy(), NONE)


def numbered_ranges(strings: list[str], host: HostEvents, pattern: re.Pattern[str], source: str,
                    annotations_only: bool = False) -> Steps:
    """Host ranges whose name ``pattern`` numbers (its group 1), one per step number: a step recorded twice
    (two threads) keeps its first range. The names tried: the annotations' (``annotations_only``), else those
    the pattern, which must not match a newline, is found in (all names searched at once: a trace of many
    distinct names pays no Python call per name)."""
    if annotations_only:
        candidates = distinct(host.name[host.kind == HostKind.ANNOTATION]).tolist()
    else:
        candidates = np.flatnonzero(found_in(strings, pattern)).tolist()
    numbers = {i: int(m.group(1)) for i in candidates if (m := pattern.match(strings[i]))}
    if not numbers:
        return none()
    marked = np.isin(host.name, np.fromiter(numbers, dtype=np.int64))
    if annotations_only:
        marked &= host.kind == HostKind.ANNOTATION
    rows = np.flatnonzero(marked)
    rows = rows[np.argsort(host.start[rows], kind="stable")]
    number = np.array([numbers[int(n)] for n in host.name[rows]], dtype=np.int64)
    _, first = np.unique(number, return_index=True)
    keep = rows[np.sort(first)]
    return Steps(np.array([numbers[int(n)] for n in host.name[keep]], dtype=np.int64),
                 host.start[keep].copy(), host.end[keep].copy(), source)


def engine_iterations(strings: list[str], host: HostEvents) -> Steps:
    """A serving engine's iteration ranges, numbered in order: of the engine names, the one recorded most often,
    on the thread that records it most, its outermost ranges (an iteration traced twice, nested, counts once)."""
    ids = np.flatnonzero(found_in(strings, ENGINE_ITERATION_NAME)).tolist()
    if not ids:
        return none()
    rows = np.flatnonzero(np.isin(host.name, ids) & (host.kind != HostKind.PYTHON))
    if rows.size == 0:
        return none()
    names, counts = np.unique(host.name[rows], return_counts=True)
    rows = rows[host.name[rows] == names[np.argmax(counts)]]
    threads, counts = np.unique(host.thread[rows], return_counts=True)
    rows = rows[host.thread[rows] == threads[np.argmax(counts)]]
    rows = rows[np.lexsort((-host.end[rows], host.start[rows]))]
    reach = np.maximum.accumulate(host.end[rows])
    top = np.ones(rows.size, dtype=bool)
    top[1:] = host.start[rows][1:] >= reach[:-1]
    rows = rows[top]
    return Steps(np.arange(rows.size, dtype=np.int64), host.start[rows].copy(), host.end[rows].copy(),
                 ENGINE_ITERATIONS)


def merged_spans(number: I64, start: I64, end: I64, source: str) -> Steps:
    """One range per step number from several pieces (a ``Steps`` line per device, a step split by another's
    events): from its first piece's start to its last piece's end, in order of start."""
    if number.size == 0:
        return none()
    steps, inverse = np.unique(number, return_inverse=True)
    first = np.full(steps.size, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(steps.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, inverse, start)
    np.maximum.at(last, inverse, end)
    order = np.argsort(first, kind="stable")
    return Steps(steps[order].astype(np.int64), first[order], last[order], source)


def problem(steps: Steps) -> str | None:
    """Why these markers cannot be the steps, or None: a zero-length or unterminated step, or a step that starts
    before the one before it has ended (markers that overlap give no step a window of its own)."""
    dur = steps.end - steps.start
    if (dur < 0).any():
        return f"{int((dur < 0).sum())} unterminated (step {int(steps.number[np.argmax(dur < 0)])} has no end)"
    if (dur == 0).any():
        return f"{int((dur == 0).sum())} of zero length (first: step {int(steps.number[np.argmax(dur == 0)])})"
    overlap = steps.start[1:] < steps.end[:-1] - OVERLAP_TOLERANCE_NS
    if overlap.any():
        i = int(np.argmax(overlap))
        return (f"{int(overlap.sum())} overlapping (step {int(steps.number[i + 1])} starts "
                f"{(steps.end[i] - steps.start[i + 1]) / 1e6:.3f} ms before step {int(steps.number[i])} ends)")
    return None


SOURCE_NAMES = {
    PROFILER_STEP: "the profiler's step markers",
    DEVICE_STEPS: "the profile's Steps line",
    ENGINE_ITERATIONS: "the engine's iteration ranges",
    NAMED_RANGES: "the ranges named like steps",
}


def first_sound(candidates: Iterable[Steps], notes: list[str]) -> Steps:
    """The first candidate with steps and no :func:`problem`; each broken one passed over gets one note."""
    for steps in candidates:
        if len(steps) == 0:
            continue
        why = problem(steps)
        if why is None:
            return steps
        notes.append(f"{len(steps)} steps from {SOURCE_NAMES.get(steps.source, steps.source)} not used, broken: "
                     f"{why}")
    return none()
