"""Progress of a long run: the library's ``Progress`` emits it as events (innet.events; the command line draws
them); given a ``stream``, it draws it there itself: on a terminal a tqdm status line redrawn in place, elsewhere
(a log, CI) a plain line every few seconds, which a log keeps readable where a redrawn line would pile up in ``\\r``s.

Nothing is shown for a run that ends within ``after`` seconds, so short runs and
tests print what they always did. ``update`` is cheap enough to call often: it
only looks at the clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TextIO

from tqdm import tqdm

from innet.events import emit


def waits(endpoints: Iterable[object], most: int = 2) -> str:
    """``"; "`` and what the first ``most`` endpoints still busy say they wait for (their ``waiting()``: a worker's
    oldest chunk unanswered, a ring rank's missing piece, and their retransmissions), or nothing."""
    said = [text for e in endpoints if not getattr(e, "done", True) and (text := getattr(e, "waiting", str)())]
    return "".join(f"; {text}" for text in said[:most])


class Progress:
    def __init__(self, label: str, stream: TextIO | None = None, after: float = 3.0, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``every``: seconds between updates (default 0.5 on a terminal or as events, 5 elsewhere); without
        ``stream``, each update is a "progress" event."""
        self.label, self.stream, self.clock = label, stream, clock
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every if every is not None else 0.5 if self.tty or stream is None else 5.0
        self.started = clock()
        self.next_at = self.started + after
        self.bar: tqdm | None = None

    def update(self, text: str | Callable[[], str]) -> None:
        """Show ``text`` (or what the callable returns: built only when shown) if an update is due."""
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + self.every
        status = f"{text() if callable(text) else text} ({now - self.started:.0f}s)"
        if self.stream is None:
            emit("progress", f"{self.label}: {status}")
            return
        if not self.tty:
            self.stream.write(f"{self.label}: {status}\n")
            self.stream.flush()
            return
        if self.bar is None:
            self.bar = tqdm(file=self.stream, bar_format="{desc}", mininterval=0, dynamic_ncols=True, delay=1e9)
        self.bar.set_description_str(f"{self.label}: {status}")

    def close(self) -> None:
        """End the line in place, if one was drawn on a terminal."""
        if self.bar is not None and self.stream is not None:
            self.bar.close()  # drawn only by set_description_str (delay): tqdm leaves the line unended
            self.stream.write("\n")
            self.stream.flush()
        self.bar = None
