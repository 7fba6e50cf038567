"""Formatting shared by the renderers: units, shares, step summaries. No new numbers."""

from __future__ import annotations

from dataclasses import dataclass

from gpuidle.model import RankReport

TARGET_UTILIZATION = 0.9
MANY_STEPS = 12
"""Above this many steps, the step table shows the slowest ones and a summary."""


@dataclass(frozen=True, slots=True)
class RenderOptions:
    top: int = 3
    """How many recommendations to show."""
    color: bool = False
    width: int = 110


def ms(seconds: float) -> str:
    v = seconds * 1e3
    if abs(v) >= 100:
        return f"{v:,.1f} ms"
    if abs(v) >= 1:
        return f"{v:.2f} ms"
    return f"{v * 1e3:.1f} µs"


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
