"""A progress indicator on stderr for long job histories.

On a terminal it redraws one bar in place; elsewhere (CI logs, pipes) it prints a plain
counter line every ``every`` items, and nothing at all for short histories, so that
captured output stays clean.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    """Counts ``total`` items of work, drawing on ``stream`` (default stderr)."""

    def __init__(self, total: int, label: str, *, stream: TextIO | None = None, every: int = 50, width: int = 30):
        self.total = total
        self.label = label
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._every = every
        self._width = width

    def advance(self, count: int = 1) -> None:
        self.done += count
        if self._tty:
            filled = self._width * self.done // max(self.total, 1)
            bar = "#" * filled + "-" * (self._width - filled)
            self._stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}")
            if self.done >= self.total:
                self._stream.write("\n")
            self._stream.flush()
        elif self.total >= self._every and (self.done % self._every == 0 or self.done == self.total):
            self._stream.write(f"btk report: {self.label} {self.done}/{self.total}\n")
            self._stream.flush()
