"""How a duration and a set of numbers read, the same in every report and in the reasons the probes write.

Here rather than in ``report/`` because the probes (``probes/``) write reasons such as
"latency 1.52 ms is over the guide's 1 ms" into their results, and producers may not
import ``report/``.
"""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``812.4 µs``, ``1.52 ms``, ``4,489.0 ms``: three significant figures or more, never ``1.52e+03 µs``."""
    v = seconds * 1e3
    if abs(v) >= 100:
        return f"{v:,.1f} ms"
    if abs(v) >= 1:
        return f"{v:.2f} ms"
    return f"{v * 1e3:.1f} µs"


def ranges(xs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``: as long as the runs, not the numbers."""
    out: list[str] = []
    first = last = None
    for x in sorted(set(xs)):
        if last is not None and x == last + 1:
            last = x
            continue
        if first is not None:
            out.append(str(first) if first == last else f"{first}-{last}")
        first = last = x
    if first is not None:
        out.append(str(first) if first == last else f"{first}-{last}")
    return ", ".join(out)
