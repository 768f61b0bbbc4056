"""A host's elastic background inside its namespace: ``python -m innet.node.elastic CONFIG``.

Real kernel TCP (``--background PATTERN:LOAD:tcp`` on Mininet): a sink that accepts its flows' connections and
counts what arrives, and one connection per flow from this host, written at the flow's rate the way the local
fabric's elastic flows are (innet.hosts.elastic): segments of ``SEGMENT`` bytes (``TCP_MAXSEG``: the job's
frame size on the wire), and no writing while ``NOTSENT`` bytes wait unsent (``SIOCOUTQNSD``: what the
application could not write meanwhile is skipped). The kernel's TCP (its congestion control, its window)
does the rest. It runs until SIGTERM, then writes what it did (``ElasticStats``) to the configured path.
"""

from __future__ import annotations

import errno
import fcntl
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

from innet.hosts.elastic import NOTSENT, SEGMENT
from innet.io.sched import prioritized
from innet.node.codec import read, say_ready, write

PORT = 5299  # the sinks' TCP port, on the addresses of the run's own namespaces (innet.backends.mininet.iplane)
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
SIOCOUTQNSD = 0x894B  # linux/sockios.h: a TCP socket's bytes not yet sent
SAMPLE_S = 0.001  # at most one sample of the bytes received per this many seconds (and the last one)
CONNECT_S = 20.0  # a flow's connection is retried this long (the sink's host may start later)


@dataclass(frozen=True)
class ElasticConfig:
    """One host's elastic endpoint: its address, its flows (destination address, payload bits per second of the
    dilated run) and where its stats go."""

    address: str
    flows: tuple[tuple[str, float], ...]
    stats_path: str


@dataclass(frozen=True)
class ElasticStats:
    """What one host's endpoint did: its flows, payload bytes written and received, and (monotonic time, payload
    bytes received by then) samples."""

    flows: int
    offered_bps: float
    sent_bytes: int
    received_bytes: int
    samples: tuple[tuple[float, int], ...]
    retransmissions: int = 0  # the senders' segments sent again (TCP_INFO's total_retrans)


class Sender:
    """One flow: a connection written at ``rate`` bytes per second while the kernel takes it."""

    def __init__(self, dst: str, bps: float, start: float) -> None:
        self.dst, self.rate, self.written_at = dst, bps / 8, start
        self.credit = 0.0
        self.sent = 0
        self.sock: socket.socket | None = None

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SEGMENT)
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, NOTSENT)
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                sock.connect((self.dst, PORT))
                break
            except OSError as exc:
                if exc.errno not in (errno.ECONNREFUSED, errno.ETIMEDOUT) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        sock.setblocking(False)
        self.sock = sock

    def write(self, now: float, payload: bytes) -> None:
        """Write what is due; while the socket will not take it, what falls due is skipped (at most ``NOTSENT``
        waits to be written, as in the fabric's model)."""
        self.credit = min(float(NOTSENT), self.credit + (now - self.written_at) * self.rate)
        self.written_at = now
        while self.sock is not None and self.credit >= SEGMENT and unsent(self.sock) < NOTSENT:
            try:
                n = self.sock.send(payload)
            except BlockingIOError:
                return
            self.sent += n
            self.credit -= n

    def next_write(self) -> float:
        return self.written_at + max(0.0, SEGMENT - self.credit) / self.rate


def unsent(sock: socket.socket) -> int:
    """Bytes written to ``sock`` and not yet sent (``SIOCOUTQNSD``): a write succeeds whenever the send buffer has
    room, so the writer asks this itself (``TCP_NOTSENT_LOWAT`` only gates poll's POLLOUT)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0"))[0])


def retransmissions(sock: socket.socket) -> int:
    """The segments ``sock`` sent again (struct tcp_info's tcpi_total_retrans, at byte 100)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 100)[0]) if len(info) >= 104 else 0


def serve_elastic(conf: ElasticConfig) -> int:
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((conf.address, PORT))
    listener.listen(64)
    listener.setblocking(False)
    say_ready()
    start = time.monotonic()
    senders = [Sender(dst, bps, start) for dst, bps in conf.flows]
    for sender in senders:
        sender.connect()
    payload = bytes(SEGMENT)
    sinks: dict[int, socket.socket] = {}
    received, samples, sampled = 0, [(time.monotonic(), 0)], 0.0
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    try:
        while not stop:
            now = time.monotonic()
            for sender in senders:
                sender.write(now, payload)
            due = min((s.next_write() for s in senders), default=now + 0.05)
            for fd, _ in poller.poll(max(0, min(50, int((due - time.monotonic()) * 1000) + 1))):
                if fd == listener.fileno():
                    conn, _ = listener.accept()
                    conn.setblocking(False)
                    sinks[conn.fileno()] = conn
                    poller.register(conn.fileno(), select.POLLIN)
                    continue
                try:
                    data = sinks[fd].recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    poller.unregister(fd)
                    sinks.pop(fd).close()
                    continue
                received += len(data)
                now = time.monotonic()
                if now - sampled >= SAMPLE_S:
                    samples.append((now, received))
                    sampled = now
    finally:
        samples.append((time.monotonic(), received))
        write(conf.stats_path, ElasticStats(len(senders), sum(s.rate * 8 for s in senders),
                                            sum(s.sent for s in senders), received, tuple(samples),
                                            sum(retransmissions(s.sock) for s in senders if s.sock is not None)))
        for sock in [listener, *sinks.values(), *(s.sock for s in senders if s.sock is not None)]:
            sock.close()
    return 0


def main(argv: list[str]) -> int:
    conf = read(ElasticConfig, argv[0])
    with prioritized():  # as the switches that forward its frames: under the ordinary policy it starved beside them
        return serve_elastic(conf)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["ElasticConfig", "ElasticStats", "serve_elastic"]
