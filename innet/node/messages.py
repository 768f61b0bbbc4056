"""A host's point-to-point messages on a real interface (``HostMessages``): innet.hosts.p2p's ``MessageHost``, the
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
from collections.abc import Callable, Sequence

from innet.hosts.job import JobSpec
from innet.hosts.p2p.host import Message, MessageHost
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
