"""The call plane: how an ``innet`` group's ranks hand their collective calls to the group's rank 0, which runs them
on the fabric, and get their results back (innet.integrations.torch.group).

Each rank other than 0 keeps one TCP connection to rank 0 for the group's life (rank 0 listens on the address it
reaches MASTER_ADDR from, and says where in the group's store). A call is a ``Call`` (what it is) and this rank's
flat values; a rank's calls travel in the order it makes them, as many as are waiting in one message, and come back
in that order, each a ``Result`` and this rank's values. Rank 0 takes call k of every rank together: once every rank
has made its calls up to k + m, the m + 1 calls go to ``run`` at once (``Runner``), so a rank that issues thousands
of small calls without waiting costs a message now and then, not a round trip each.

A message: two big-endian uint32 lengths (the header's, the values'), the header (JSON: a list of ``Call`` or
``Result``, innet.node.codec) and the values of each, one after the other.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from innet.node import codec

LENGTHS = struct.Struct("!II")
POINT_TO_POINT = ("send", "recv")
KEY = "innet-call-plane"  # in the group's store: where rank 0 listens


@dataclass(frozen=True)
class Call:
    """One collective call of one rank: innet's name of it (allreduce, reduce_scatter, reduce, all_gather, broadcast,
    barrier, all_to_all, gather, scatter), the operator (innet's name: sum, avg, min, max, band, bor, prod; "bits"
    for values only moved), the root, and its values' dtype and count. A send or recv (``POINT_TO_POINT``): ``root``
    the peer (-1: any), its ``tag``, and the rank's ``ticket`` for it (its result comes when it ends, not in order)."""

    name: str
    op: str
    root: int
    dtype: str
    count: int
    tag: int = 0
    ticket: int = -1


@dataclass(frozen=True)
class Result:
    """A call's result for one rank: its values' dtype and count (count -1: none, as a reduce's non-root gets), or
    the error that ended the call."""

    dtype: str = ""
    count: int = -1
    error: str = ""
    ticket: int = -1  # a send's or recv's (``Call.ticket``)
    source: int = -1  # a recv's: the rank the message came from


Done = Callable[[Result, "np.ndarray | None"], None]  # a call's end on its rank: the result, its values
Run = Callable[[list[list[tuple[Call, np.ndarray]]]], list[list[tuple[Result, "np.ndarray | None"]]]]
# rank 0's: calls k..k+m of every rank (the outer list over calls, the inner over ranks) -> every rank's results


def send_message(sock: socket.socket, records: list[Any], values: list[np.ndarray | None]) -> None:
    head = json.dumps([codec.to_json(r) for r in records]).encode()
    body = b"".join(np.ascontiguousarray(v).tobytes() for v in values if v is not None)
    sock.sendall(LENGTHS.pack(len(head), len(body)) + head + body)


def _exactly(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        part = sock.recv(min(n - len(got), 1 << 20))
        if not part:
            raise ConnectionError("the connection closed")
        got += part
    return bytes(got)


def read_message(sock: socket.socket, cls: type[Call] | type[Result]) -> list[tuple[Any, np.ndarray | None]]:
    """A message's records, each with its values (None for a ``Result`` of count -1)."""
    head_len, body_len = LENGTHS.unpack(_exactly(sock, LENGTHS.size))
    records = [codec.from_json(cls, r) for r in json.loads(_exactly(sock, head_len))]
    body = memoryview(_exactly(sock, body_len))
    out: list[tuple[Any, np.ndarray | None]] = []
    at = 0
    for record in records:
        if record.count < 0:
            out.append((record, None))
            continue
        dtype = np.dtype(record.dtype)
        out.append((record, np.frombuffer(body[at : at + record.count * dtype.itemsize], dtype).copy()))
        at += record.count * dtype.itemsize
    return out


def listen_address() -> str:
    """The address rank 0 listens on: the one this host reaches MASTER_ADDR from (loopback when it is local; on
    Mininet, the host's own), without sending anything."""
    toward = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((toward, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class Client:
    """A rank's (not rank 0's) end: its calls go out in order, from the callers' threads, as many a message as
    were made while the last was being sent; each result ends its call (``Done``), in order."""

    def __init__(self, store: Any, rank: int) -> None:
        host, port = store.get(KEY).decode().rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(struct.pack("!I", rank))
        self.lock = threading.Condition()
        self.outbox: deque[tuple[Call, np.ndarray]] = deque()
        self.waiting: deque[Done] = deque()
        self.tickets: dict[int, Done] = {}  # the sends and receives not yet ended
        self.ticket = 0
        self.closed = ""  # why no more calls can end (the connection's end)
        self.sending = False  # a caller is sending: the calls made meanwhile go with its next message
        threading.Thread(target=self._receive, name=f"innet-calls-in{rank}", daemon=True).start()

    def submit(self, call: Call, values: np.ndarray, done: Done) -> None:
        """Send the call, with those made while this rank was sending (a caller that finds a send under way leaves
        its call to it)."""
        with self.lock:
            if self.closed:
                done(Result(error=self.closed), None)
                return
            if call.name in POINT_TO_POINT:
                self.ticket += 1
                call = replace(call, ticket=self.ticket)
                self.tickets[call.ticket] = done
            else:
                self.waiting.append(done)
            self.outbox.append((call, values))
            if self.sending:
                return
            self.sending = True
        while True:
            with self.lock:
                batch = list(self.outbox)
                self.outbox.clear()
                if not batch or self.closed:
                    self.sending = False
                    return
            try:
                send_message(self.sock, [c for c, _ in batch], [v for _, v in batch])
            except OSError as exc:
                with self.lock:
                    self.sending = False
                self._close(f"innet: the call plane to rank 0 failed: {exc}")
                return

    def _receive(self) -> None:
        try:
            while True:
                for result, values in read_message(self.sock, Result):
                    with self.lock:
                        done = self.tickets.pop(result.ticket) if result.ticket >= 0 else self.waiting.popleft()
                    done(result, values)
        except (OSError, ConnectionError, IndexError, KeyError) as exc:
            self._close(f"innet: the call plane to rank 0 closed ({exc})")

    def _close(self, why: str) -> None:
        with self.lock:
            if not self.closed:
                self.closed = why
            waiting = list(self.waiting) + list(self.tickets.values())
            self.waiting.clear()
            self.tickets.clear()
            self.lock.notify_all()
        for done in waiting:
            done(Result(error=why), None)

    def close(self) -> None:
        self._close("innet: the process group was shut down")
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


Handle = Callable[[int, Call, np.ndarray, Done], None]  # rank 0's: a rank's send or recv, ended by ``Done`` when it is


class Runner:
    """Rank 0's end: every rank's calls, taken together call by call (``run``), each rank's results sent back; its
    sends and receives handed to ``handle`` as they come, each result sent back when it ends."""

    def __init__(self, store: Any, size: int, run: Run, handle: Handle | None = None) -> None:
        self.size, self.run, self.handle = size, run, handle
        self.listener = socket.create_server((listen_address(), 0), backlog=max(16, size))
        host, port = self.listener.getsockname()[:2]
        self.queues: list[deque[tuple[Call, np.ndarray]]] = [deque() for _ in range(size)]
        self.mine: deque[Done] = deque()  # rank 0's own calls' ends, in order
        self.peers: dict[int, socket.socket] = {}
        self.sending: dict[int, threading.Lock] = {}  # one message at a time on each peer's connection
        self.lock = threading.Condition()
        self.closed = ""
        store.set(KEY, f"{host}:{port}")
        threading.Thread(target=self._accept, name="innet-calls-accept", daemon=True).start()
        threading.Thread(target=self._serve, name="innet-calls-run", daemon=True).start()

    def submit(self, call: Call, values: np.ndarray, done: Done) -> None:
        if call.name in POINT_TO_POINT and self.handle is not None:
            self.handle(0, call, values, done)
            return
        with self.lock:
            if self.closed:
                done(Result(error=self.closed), None)
                return
            self.queues[0].append((call, values))
            self.mine.append(done)
            self.lock.notify_all()

    def _accept(self) -> None:
        while len(self.peers) < self.size - 1:
            try:
                sock, _ = self.listener.accept()
                rank = struct.unpack("!I", _exactly(sock, 4))[0]
            except (OSError, ConnectionError):
                return  # closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.peers[rank] = sock
                self.sending[rank] = threading.Lock()
            threading.Thread(target=self._read, args=(rank, sock), name=f"innet-calls-from{rank}", daemon=True).start()
        self.listener.close()

    def _read(self, rank: int, sock: socket.socket) -> None:
        try:
            while True:
                got = [(c, v if v is not None else np.zeros(0)) for c, v in read_message(sock, Call)]
                for call, values in got:
                    if call.name in POINT_TO_POINT and self.handle is not None:
                        self.handle(rank, call, values, partial(self._reply, rank, call.ticket))
                with self.lock:
                    self.queues[rank].extend((c, v) for c, v in got if c.name not in POINT_TO_POINT)
                    self.lock.notify_all()
        except (OSError, ConnectionError):
            with self.lock:
                if not self.closed:
                    self.closed = f"innet: rank {rank} left the process group (its call plane closed)"
                self.lock.notify_all()

    def _serve(self) -> None:
        while True:
            with self.lock:
                while not self.closed and not all(self.queues):
                    self.lock.wait()
                if self.closed:
                    break
                k = min(len(q) for q in self.queues)
                calls = [[q.popleft() for q in self.queues] for _ in range(k)]
                ends = [self.mine.popleft() for _ in range(k)]
            try:
                results = self.run(calls)
            except Exception as exc:  # noqa: BLE001 (every rank's call ends with it)
                results = [[(Result(error=f"innet: {exc}"), None)] * self.size for _ in calls]
            for rank, sock in list(self.peers.items()):
                try:
                    with self.sending[rank]:
                        send_message(sock, [r[rank][0] for r in results], [r[rank][1] for r in results])
                except OSError:
                    pass  # its reader says so
            for done, result in zip(ends, results, strict=True):
                done(*result[0])
        with self.lock:
            ends = list(self.mine)
            self.mine.clear()
        for done in ends:
            done(Result(error=self.closed), None)

    def _reply(self, rank: int, ticket: int, result: Result, values: np.ndarray | None) -> None:
        """A send's or recv's end, to its rank."""
        try:
            with self.sending[rank]:
                send_message(self.peers[rank], [replace(result, ticket=ticket)], [values])
        except OSError:
            pass  # its reader says so

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = "innet: the process group was shut down"
            self.lock.notify_all()
        self.listener.close()
        for sock in self.peers.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
