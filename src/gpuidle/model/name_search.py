"""A pattern searched in many names at once: the names joined, one search over the text, not one per name.

A trace of hundreds of thousands of distinct kernel names (every shape its own kernel) cost a Python call and a
search per name and per pattern; joined by newlines, the names are searched by ``re`` in C in one pass. This
holds for patterns that cannot match a newline (no ``\\s`` or negated class; ``.`` never does: a match stays
inside one name), whose ``^`` then anchors at each name's start (MULTILINE); names holding a newline themselves
are searched one by one. A pattern anchored at the start in every alternative is searched name by name all the
same: there ``re`` tries the first character of each name only, where in the joined text it would try every
character.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt


@lru_cache(maxsize=64)
def _per_line(pattern: re.Pattern[str]) -> re.Pattern[str]:
    return re.compile(pattern.pattern, pattern.flags | re.MULTILINE)


def _joined(names: Sequence[str]) -> str | None:
    """The names joined by newlines; None where a name holds one (the lines would not be the names)."""
    text = "\n".join(names)
    return text if text.count("\n") == len(names) - 1 else None


@lru_cache(maxsize=256)
def anchored(pattern: re.Pattern[str]) -> bool:
    """Whether every top-level alternative of the pattern starts with ``^`` (then searched name by name: this
    decides the speed only, never the result)."""
    text, depth, klass, i, starts = pattern.pattern, 0, False, 0, [0]
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 1
        elif klass:
            klass = c != "]"
        elif c == "[":  # a class: its "^" and a "]" first in it are members, not its end
            i += 1 + text.startswith("^", i + 1)
            i += text.startswith("]", i)
            klass = True
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            starts.append(i + 1)
        i += 1
    return all(text.startswith("^", at) for at in starts)


def found_in(names: Sequence[str], pattern: re.Pattern[str]) -> npt.NDArray[np.bool_]:
    """``[bool(pattern.search(n)) for n in names]``, for a pattern that cannot match a newline."""
    text = _joined(names) if names and not anchored(pattern) else None
    if text is None:
        return np.fromiter((pattern.search(n) is not None for n in names), bool, len(names))
    line_starts = np.zeros(len(names), np.int64)
    np.cumsum(np.fromiter(map(len, names), np.int64, len(names))[:-1] + 1, out=line_starts[1:])
    hits = np.fromiter((m.start() for m in _per_line(pattern).finditer(text)), np.int64)
    out = np.zeros(len(names), bool)
    out[np.searchsorted(line_starts, hits, side="right") - 1] = True
    return out


def any_found(names: Sequence[str], pattern: re.Pattern[str], folded: bool = False) -> bool:
    """Whether ``pattern`` is found in any of the names (``folded``: in the lowercased names), as
    ``any(pattern.search(n) ...)`` gives it, for a pattern that cannot match a newline."""
    text = _joined(names) if names and not anchored(pattern) else None
    if text is None:
        return any(pattern.search(n.lower() if folded else n) for n in names)
    return _per_line(pattern).search(text.lower() if folded else text) is not None
