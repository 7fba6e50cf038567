"""Text from the inputs made safe to print: a name in a trace must not drive the terminal.

A device, kernel, thread or file name is whatever the file says. Printed raw, an ESC or
OSC sequence in it (``\\x1b]0;pwned\\x07`` sets the terminal's title; others move the
cursor, clear the screen or hide text) reaches the terminal as a command, and a Unicode
direction override makes the text read differently from what it is. :func:`printable`
shows every such character as its escape instead (``\\x1b``, ``\\u202e``), so the name is
still recognisable and nothing is run; lone surrogates (the bytes of a file name that is
not UTF-8) are shown the same way rather than failing the write. Standard library only:
the command line's error path uses it without loading anything.
"""

from __future__ import annotations

import functools
import re

_OTHER = r"\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
"""DEL, C1 controls, the bidirectional marks, embeddings, overrides and isolates, and lone surrogates."""


@functools.cache
def _unsafe(keep_newlines: bool) -> re.Pattern[str]:
    """Compiled on first use: the surrogate range makes each class 0.5 ms to compile, a cost every command
    paid at start-up, most never printing a name."""
    return re.compile(rf"[\x00-\x09\x0b-\x1f{_OTHER}]" if keep_newlines else rf"[\x00-\x1f{_OTHER}]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control character (line breaks too, unless ``keep_newlines``) as its escape."""
    return _unsafe(keep_newlines).sub(_escape, text)


def all_printable(text: str, keep_newlines: bool = False) -> bool:
    """Whether :func:`printable` leaves ``text`` as it is."""
    return _unsafe(keep_newlines).search(text) is None
