"""Formatting shared by the renderers: units, shares, step summaries. No new numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from gpuidle.model import Combined, Gain, RankReport, Recommendation, Source, duration
from gpuidle.report.text import printable

T = TypeVar("T")

TARGET_UTILIZATION = 0.9
MANY_STEPS = 12
"""Above this many steps, the step table shows the slowest ones and a summary."""


@dataclass(frozen=True, slots=True)
class RenderOptions:
    top: int = 3
    """How many recommendations to show."""
    color: bool = False
    width: int = 110


FRAMEWORK_NAMES = {"pytorch": "PyTorch", "cuda": "CUDA application"}


def source_label(source: Source) -> str:
    """The input's format, and the program's framework where the input tells (``nsys · CUDA application``)."""
    if not source.framework:
        return source.format
    return f"{source.format} · {FRAMEWORK_NAMES.get(source.framework, source.framework)}"


ms = duration
"""The one duration formatter (``1.52 ms``, ``812.4 µs``), shared with the probes' own reasons."""


def pct(share: float, digits: int = 1) -> str:
    return f"{share * 100:.{digits}f} %"


def ranges(xs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    for x in sorted(xs):
        if out and x == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ", ".join(out)


def step_rows(r: RankReport) -> list[tuple[str, str, str, str, str]]:
    """Rows ``(step, duration, busy %, idle, top cause)``; the slowest steps when there are many."""
    steps = r.steps
    shown = steps if len(steps) <= MANY_STEPS else sorted(steps, key=lambda s: -s.dur_s)[:5]
    rows = []
    for s in shown:
        top = max(s.idle_by_cause_s.items(), key=lambda kv: kv[1])
        rows.append((str(s.step), ms(s.dur_s), pct(s.busy_s / s.dur_s if s.dur_s else 0.0), ms(s.idle_s),
                     top[0] if top[1] > 0 else "-"))
    if len(steps) > MANY_STEPS:
        durs = sorted(s.dur_s for s in steps)
        rows.append((f"({len(steps) - 5} more)", f"median {ms(durs[len(durs) // 2])}", "", "", ""))
    return rows


DEFAULT_OPTIONS = RenderOptions()


def utilization_falls(g: Gain) -> bool:
    """A fix that shortens the step but leaves the idle: utilization after is lower, not a gain."""
    return g.utilization_after is not None and g.utilization_before is not None \
        and g.utilization_after < g.utilization_before


def gain_text(rec: Recommendation) -> str:
    """The gain in words: step time first, utilization after with its reason when it falls."""
    g = rec.gain
    if g.step_s_saved is None:
        return f"gain not estimable: {g.reason}" if g.reason else "gain not estimable"
    if rec.alternative_to is not None:
        return f"alternative to {rec.alternative_to}: the same idle, saves {ms(g.step_s_saved)}/step on its own"
    if g.after is not None and g.step_s_saved_after is not None:
        return f"saves {ms(g.step_s_saved)}/step now; {g.reason}: saves {ms(g.step_s_saved_after)}/step after it"
    text = f"saves {ms(g.step_s_saved)}/step"
    if g.step_s_before is not None and g.step_s_after is not None:
        text += f" ({ms(g.step_s_before)} → {ms(g.step_s_after)}/step"
        text += f", ×{g.speedup:.2f} samples/s)" if g.speedup is not None else ")"
    if g.utilization_after is not None:
        text += f" → utilization {pct(g.utilization_after)}"
        if utilization_falls(g) and g.reason:
            text += f" ({g.reason})"
    return text


def combined_text(c: Combined) -> str:
    """Every fix that is not an alternative, applied together: the plan's step time and what limits it then."""
    return (f"all {len(c.fixes)} fixes together: {ms(c.step_s_before)} → {ms(c.step_s_after)}/step "
            f"(saves {ms(c.step_s_saved)}), utilization {pct(c.utilization_after)}; then {c.limit}")


def shown_recommendations(recs: list[Recommendation], top: int) -> list[Recommendation]:
    """The top list: fixes that are not alternatives and not below 0.5 % of a step; alternatives follow theirs."""
    heads = [r for r in recs if r.alternative_to is None and not r.gain.minor][:top]
    ids = {r.id for r in heads}
    return [r for r in recs if r.id in ids or (r.alternative_to in ids)]


def excluded_lines(r: RankReport, kept: bool = False) -> list[str]:
    """``step 0, 4,489 ms: warm-up, left out`` for every step outside steady state."""
    words = {"warmup": "warm-up", "profiler": "profiler start/stop", "outlier": "outlier"}
    how = "kept (--include-warmup)" if kept else "left out of per-step figures and gains"
    return [f"step {s.step}, {ms(s.dur_s)}: {words.get(s.excluded, s.excluded)}, {how}"
            for s in r.steps if s.excluded is not None]


def printable_report(report: T) -> T:
    """A copy of a report (msgspec structs, lists, dicts) with :func:`~gpuidle.report.text.printable` applied
    to every string, for the renderers of text: no name from an input reaches the terminal raw.

    Line breaks stay: fixes and notes are several lines by design.
    """
    clean: T = _printable(report)
    return clean


def _printable(x: Any) -> Any:
    if isinstance(x, str):
        return printable(x, keep_newlines=True)
    if isinstance(x, msgspec.Struct):
        return msgspec.structs.replace(x, **{f: _printable(getattr(x, f)) for f in x.__struct_fields__})
    if isinstance(x, list | tuple):
        return type(x)(_printable(v) for v in x)
    if isinstance(x, dict):
        return {_printable(k): _printable(v) for k, v in x.items()}
    return x
