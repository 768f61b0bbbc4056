"""torch's send and recv on an ``innet`` group: messages through the network (innet.hosts.p2p), matched to the
receives a rank posts as gloo matches them (by sender, or any, and tag; in the order each sender sent).

A send ends when its message is through (acknowledged whole by the receiver's host), whether or not the receiver
has posted its receive: the message waits in the receiver's ``Mailbox``. So sends and receives progress apart, and
every rank may send to all before it receives. On the local backend every rank hands its sends and receives to
rank 0 over the call plane (innet.integrations.torch.plane) and rank 0's ``FabricMessages`` runs the sends waiting
together through the fabric, the mailboxes its own; under ``innet launch`` on Mininet each rank sends from its own
host (innet.integrations.torch.messages).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from innet.hosts.p2p.wire import USER
from innet.integrations.torch.fabric import FabricCollectives
from innet.integrations.torch.plane import Call, Done, Result

Taker = Callable[[int, bytes], None]  # a posted receive's end: the sender's rank, the bytes


class Mailbox:
    """One rank's messages that came before a receive took them, and its receives waiting for a message."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: deque[tuple[int, int, bytes]] = deque()  # (sender, tag, bytes), in the order they came
        self.waiting: deque[tuple[int, int, Taker]] = deque()  # (sender or -1: any, tag, its end), in order posted

    def deliver(self, src: int, tag: int, data: bytes) -> None:
        """A message came: to the first receive waiting for it, else kept."""
        with self.lock:
            found = next((w for w in self.waiting if w[0] in (src, -1) and w[1] == tag), None)
            if found is None:
                self.messages.append((src, tag, data))
                return
            self.waiting.remove(found)
        found[2](src, data)

    def post(self, src: int, tag: int, take: Taker) -> None:
        """A receive from ``src`` (-1: any rank) with ``tag``: the first message kept that it matches, else it waits."""
        with self.lock:
            found = next((m for m in self.messages if src in (m[0], -1) and m[1] == tag), None)
            if found is None:
                self.waiting.append((src, tag, take))
                return
            self.messages.remove(found)
        take(found[0], found[2])


def received(done: Done) -> Taker:
    """A receive's end as the call plane says it: the bytes, and the sender in ``Result.source``."""
    return lambda src, data: done(Result("|u1", len(data), source=src), np.frombuffer(data, np.uint8))


class FabricMessages:
    """Rank 0's (local backend): every rank's sends through ``fabric`` (None: copied here, after ``warn`` says so),
    as many at once as are waiting, and every rank's mailbox."""

    def __init__(self, fabric: FabricCollectives | None, size: int, warn: Callable[[str], None]) -> None:
        self.fabric, self.size, self.warn = fabric, size, warn
        self.boxes = [Mailbox() for _ in range(size)]
        self.sends: list[tuple[int, Call, bytes, Done]] = []
        self.ready = threading.Condition()
        self.closed = False
        threading.Thread(target=self._serve, name="innet-messages", daemon=True).start()

    def handle(self, rank: int, call: Call, values: np.ndarray, done: Done) -> None:
        """Rank ``rank``'s send or receive (``call.root`` the peer, -1 any; ``call.tag``)."""
        if call.name == "recv":
            self.boxes[rank].post(call.root, call.tag, received(done))
            return
        with self.ready:
            if self.closed:
                done(Result(error="innet: the process group was shut down"), None)
                return
            self.sends.append((rank, call, values.view(np.uint8).tobytes(), done))
            self.ready.notify()

    def _serve(self) -> None:
        while True:
            with self.ready:
                while not self.sends and not self.closed:
                    self.ready.wait()
                if self.closed:
                    return
                sends, self.sends = self.sends, []
            posts = [(rank, call.root, data) for rank, call, data, _ in sends]
            try:
                if self.fabric is None:
                    self.warn("send/recv")
                    got = [[[data for s, d, data in posts if s == src and d == dst] for src in range(self.size)]
                           for dst in range(self.size)]
                else:
                    self.fabric.tally.calls["send"] += len(posts)
                    got = self.fabric.messages(self.size, posts, USER)
            except Exception as exc:  # noqa: BLE001 (each send's Work raises it)
                for *_, done in sends:
                    done(Result(error=f"innet: send failed: {exc}"), None)
                continue
            for *_, done in sends:
                done(Result(), None)
            for rank, call, _, _ in sends:  # in the order sent: each message to its receiver's mailbox
                self.boxes[call.root].deliver(rank, call.tag, got[call.root][rank].pop(0))

    def close(self) -> None:
        with self.ready:
            self.closed = True
            self.ready.notify()
