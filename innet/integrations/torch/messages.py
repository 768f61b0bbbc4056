"""A Mininet rank's send/recv and exchanges (all_to_all, gather, scatter) from its own host: innet.hosts.p2p's messages
through the switches, sent and received by the rank itself (innet.node.messages), as rank 0 runs them on the fabric
on the local backend (innet.integrations.torch.p2p).

Sends and receives progress on the messages' own thread: a send ends once its message is acknowledged whole, a
message that comes waits in the rank's ``Mailbox`` for the receive that matches it (by sender, or any, and tag), so
every rank may isend to all before it receives. An exchange, in order with the group's other collectives, sends
the messages ``exchange_pairs`` names (empty ones too: the receiver awaits one from each of those senders) and takes,
from each sender, that sender's next exchange message: every rank makes the same calls in the same order, and a
sender's messages on a channel arrive in the order sent.

What the rank sent is counted for the launcher (``tally``): its sends, its messages, and the planner's prediction
of their bytes per link (innet.planning.prediction.exchange_link_bytes); the switches count what the links carried.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, deque

import numpy as np

from innet.hosts.p2p.host import Message
from innet.hosts.p2p.wire import EXCHANGE, USER
from innet.integrations.launch.mininet import ClientConf
from innet.integrations.torch.batch import exchange_pairs, exchange_parts
from innet.integrations.torch.fabric import Tally
from innet.integrations.torch.p2p import Mailbox, received
from innet.integrations.torch.plane import Call, Done, Result
from innet.node.messages import HostMessages


class RankMessages:
    """Rank ``rank`` of ``size``'s messages out of its host's interface (``conf``: the worker client's)."""

    def __init__(self, conf: ClientConf, rank: int, size: int) -> None:
        self.conf, self.rank, self.size = conf, rank, size
        self.box = Mailbox()
        self.came = threading.Condition()
        self.exchanged: list[deque[bytes]] = [deque() for _ in range(size)]  # each sender's exchange messages come
        self.sent: Counter[tuple[int, int]] = Counter()  # (receiver, bytes) of every message sent
        self.tally = Tally()
        self.host = HostMessages(conf.spec, conf.ring, conf.iface, self._deliver, conf.faults)

    def _deliver(self, message: Message) -> None:
        if message.channel == USER:
            self.box.deliver(message.src, message.tag, message.data)
            return
        with self.came:
            self.exchanged[message.src].append(message.data)
            self.came.notify_all()

    def _send(self, dst: int, channel: int, data: bytes, tag: int, done: Done) -> None:
        self.sent[(dst, len(data))] += 1

        def end(error: Exception | None) -> None:
            done(Result(error=f"innet: send to rank {dst} failed: {error}") if error else Result(), None)

        self.host.send(dst, channel, data, tag, end)

    def submit(self, call: Call, values: np.ndarray, done: Done) -> None:
        """A send or a receive (``call.root`` the peer, -1 any; ``call.tag``), as the call plane takes it."""
        if call.name == "recv":
            self.box.post(call.root, call.tag, received(done))
            return
        self.tally.calls["send"] += 1
        self._send(call.root, USER, values.view(np.uint8).tobytes(), call.tag, done)

    def exchange(self, name: str, root: int, values: np.ndarray) -> np.ndarray:
        """This rank's part of exchange ``name`` (its ``values``: innet.integrations.torch.batch.exchange_values):
        the bytes it takes, in rank order, once its messages are through and every one it awaits came."""
        parts = exchange_parts(values, self.size)
        pairs = exchange_pairs(name, self.size, root)
        failed: list[str] = []
        through = [0]

        def done(res: Result, _: np.ndarray | None) -> None:
            with self.came:
                through[0] += 1
                if res.error:
                    failed.append(res.error)
                self.came.notify_all()

        mine = [d for s, d in pairs if s == self.rank]
        for d in mine:
            self._send(d, EXCHANGE, parts[d], 0, done)
        senders = {s for s, d in pairs if d == self.rank}
        with self.came:
            self.came.wait_for(lambda: failed or (through[0] == len(mine) and all(self.exchanged[s] for s in senders)))
            if failed:
                raise RuntimeError(failed[0])
            got = {s: self.exchanged[s].popleft() for s in senders}
        return np.frombuffer(b"".join(parts[s] if s == self.rank else got.get(s, b"") for s in range(self.size)),
                             np.uint8)

    def close(self) -> Tally:
        """Once every message sent is through: stop; what this rank sent, counted (with the planner's prediction of
        its bytes per link, on the launcher's topology: INNET_GRAPH)."""
        self.host.close()
        self.tally.messages = sum(self.sent.values())
        if self.sent and self.conf.hosts and os.environ.get("INNET_GRAPH"):
            from innet.planning.prediction import exchange_link_bytes
            from innet.shipped import load_file

            graph, me = load_file(os.environ["INNET_GRAPH"]), self.conf.hosts[self.rank]
            for (dst, nbytes), count in self.sent.items():
                for link, b in exchange_link_bytes(graph, [(me, self.conf.hosts[dst], nbytes)],
                                                   self.conf.spec.elements).items():
                    self.tally.predicted_message_link_bytes[link] += b * count
        return self.tally
