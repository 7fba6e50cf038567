"""A pattern searched in many names at once: the names joined, one search over the text, not one per name.

A trace of hundreds of thousands of distinct kernel names (every shape its own kernel) cost a Python call and a
search per name and per pattern; joined by newlines, the names are searched by ``re`` in C in one pass. This
holds for patterns that cannot match a newline (no ``\\s`` or negated class; ``.`` never does: a match stays
inside one name), whose ``^`` then anchors at each name's start (MULTILINE); names holding a newline themselves
are searched one by one. A pattern anchored at the start in every alternative is searched with each ``^`` a
newline, in the names joined behind one: ``re`` skips from newline to newline, where ``^`` would have it try every
character. A pattern whose every alternative starts with a literal text is not searched at all where none of those
texts is in the names (``str`` finds a text several times faster than ``re`` passes over it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from functools import cached_property, lru_cache

import numpy as np
import numpy.typing as npt


@lru_cache(maxsize=256)
def _compiled(text: str, flags: int) -> re.Pattern[str]:
    return re.compile(text, flags)


_NAME_END = re.compile(r"(?<!\\)((?:\\\\)*)\\Z")
"""``\\Z`` outside an escaped backslash: a name's end, which in names joined by newlines is a line's end."""


def _per_line(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """The pattern for the joined names: ``^`` and ``$`` at each name's edges (MULTILINE), ``\\Z`` as ``$`` (a
    name's own ``$`` also matches before a final newline, its ``\\Z`` never; joined names hold none)."""
    return _compiled(_NAME_END.sub(r"\1$", pattern.pattern), pattern.flags | re.MULTILINE)


@lru_cache(maxsize=256)
def _newline_led(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """An anchored pattern with each alternative's ``^`` a newline: its matches in the names joined behind a
    newline start at the newline before the name."""
    rests = "|".join(alt[1:] for alt in _alternatives(pattern.pattern))
    return _compiled(f"\\n(?:{rests})", pattern.flags | re.MULTILINE)  # one literal first: re skips to it


def _joined(names: Sequence[str]) -> str | None:
    """The names joined by newlines; None where a name holds one (the lines would not be the names)."""
    text = "\n".join(names)
    return text if text.count("\n") == len(names) - 1 else None


def _syntax(text: str) -> Iterator[tuple[int, str, int]]:
    """Each character of the pattern outside escapes and classes, with its index and the depth of groups it is
    in (a ``)`` at the depth inside it)."""
    depth, klass, i = 0, False, 0
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
        else:
            yield i, c, depth
            depth += (c == "(") - (c == ")")
        i += 1


def _alternatives(text: str) -> list[str]:
    """The pattern's top-level alternatives (``a|(b|c)|d``: ``a``, ``(b|c)``, ``d``)."""
    starts = [0, *(i + 1 for i, c, depth in _syntax(text) if c == "|" and depth == 0)]
    return [text[a:b - 1] for a, b in zip(starts, [*starts[1:], len(text) + 1], strict=True)]


def _distributed(alt: str) -> list[str]:
    """``(a|b)c`` and ``^(?:a|b)c`` as ``ac``, ``bc`` and ``^ac``, ``^bc`` (and after ``\\b`` as after ``^``): the
    same matches, each alternative led by its own text. A quantified group, a look-around or one with flags is
    left as it is."""
    lead = "^" if alt.startswith("^") else "\\b" if alt.startswith("\\b") else ""
    body = alt[len(lead):]
    opening = 3 if body.startswith("(?:") else 1 if body.startswith("(") and not body.startswith("(?") else 0
    close = next((i for i, c, depth in _syntax(body) if c == ")" and depth == 1), None) if opening else None
    if close is None or body[close + 1:close + 2] in ("*", "+", "?", "{"):
        return [alt]
    return [f"{lead}{inner}{body[close + 1:]}" for inner in _alternatives(body[opening:close])]


@lru_cache(maxsize=256)
def anchored(pattern: re.Pattern[str]) -> bool:
    """Whether every top-level alternative of the pattern starts with ``^`` (then searched name by name: this
    decides the speed only, never the result)."""
    return all(alt.startswith("^") for alt in _alternatives(pattern.pattern))


@lru_cache(maxsize=256)
def _parts(pattern: re.Pattern[str]) -> tuple[re.Pattern[str], ...]:
    """The same search as a few patterns, either found: a leading group's alternatives each an alternative of the
    pattern (nested ones too), those anchored with ``^`` (searched newline-led) apart from the others, a ``\\bword``
    or ``^word`` written
    ``word(?<=\\bword)`` (the same matches; ``^`` is each name's start in the joined names, searched line by line):
    ``re`` skips ahead to a possible first character only where every alternative starts with a literal. A pattern
    with back-references, named groups or conditionals is left whole (copies of it would repeat them)."""
    text = pattern.pattern
    if pattern.flags & re.VERBOSE or re.search(r"\\[1-9]|\(\?P[=<]|\(\?\(", text):
        return (pattern,)
    alts = _alternatives(text)
    spread = alts
    for _ in range(DISTRIBUTED_DEPTH):
        spread = [one for alt in spread for one in _distributed(alt)]
    starts = {alt[1:2].lower() for alt in spread if alt.startswith("^")}
    led = [alt if alt.startswith("^") and len(starts) > MAX_LEADS else _word_first(alt) for alt in spread]
    at_start = [alt for alt in led if alt.startswith("^")]
    rest = [alt for alt in led if not alt.startswith("^")]
    groups = [g for g in (at_start, rest) if g]
    if len(groups) == 1 and led == alts:
        return (pattern,)
    return tuple(_compiled("|".join(g), pattern.flags) for g in groups)


DISTRIBUTED_DEPTH = 3
"""Leading groups inside leading groups distributed this deep (``^((cuda|hip)Free|...)``)."""
MAX_LEADS = 4
"""Anchored words with more first letters than this are searched newline-led: led by their words, ``re`` would
stop at every one of those letters (the Python-frame prefixes: 0.12 s word-led against 0.02 s newline-led on 269k
names)."""


def _word_first(alt: str) -> str:
    """``\\bword...`` as ``word(?<=\\bword)...``, ``^word...`` as ``word(?<=^word)...`` and ``\\dword...`` as
    ``word(?<=\\dword)...`` (so ``\\w``; a quantified last letter left after it): the same matches, found where
    ``re`` skips ahead to the word; else as it is."""
    run = re.match(r"(\^|\\[bdw])(\w+)", alt)
    if run is None:
        return alt
    word = run[2][:-1] if alt[run.end():run.end() + 1] in ("*", "+", "?", "{") else run[2]
    lead = run[1]
    return f"{word}(?<={lead}{word}){alt[len(lead) + len(word):]}" if word else alt


_META = frozenset(".^$*+?{}[]()|")
MAX_REQUIRED = 16
"""Patterns of more alternatives than this are searched without looking for their leading texts first."""


def _lead(alt: str) -> str:
    """The literal text every match of the alternative starts with, after its ``^`` or ``\\b``; '' where it starts
    with anything else (a class, a group, a quantified letter)."""
    i = 2 if alt.startswith("\\b") else 1 if alt.startswith("^") else 0
    out: list[str] = []
    while i < len(alt):
        c, width = alt[i], 1
        if c == "\\":
            c, width = alt[i + 1:i + 2], 2
            if not c or c.isalnum():  # a class, an assertion, a reference or a control character
                break
        elif c in _META:
            break
        if alt[i + width:i + width + 1] in ("*", "?", "{"):  # the letter may be absent
            break
        out.append(c)
        i += width
    return "".join(out)


@lru_cache(maxsize=256)
def _required(pattern: re.Pattern[str]) -> tuple[str, ...] | None:
    """Texts one of which every match holds (the alternatives' leads, lowercase for a case-insensitive pattern):
    where none is in the names, ``str.find`` has said so at several times the speed of ``re``. None: no such
    texts."""
    if pattern.flags & re.VERBOSE:
        return None
    leads = [_lead(alt) for alt in _alternatives(pattern.pattern)]
    if not all(leads) or len(leads) > MAX_REQUIRED:
        return None
    if pattern.flags & re.IGNORECASE:
        if not all(lead.isascii() for lead in leads):
            return None
        leads = [lead.lower() for lead in leads]
    distinct_leads = list(dict.fromkeys(leads))
    # a lead that holds another is in the names only where that one is: looked for in vain, it is not looked for
    return tuple(x for x in distinct_leads if not any(y != x and y in x for y in distinct_leads))


_ASCII_FOLDS = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
"""The characters ``re`` matches to an ASCII letter whatever the case that ``str.lower`` does not map to it."""


@lru_cache(maxsize=64)
def _lowercase(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """A case-insensitive pattern as a lowercase one for lowercased text (``re`` tries every case of every
    character otherwise, some ten times slower); None where its text has an escape a lowercase letter would
    change (``\\W``, ``\\S``...) or that names a character by its code (``\\x41`` stays ``A``)."""
    if not pattern.flags & re.IGNORECASE or re.search(r"\\[A-Zxu0-7]", pattern.pattern):
        return None
    return _compiled(pattern.pattern.lower(), (pattern.flags & ~re.IGNORECASE) | re.MULTILINE)


@lru_cache(maxsize=256)
def _joinable(pattern: re.Pattern[str]) -> bool:
    """Whether the joined names read the pattern as each name does: not where it says ``\\A`` or ``\\B`` (they
    see the text's edges, not a name's) or a newline (it would cross from name to name), nor with flags that change
    how a pattern reads (``VERBOSE``): those are searched name by name."""
    return not (pattern.flags & re.VERBOSE or re.search(r"\\[ABn]|\n", pattern.pattern))


@lru_cache(maxsize=256)
def _lowercase_exact(pattern: re.Pattern[str]) -> bool:
    """Whether lowercase search finds exactly the ASCII names the pattern finds: not where a class holds a range
    (``[@-Z]`` lowercased takes in ``_``) or a group turns the case-insensitivity off (``(?-i:A)``)."""
    return pattern.pattern.isascii() and not re.search(r"\[[^\]]*?-[^\]]|\(\?[a-zA-Z]*-", pattern.pattern)


JOIN_FROM = 2_000
"""Fewer names than this are searched one by one: a trace's few hundred names cost less so than the patterns'
joined forms cost to compile in a fresh process (some 15 ms for all of them, against 1-2 ms)."""


class JoinedNames:
    """Names joined by newlines (and lowercased, and split back) once, for every pattern searched in them."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names

    @cached_property
    def text(self) -> str | None:
        return _joined(self.names) if self.names else None

    @cached_property
    def folded(self) -> str:
        return (self.text or "").translate(_ASCII_FOLDS).lower()

    @cached_property
    def line_starts(self) -> npt.NDArray[np.int64]:
        starts = np.zeros(len(self.names), np.int64)
        np.cumsum(np.fromiter(map(len, self.names), np.int64, len(self.names))[:-1] + 1, out=starts[1:])
        return starts

    def found(self, pattern: re.Pattern[str]) -> npt.NDArray[np.bool_]:
        """:func:`found_in` of these names."""
        if len(self.names) < JOIN_FROM or not _joinable(pattern):
            return np.fromiter((pattern.search(n) is not None for n in self.names), bool, len(self.names))
        parts = _parts(pattern)
        out = self._found(parts[0])
        for part in parts[1:]:
            out |= self._found(part)
        return out

    @cached_property
    def ascii(self) -> bool:
        return (self.text or "").isascii()

    def any(self, pattern: re.Pattern[str]) -> bool:
        """Whether ``pattern`` is found in any of the names."""
        if len(self.names) < JOIN_FROM or self.text is None or not _joinable(pattern):
            return any(pattern.search(n) for n in self.names)
        for part in _parts(pattern):
            search, text = self._search(part, lowercase=None)
            if not self._excluded(part) and search.search(text):
                return True
        return False

    def _excluded(self, pattern: re.Pattern[str]) -> bool:
        """Whether none of the texts every match of the pattern holds is in the names."""
        required = _required(pattern)
        if required is None:
            return False
        text = self.folded if pattern.flags & re.IGNORECASE else self.text or ""
        return not any(r in text for r in required)

    def _search(self, pattern: re.Pattern[str], lowercase: re.Pattern[str] | None) -> tuple[re.Pattern[str], str]:
        """The pattern to search for and the joined text to search: lowercase in the folded names where given, an
        anchored one newline-led in the names behind a newline."""
        search, text = (lowercase, self.folded) if lowercase is not None else (_per_line(pattern), self.text or "")
        return (_newline_led(search), f"\n{text}") if anchored(pattern) else (search, text)

    def _found(self, pattern: re.Pattern[str]) -> npt.NDArray[np.bool_]:
        names = self.names
        if self.text is None:
            return np.fromiter((pattern.search(n) is not None for n in names), bool, len(names))
        if self._excluded(pattern):
            return np.zeros(len(names), bool)
        lowercase = _lowercase(pattern)
        if lowercase is not None and len(self.folded) != len(self.text):
            lowercase = None
        search, text = self._search(pattern, lowercase)
        # a newline-led match starts at the newline before its name: at that name's start in the names unled
        hits = np.fromiter((m.start() for m in search.finditer(text)), np.int64)
        out = np.zeros(len(names), bool)
        rows = np.searchsorted(self.line_starts, hits, side="right") - 1  # in order, as finditer gives the hits
        if rows.size:  # each name once (np.unique would load numpy.ma, a start-up cost of every analysis)
            rows = rows[np.concatenate(([True], rows[1:] != rows[:-1]))]
        if lowercase is not None and not (self.ascii and _lowercase_exact(pattern)):
            rows = rows[np.fromiter((pattern.search(names[i]) is not None for i in rows.tolist()), bool, rows.size)]
        out[rows] = True
        return out


def found_in(names: Sequence[str], pattern: re.Pattern[str]) -> npt.NDArray[np.bool_]:
    """``[bool(pattern.search(n)) for n in names]``, for a pattern that cannot match a newline. A
    case-insensitive one is searched lowercase in the lowercased names, and then, as itself, in the names it is
    found in there (those are all the names it is found in: the lowercasing folds every character ``re`` takes
    for an ASCII letter to that letter; where names and pattern are ASCII, lowercase finds exactly those names)."""
    return JoinedNames(names).found(pattern)


def found_any(names: Sequence[str], patterns: Sequence[re.Pattern[str]]) -> npt.NDArray[np.bool_]:
    """Where any of the patterns is found (:func:`found_in` of each), the names joined and lowercased once."""
    joined = JoinedNames(names)
    out = np.zeros(len(names), bool)
    for pattern in patterns:
        out |= joined.found(pattern)
    return out
