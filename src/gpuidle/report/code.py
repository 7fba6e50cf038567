"""A fix's code in the terminal: printed whole, never wrapped, so it pastes as it reads.

Rich wraps text at the console's width; a code line wrapped at 80 columns makes the rest of a comment a
statement (``# or`` then ``fp16_compress_hook`` on the next line). A code block is therefore one
:class:`~rich.text.Text` that neither wraps nor crops, printed with ``crop=False``: a line longer than the
terminal runs past it (the terminal's own soft wrap is undone on paste), and every line is the line the fix
holds, indented.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text


def code_block(code: str, indent: int) -> Group:
    """``code``'s lines, each indented by ``indent`` spaces, never wrapped or cut: print it with ``crop=False``.

    A group, not the bare text: ``Console.print`` joins the texts it is given into one and drops their
    ``no_wrap``."""
    pad = " " * indent
    return Group(Text("\n".join(pad + line for line in code.splitlines()), style="cyan", no_wrap=True,
                      overflow="ignore"))
