"""What the library says while it works, as events: a phase begins, progress of a long run, a warning (a
baseline left out), the fidelity verdict. Every event is logged (logger ``innet``: a warning shows on stderr
where nothing else is set up) and handed to whoever listens: the command line renders them
(innet.cli), a notebook passes ``on_event`` to ``innet.run``. The library itself never prints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

KINDS = ("phase", "progress", "warning", "fidelity")
logger = logging.getLogger("innet")


@dataclass(frozen=True)
class Event:
    """One thing the library says: its ``kind`` (one of KINDS) and one line of text."""

    kind: str
    message: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"event kind {self.kind!r} is not one of {KINDS}")


Listener = Callable[[Event], None]
_listeners: list[Listener] = []


def emit(kind: str, message: str) -> None:
    """Say ``message`` as an event of ``kind``: logged, and handed to every listener."""
    event = Event(kind, message)
    if _listeners:
        for listen in list(_listeners):
            listen(event)
    else:  # no one listens: the log is where it goes
        logger.log(logging.WARNING if kind == "warning" else logging.INFO, message)


@contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """Hand every event emitted inside the block to ``listener`` too (None: nothing changes)."""
    if listener is None:
        yield
        return
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


class Progress:
    """A long run's progress as "progress" events: nothing for a run that ends within ``after`` seconds (short runs
    and tests say what they always did), then one every ``every`` seconds. ``update`` only looks at the clock, so it
    is cheap enough to call often; how a progress line is drawn is the listener's (innet.cli.Render)."""

    def __init__(self, label: str, after: float = 3.0, every: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.every, self.clock = label, every, clock
        self.started = clock()
        self.next_at = self.started + after

    def update(self, text: str | Callable[[], str]) -> None:
        """Say ``text`` (or what the callable returns: built only when said) if an update is due."""
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + self.every
        emit("progress", f"{self.label}: {text() if callable(text) else text} ({now - self.started:.0f}s)")


def waits(endpoints: Iterable[object], most: int = 2) -> str:
    """``"; "`` and what the first ``most`` endpoints still busy say they wait for (their ``waiting()``: a worker's
    oldest chunk unanswered, a ring rank's missing piece, and their retransmissions), or nothing."""
    said = [text for e in endpoints if not getattr(e, "done", True) and (text := getattr(e, "waiting", str)())]
    return "".join(f"; {text}" for text in said[:most])
