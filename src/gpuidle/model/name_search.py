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


_ASCII_FOLDS = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
"""The characters ``re`` matches to an ASCII letter whatever the case that ``str.lower`` does not map to it."""


@lru_cache(maxsize=64)
def _lowercase(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """A case-insensitive pattern as a lowercase one for lowercased text (``re`` tries every case of every
    character otherwise, some ten times slower); None where its text has an escape a lowercase letter would
    change (``\\W``, ``\\S``...)."""
    if not pattern.flags & re.IGNORECASE or re.search(r"\\[A-Z]", pattern.pattern):
        return None
    return re.compile(pattern.pattern.lower(), (pattern.flags & ~re.IGNORECASE) | re.MULTILINE)


def found_in(names: Sequence[str], pattern: re.Pattern[str]) -> npt.NDArray[np.bool_]:
    """``[bool(pattern.search(n)) for n in names]``, for a pattern that cannot match a newline. A
    case-insensitive one is searched lowercase in the lowercased names, and then, as itself, in the names it is
    found in there (those are all the names it is found in: the lowercasing folds every character ``re`` takes
    for an ASCII letter to that letter)."""
    text = _joined(names) if names and not anchored(pattern) else None
    if text is None:
        return np.fromiter((pattern.search(n) is not None for n in names), bool, len(names))
    line_starts = np.zeros(len(names), np.int64)
    np.cumsum(np.fromiter(map(len, names), np.int64, len(names))[:-1] + 1, out=line_starts[1:])
    lowercase = _lowercase(pattern)
    folded = text.translate(_ASCII_FOLDS).lower() if lowercase is not None else ""
    search = _per_line(pattern) if lowercase is None or len(folded) != len(text) else lowercase
    hits = np.fromiter((m.start() for m in search.finditer(text if search is not lowercase else folded)), np.int64)
    out = np.zeros(len(names), bool)
    rows = np.searchsorted(line_starts, hits, side="right") - 1  # in order, as finditer gives the hits
    if rows.size:  # each name once (np.unique would load numpy.ma, a start-up cost of every analysis)
        rows = rows[np.concatenate(([True], rows[1:] != rows[:-1]))]
    if search is lowercase:
        rows = rows[np.fromiter((pattern.search(names[i]) is not None for i in rows.tolist()), bool, rows.size)]
    out[rows] = True
    return out


def any_found(names: Sequence[str], pattern: re.Pattern[str], folded: bool = False) -> bool:
    """Whether ``pattern`` is found in any of the names (``folded``: in the lowercased names), as
    ``any(pattern.search(n) ...)`` gives it, for a pattern that cannot match a newline."""
    text = _joined(names) if names and not anchored(pattern) else None
    if text is None:
        return any(pattern.search(n.lower() if folded else n) for n in names)
    return _per_line(pattern).search(text.lower() if folded else text) is not None
