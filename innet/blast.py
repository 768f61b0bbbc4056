"""Send pre-built frames as fast as the kernel takes them, with sendmmsg (for benchmarks).

``python -m innet.blast IFACE[,IFACE...] --seconds S --kind forward|sum ...`` runs inside
a Mininet host: it builds the frames once, then hands the kernel batches of up
to 256 with one sendmmsg each, round-robin over its interfaces, and prints how
many it sent. One process drives all of a benchmark's "workers", in lockstep.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np

from innet.packet import HEADER_OFFSET, ROUTE, VER, make_packet
from innet.rawport import RawPort

_libc = ctypes.CDLL(None, use_errno=True)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(_IoVec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


class MultiSender:
    """sendmmsg of many frames held in one contiguous buffer."""

    def __init__(self, frames: list[bytes]) -> None:
        self.buffer = ctypes.create_string_buffer(b"".join(frames))
        self.iov = (_IoVec * len(frames))()
        self.msgs = (_MMsgHdr * len(frames))()
        offset, base = 0, ctypes.addressof(self.buffer)
        for i, frame in enumerate(frames):
            self.iov[i].base, self.iov[i].len = base + offset, len(frame)
            self.msgs[i].hdr.iov = ctypes.pointer(self.iov[i])
            self.msgs[i].hdr.iovlen = 1
            offset += len(frame)
        self.count = len(frames)

    def advance_chunks(self, delta: int) -> None:
        """Add ``delta`` to every frame's chunk number (all frames the same size), so a replay is new data."""
        size = self.iov[0].len
        view = np.ndarray((self.count,), ">u4", np.frombuffer(memoryview(self.buffer).cast("B"), np.uint8), HEADER_OFFSET + 8, (size,))
        view += np.uint32(delta)

    def send(self, fd: int, start: int = 0, count: int | None = None) -> int:
        n = self.count - start if count is None else count
        sent = _libc.sendmmsg(fd, ctypes.byref(self.msgs, start * ctypes.sizeof(_MMsgHdr)), n, 0)
        return max(sent, 0)


def frames_for(kind: str, srcs: list[int], dst: int, slots: int, elements: int, rounds: int) -> list[list[bytes]]:
    """Per interface, the frames to send: routed data from ``srcs[0]`` (forward), or rank r's contributions
    from node ``srcs[r]`` to its switch ``dst`` (sum)."""
    values = np.arange(elements, dtype=np.int32)
    workers = len(srcs)
    if kind == "forward":
        return [[make_packet(values, job=1, flags=ROUTE, chunk=c).to_frame(srcs[0], dst) for c in range(rounds)]]
    out = []
    for rank in range(workers):
        out.append([make_packet(values, job=1, rank=rank, nworkers=workers, slot=c % slots, chunk=c + 1,
                                flags=VER if (c + 1) // slots % 2 else 0).to_frame(srcs[rank], dst)
                    for c in range(rounds)])
    return out


CLONE_NEWNET = 0x40000000


def open_port(where: str) -> RawPort:
    """``IFACE`` here, or ``PID:IFACE`` inside the network namespace of process PID (a Mininet host)."""
    if ":" not in where:
        return RawPort(where)
    pid, iface = where.split(":", 1)
    with open("/proc/self/ns/net", "rb") as home, open(f"/proc/{pid}/ns/net", "rb") as there:
        if _libc.setns(there.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter the namespace of process {pid}")
        try:
            return RawPort(iface)  # the socket stays in that namespace
        finally:
            _libc.setns(home.fileno(), CLONE_NEWNET)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("ifaces", help="comma-separated IFACE or PID:IFACE, one per worker rank")
    p.add_argument("--kind", choices=("forward", "sum"), default="forward")
    p.add_argument("--src", required=True, help="comma-separated node index of each sender")
    p.add_argument("--dst", type=int, required=True)
    p.add_argument("--elements", type=int, default=256)
    p.add_argument("--slots", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4096,
                   help="chunks prepared (a multiple of 2 x slots), replayed with new chunk numbers")
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    names = args.ifaces.split(",")
    ports = [open_port(n) for n in names]
    srcs = [int(x) for x in args.src.split(",")]
    per_port = frames_for(args.kind, srcs, args.dst, args.slots, args.elements, args.rounds)
    senders = [MultiSender(frames) for frames in per_port]
    batch = 64
    sent, end = 0, time.monotonic() + args.seconds
    start = time.monotonic()
    position = 0
    while time.monotonic() < end:
        for port, sender in zip(ports, senders, strict=True):
            sent += sender.send(port.fileno(), position, min(batch, sender.count - position))
        position = (position + batch) % senders[0].count
        if position == 0 and args.kind == "sum":  # a new pass: new chunks, same slots and versions
            for sender in senders:
                sender.advance_chunks(args.rounds)
    print(f"sent {sent} {time.monotonic() - start:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
