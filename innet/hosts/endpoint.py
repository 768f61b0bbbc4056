"""What a host runs: a sans-I/O state machine (a worker, a ring peer, a PBox shard, an input stream's end).

The fabric (innet.backends.local.fabric) and a namespace's poll loop (innet.node.egress) drive the same
endpoints: frames in with ``receive``, timers with ``next_deadline`` and ``on_timeout``, frames and blocks of
equal-length frames out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

Frames = list[bytes | np.ndarray]  # what a host endpoint sends: frames, and blocks of equal-length frames (rows)


class Endpoint(Protocol):
    """A run ends when every endpoint is done, except daemons (``daemon = True``, like the PBox) that serve
    until stopped."""

    @property
    def done(self) -> bool: ...

    def start(self, now: float) -> Sequence[bytes | np.ndarray]: ...

    def receive(self, frame: bytes, now: float) -> Sequence[bytes | np.ndarray]: ...

    def next_deadline(self) -> float | None: ...

    def on_timeout(self, now: float) -> Sequence[bytes | np.ndarray]: ...
