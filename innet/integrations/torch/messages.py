"""A Mininet rank's send/recv and exchanges (all_to_all, gather, scatter) from its own host: innet.hosts.p2p's messages
through the switches, sent and received by the rank itself (``HostMessages``), as rank 0 runs them on the fabric
on the local backend (innet.integrations.torch.p2p).

Sends and receives progress on the messages' own thread: a send ends once its message is acknowledged whole, a
message that comes waits in the rank's ``Mailbox`` for the receive that matches it (by sender, or any, and tag), so
every rank may isend to all before it receives. An exchange, in order with the group's other collectives, sends
the messages ``exchange_pairs`` names (empty ones too: the receiver awaits one from each of those senders) and takes,
from each sender, that sender's next exchange message: every rank makes the same calls in the same order, and a
sender's messages on a channel arrive in the order sent.

What the rank sent is counted for the launcher (``tally``): its sends, its messages, and the planner's prediction
of their bytes per link (innet.planning.prediction.exchange_link_bytes); the switches count what the links carried.

A host's point-to-point messages on a real interface (``HostMessages``): innet.hosts.p2p's ``MessageHost``, the
protocol the fabric drives, driven here by a thread of its own over a raw port with the wall clock, so that messages
go and come whatever else the host's program is doing (as gloo's sends and receives progress on its own threads).

The port sits beside the worker client's on the same interface (innet.node.client), each taking its own frames: a
socket filter on the job number (``RawPort.keep_job``) gives this one the messages' (job P2P_JOB) and the client's
every other. A message's end (``send``'s ``end``) is called once it is acknowledged whole, or failed; a message that
came is handed to ``deliver`` in order per sender and channel. Both are called on the thread, outside its lock.

``close`` waits until every message sent is acknowledged; on lossy links it then keeps answering while frames still
come (a sender whose last ACK was lost asks again, and ``MessageHost`` answers from what it handed on).
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

import numpy as np

from innet.hosts.job import JobSpec
from innet.hosts.p2p.host import Message, MessageHost
from innet.hosts.p2p.wire import EXCHANGE, USER
from innet.integrations.launch.mininet import ClientConf
from innet.integrations.torch.batch import exchange_pairs, exchange_parts
from innet.integrations.torch.fabric import Tally
from innet.integrations.torch.p2p import Mailbox, received
from innet.integrations.torch.plane import Call, Done, Result
from innet.io.rawport import RawPort
from innet.node.config import NO_FAULTS, Faults
from innet.node.egress import Egress, expire, feed, wait_ms
from innet.wire.packet import P2P_JOB

End = Callable[["Exception | None"], None]  # a message's end: None once acknowledged whole, else what failed it
LINGER_MAX_S = 2.0  # the longest a host on lossy links keeps answering repeats after its last message


class HostMessages:
    """Rank ``spec.rank``'s messages (``nodes``: every rank's node index) out of interface ``iface`` (its port's
    ``faults``); each message that comes handed to ``deliver``."""

    def __init__(self, spec: JobSpec, nodes: Sequence[int], iface: str, deliver: Callable[[Message], None],
                 faults: Faults | None = None) -> None:
        self.host = MessageHost(spec, nodes)
        self.port = RawPort(iface)
        self.port.keep_job(P2P_JOB)
        self.egress = Egress({0: self.port}, faults or NO_FAULTS)
        self.deliver = deliver
        self.lock = threading.Lock()
        self.posts: list[tuple[int, int, bytes, int, End]] = []  # sent, not yet handed to the host
        self.ends: dict[int, End] = {}  # the host's ticket of each message in flight -> its end
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.closing = False
        self.stopped = False  # told to stop now, whatever is in flight
        self.heard = time.monotonic()  # when a frame last came
        self.thread = threading.Thread(target=self._serve, name="innet-messages", daemon=True)
        self.thread.start()

    def send(self, dst: int, channel: int, data: bytes, tag: int, end: End) -> None:
        """Send ``data`` to rank ``dst`` on ``channel`` with ``tag``; ``end`` says when it is through."""
        with self.lock:
            failed = self.host.error
            if failed is None:
                self.posts.append((dst, channel, data, tag, end))
        if failed is not None:
            end(failed)
            return
        os.write(self.wake_w, b"\0")

    def _serve(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 (the port failed: every message in flight, and every later one, fails)
            with self.lock:
                self.host.error = RuntimeError(f"innet: rank {self.host.spec.rank}'s messages failed: {exc}")
                ends = [end for *_, end in self.posts] + list(self.ends.values())
                self.posts.clear()
                self.ends.clear()
            for end in ends:
                end(self.host.error)

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self.port.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            with self.lock:
                waits = wait_ms(self.host.next_deadline(), self.egress.next_due(), self._linger_end())
            ready = {fd for fd, _ in poller.poll(waits)}
            with self.lock:
                now = time.monotonic()
                if self.wake_r in ready:
                    while _drained(self.wake_r):
                        pass
                if self.port.fileno() in ready:
                    feed(self.port, self.host, self.egress, now)
                    self.heard = now
                for dst, channel, data, tag, end in self.posts:
                    self.ends[self.host.post(dst, channel, data, tag, now)] = end
                self.posts.clear()
                self.egress.send_all(0, self.host.send_frames(now), now)
                expire(self.host, self.egress, now)
                through: list[tuple[End, Exception | None]] = [(self.ends.pop(t), None) for t in self.host.finished]
                self.host.finished.clear()
                came, self.host.received = self.host.received, []
                error = self.host.error
                if error is not None:  # a message not acknowledged for the run's timeout: every one in flight fails
                    through += [(end, error) for *_, end in self.posts] + [(end, error) for end in self.ends.values()]
                    self.posts.clear()
                    self.ends.clear()
                linger = self._linger_end()
                done = self.stopped or error is not None or (
                    self.closing and not self.host.out and (linger is None or linger <= now))
            for message in came:
                self.deliver(message)
            for end, failed in through:
                end(failed)
            if done:
                self.egress.drain()
                return

    def _linger_end(self) -> float | None:
        """Until when a closing host keeps answering: on lossy links, while frames still come, a few RTOs apart."""
        if not self.closing or not self.host.spec.lossy:
            return None
        return self.heard + min(LINGER_MAX_S, 2 * self.host.rto())

    def close(self, timeout: float | None = None) -> None:
        """Once every message sent is acknowledged (at most the run's timeout, by default), stop and close."""
        with self.lock:
            self.closing = True
        os.write(self.wake_w, b"\0")
        self.thread.join(self.host.spec.timeout + LINGER_MAX_S if timeout is None else timeout)
        if self.thread.is_alive():  # still unacknowledged: stop anyway
            with self.lock:
                self.stopped = True
            os.write(self.wake_w, b"\0")
            self.thread.join()
        self.port.close()
        os.close(self.wake_r)
        os.close(self.wake_w)


def _drained(fd: int) -> bool:
    """Read what waits on the wake-up pipe; whether there was any."""
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


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
