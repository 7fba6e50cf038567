"""The words of a report from the host side alone (a trace that lost every device record), shared by the renderers.

No device figure is printed: the trace has none. Each line says what the host's launching threads did, from
:class:`~gpuidle.model.HostSide`; the shares are of the host's window.
"""

from __future__ import annotations

from gpuidle.model import HOST_ACTIVITIES, HostSide, ranges
from gpuidle.report.common import MANY_STEPS, STEP_SOURCE_WORDS, ms, pct

ACTIVITY_WORDS = {
    "operators": "framework operators",
    "launch": "launch calls",
    "sync": "waits on the device (synchronize, .item())",
    "copy": "copy calls",
    "data_loading": "data loading",
    "collective": "collective calls",
}
"""Each of :data:`~gpuidle.model.HOST_ACTIVITIES` as a report names it..."""
ACTIVITY_COLUMNS = {"operators": "operators", "launch": "launch calls", "sync": "syncs", "copy": "copy calls",
                    "data_loading": "data loading", "collective": "collectives"}
"""...and as a column of the step table names it."""
ACTIVITY_HEAD = "the host's launching threads were inside (these nest: a launch inside an operator counts in both)"
NO_FIXES = "No fixes: each rests on the device's timing, which this trace lost."
NO_DEVICE = "no utilization and no idle by cause: the trace holds no device activity"


def head(h: HostSide) -> str:
    """``rank 0 · host side only: 104 kernel launches with no kernel record``."""
    return f"rank {h.rank} · host side only: {h.lost_launches} kernel launches with no kernel record"


def window_words(h: HostSide, sep: str = " · ") -> str:
    """``4 step(s) · 77.57 ms of host time · steps from the profiler's step markers · 2 launching threads``."""
    source = STEP_SOURCE_WORDS.get(h.step_source, h.step_source) if h.steps else \
        "no step markers: the window is the launching threads' first to last event"
    threads = f"{h.threads} launching thread{'s' if h.threads != 1 else ''}"
    return sep.join([f"{len(h.steps)} step(s)", f"{ms(h.dur_s)} of host time", source, threads])


def shown(h: HostSide) -> list[str]:
    """The activities the host spent any time in, in :data:`~gpuidle.model.HOST_ACTIVITIES` order."""
    return [a for a in HOST_ACTIVITIES if h.activity_s.get(a, 0.0) > 0]


def activity_rows(h: HostSide) -> list[tuple[str, str, str]]:
    """``(what, time, of window)`` per activity the host spent time in."""
    return [(ACTIVITY_WORDS[a], ms(h.activity_s[a]), pct(h.activity_s[a] / h.dur_s if h.dur_s else 0.0))
            for a in shown(h)]


def step_header(h: HostSide) -> list[str]:
    return ["step", "duration", "launches", *(ACTIVITY_COLUMNS[a] for a in shown(h))]


def step_rows(h: HostSide) -> list[list[str]]:
    """One row per step (the longest ones where there are many): its duration, launches and activities."""
    steps = h.steps if len(h.steps) <= MANY_STEPS else sorted(h.steps, key=lambda s: -s.dur_s)[:5]
    rows = [[str(s.step), ms(s.dur_s), str(s.launches), *(ms(s.activity_s[a]) for a in shown(h))] for s in steps]
    if len(h.steps) > MANY_STEPS:
        durs = sorted(s.dur_s for s in h.steps)
        rows.append([f"({len(h.steps) - 5} more)", f"median {ms(durs[len(durs) // 2])}"] + [""] * (len(shown(h)) + 1))
    return rows


def call_rows(h: HostSide) -> list[tuple[str, str, str, str]]:
    """``(operator, calls, time, of window)`` for the operators with the most time."""
    return [(c.name, str(c.count), ms(c.total_s), pct(c.share)) for c in h.top_calls]


def lost_ranks_line(lost: list[HostSide]) -> str | None:
    """In a job whose other ranks were analysed: which ranks are reported from their host side alone."""
    if not lost:
        return None
    ranks = sorted(h.rank for h in lost)
    several = len(ranks) > 1
    return (f"rank{'s' if several else ''} {ranges(ranks)}: device records lost, in no figure of the job "
            f"({'their' if several else 'its'} host side is in the JSON report)")
