"""What the library says while it works, as events: a phase begins, progress of a long run, a warning (a
baseline left out), the fidelity verdict. Every event is logged (logger ``innet``: a warning shows on stderr
where nothing else is set up) and handed to whoever listens: the command line renders them
(innet.cli), a notebook passes ``on_event`` to ``innet.run``. The library itself never prints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
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
