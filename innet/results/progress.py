"""Progress of a long run, on stderr: one line rewritten in place on a terminal, else a line every few seconds.

Nothing is shown for a run that ends within ``after`` seconds, so short runs and
tests print what they always did. ``update`` is cheap enough to call often: it
only looks at the clock.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    def __init__(self, label: str, stream: TextIO | None = None, after: float = 3.0, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``every``: seconds between lines (default 0.5 on a terminal, 5 elsewhere)."""
        self.label, self.stream, self.clock = label, stream or sys.stderr, clock
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every if every is not None else 0.5 if self.tty else 5.0
        self.started = clock()
        self.next_at = self.started + after
        self.shown = False

    def update(self, text: str | Callable[[], str]) -> None:
        """Show ``text`` (or what the callable returns: built only when shown) if a line is due."""
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + self.every
        line = f"{self.label}: {text() if callable(text) else text} ({now - self.started:.0f}s)"
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """End the line in place, if one was shown on a terminal."""
        if self.shown and self.tty:
            self.stream.write("\n")
            self.stream.flush()
        self.shown = False
