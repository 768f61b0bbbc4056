"""Waiting for a node's sockets or its next deadline, whichever comes first, to within the kernel's timer slack.

``select.poll`` takes its timeout in whole milliseconds, so a wait for a deadline either wakes early or is rounded
up: waking one frame ahead on the old ``int(ms) + 1`` came 0.3-1.0 ms late at the median (docs/performance.md,
*Where the faithful rate is lost*), and every port that holds a frame for its link's latency and serialization
(the dilated hop of a Mininet run) paid it on every hop. ``Poller.wait`` polls for the whole milliseconds but
one, then waits out the rest with ``select.select``, whose timeout is in microseconds.
"""

from __future__ import annotations

import select
import time

FINE_S = 0.002  # a deadline nearer than this is waited for with select's microseconds; farther, poll first
LONGEST_MS = 1000  # no wait is longer: a loop without deadlines still looks round once a second
SELECT_FDS = 1024  # select's FD_SETSIZE: past it, the fine wait is poll's rounded-up millisecond


class Poller:
    """A set of file descriptors to read from, and the wait for them or a deadline (``time.monotonic`` instants)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: set[int] = set()

    def register(self, fd: int) -> None:
        self._poll.register(fd, select.POLLIN)
        self._fds.add(fd)

    def unregister(self, fd: int) -> None:
        self._poll.unregister(fd)
        self._fds.discard(fd)

    def wait(self, *deadlines: float | None) -> list[int]:
        """The descriptors ready to read, once one is or the earliest of ``deadlines`` (None: none) has come: at
        most ``LONGEST_MS``. A wait may end a little before its deadline, never a millisecond after it."""
        due = [d for d in deadlines if d is not None]
        left = min(due) - time.monotonic() if due else LONGEST_MS / 1000
        if left <= 0:
            return [fd for fd, _ in self._poll.poll(0)]
        if left >= FINE_S or (self._fds and max(self._fds) >= SELECT_FDS):
            return [fd for fd, _ in self._poll.poll(min(LONGEST_MS, max(1, int(left * 1000) - 1)))]
        ready, _, _ = select.select(sorted(self._fds), [], [], left)
        return ready
