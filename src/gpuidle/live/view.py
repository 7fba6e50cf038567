"""The live view of ``gpuidle run``: a few status lines pinned to the bottom of the terminal.

The wrapped command keeps writing to the same terminal, so the view cannot redraw
"the last N lines" as a progress bar does (it would erase the command's output).
Instead it shrinks the terminal's scroll region (DECSTBM) to the rows above the view:
the command's output scrolls there, and the view is drawn below it with the cursor
saved and restored around each redraw, in one ``write`` so the kernel does not
interleave it with the command's writes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

ESC = "\x1b"
SAVE, RESTORE = f"{ESC}7", f"{ESC}8"
CLEAR_LINE = f"{ESC}[2K"

Render = Callable[[int, int], list[str]]
"""``(width, max_lines) -> lines`` (with ANSI colour), at most ``max_lines``."""


class TerminalStatus:
    """Status lines at the bottom of a terminal, redrawn every ``refresh_s`` from a thread."""

    MIN_OUTPUT_ROWS = 6
    """Rows left for the command's output; below that the view shrinks to one line."""

    def __init__(self, fd: int, render: Render, lines: int, refresh_s: float = 0.5) -> None:
        self.fd = fd
        self.render = render
        self.want = max(1, lines)
        self.refresh_s = refresh_s
        self._rows = self._cols = 0
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _size(self) -> tuple[int, int]:
        """Rows and columns; (0, 0) when the terminal does not say."""
        try:
            size = os.get_terminal_size(self.fd)
        except OSError:
            return 0, 0
        return size.lines, size.columns

    def _setup(self) -> str:
        rows, cols = self._size()
        n = self.want if rows - self.want >= self.MIN_OUTPUT_ROWS else 1
        self._rows, self._cols, self._n = rows, cols, n
        # make room (scroll the output up by n lines), pin the region above the view, return into it
        return "\n" * n + f"{SAVE}{ESC}[1;{rows - n}r{RESTORE}{ESC}[{n}A"

    def start(self) -> None:
        if self._size()[0] < self.MIN_OUTPUT_ROWS + 1:
            return  # a terminal of unknown or tiny size: no view rather than a garbled one
        self._write(self._setup())
        self.draw()
        self._thread = threading.Thread(target=self._run, name="gpuidle-view", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.draw()

    def draw(self) -> None:
        with self._lock:
            if self._n == 0:
                return
            out = ""
            size = self._size()
            if size[0] < self.MIN_OUTPUT_ROWS + 1:
                return
            if size != (self._rows, self._cols):
                out += self._teardown_text() + self._setup()
            lines = self.render(self._cols, self._n)[: self._n]
            out += SAVE
            for i in range(self._n):
                text = lines[i] if i < len(lines) else ""
                out += f"{ESC}[{self._rows - self._n + 1 + i};1H{CLEAR_LINE}{text}{ESC}[0m"
            out += RESTORE
            self._write(out)

    def _teardown_text(self) -> str:
        out = f"{SAVE}{ESC}[r"
        for i in range(self._n):
            out += f"{ESC}[{self._rows - self._n + 1 + i};1H{CLEAR_LINE}"
        return out + RESTORE

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        with self._lock:
            if self._n:
                self._write(self._teardown_text())
                self._n = 0

    def _write(self, text: str) -> None:
        try:
            os.write(self.fd, text.encode("utf-8", errors="replace"))
        except OSError:
            self._stop.set()
