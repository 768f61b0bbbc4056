"""A switch or host port on a real interface: an AF_PACKET raw socket.

Frames are read in batches with recvmmsg (up to ``max_batch`` per system call,
into one numpy array) and sent in batches with sendmmsg; never busy-polled:
callers block in poll() until a port is readable. Frames this socket sends
itself are not looped back (PACKET_IGNORE_OUTGOING).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct
import time

import numpy as np

from innet.io.mmsg import FrameBuffer
from innet.wire.packet import (
    AGG_PORT,
    ETH_LEN,
    HEADER_DTYPE,
    HEADER_OFFSET,
    TOS_OFFSET,
    FrameBlock,
    band_of,
    parse_block,
)

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_IGNORE_OUTGOING = 23
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
SO_TIMESTAMPNS = 35
SO_ATTACH_FILTER = 26
BUFFER_BYTES = 16 << 20
SIOCGIFMTU = 0x8921
FRAME_BYTES = 0x40000  # a socket filter's "keep the frame": up to this many of its bytes (all of any frame here)
# The socket priority that pfifo_fast (the strict-priority qdisc under each link's shaper) puts in band
# 0, 1, 2: TC_PRIO_INTERACTIVE, TC_PRIO_BESTEFFORT, TC_PRIO_BULK by its fixed priomap.
SOCKET_PRIORITY = (6, 0, 2)


class RawPort:
    def __init__(self, ifname: str, max_batch: int = 256, protocol: int = ETH_P_ALL) -> None:
        """``protocol`` ETH_P_IP: the socket hears frames after the port's tc ingress hook (an eBPF switch's),
        where ETH_P_ALL hears them before it."""
        self.name = ifname
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(protocol))
        self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        for opt in (SO_RCVBUFFORCE, SO_SNDBUFFORCE):
            self.sock.setsockopt(socket.SOL_SOCKET, opt, BUFFER_BYTES)
        self.sock.bind((ifname, 0))
        self.sock.setblocking(False)
        self.socket_drops = 0
        self.queued = 0  # frames the kernel queued at this socket (PACKET_STATISTICS), and those read
        self.read = 0
        self.qdisc_waits = 0  # times a send found the link's queue full
        self.band = -1  # none set yet (the socket's priority 0 is pfifo_fast's band 1)
        mtu = struct.unpack("16si", fcntl.ioctl(self.sock, SIOCGIFMTU, struct.pack("16si", ifname.encode(), 0)))[1]
        self.rx = FrameBuffer(max_batch, ETH_LEN + mtu)
        self.tx = FrameBuffer(max_batch, 0)  # send headers only: frames go from where they are

    def keep_slots(self, cores: int, core: int) -> None:
        """Attach a classic BPF filter: deliver only frames whose header slot % cores == core.

        This is how the PBox's shards each get their own keys from one interface.
        """
        slot_offset = HEADER_OFFSET + HEADER_DTYPE.fields["slot"][1]  # type: ignore[index]
        program = [
            (0x28, 0, 0, slot_offset),  # ldh [slot]
            (0x94, 0, 0, cores),        # A %= cores
            (0x15, 0, 1, core),         # if A == core
            (0x06, 0, 0, 0xFFFF),       #   accept
            (0x06, 0, 0, 0),            # else drop
        ]
        self._attach(program)

    def keep_job(self, job: int, keep: bool = True) -> None:
        """Attach a classic BPF filter on innet's frames of ``job`` (IPv4, UDP to AGG_PORT, that job number):
        deliver only those (``keep``), or every frame but those. A host's two ports on one interface split its
        frames so: the point-to-point messages' (innet.integrations.torch.messages.HostMessages), and the rest (the worker client's)."""
        job_offset = HEADER_OFFSET + HEADER_DTYPE.fields["job"][1]  # type: ignore[index]
        match, other = (FRAME_BYTES, 0) if keep else (0, FRAME_BYTES)
        program = [
            (0x28, 0, 0, 12),          # ldh [ethertype]
            (0x15, 0, 7, 0x0800),      # IPv4, else other
            (0x30, 0, 0, 23),          # ldb [protocol]
            (0x15, 0, 5, 17),          # UDP, else other
            (0x28, 0, 0, 36),          # ldh [destination port]
            (0x15, 0, 3, AGG_PORT),    # innet's, else other
            (0x28, 0, 0, job_offset),  # ldh [job]
            (0x15, 0, 1, job),         # the job, else other
            (0x06, 0, 0, match),
            (0x06, 0, 0, other),
        ]
        self._attach(program)

    def _attach(self, program: list[tuple[int, int, int, int]]) -> None:
        """Attach classic BPF ``program`` (code, jt, jf, k per instruction) to the socket."""
        code = b"".join(struct.pack("HBBI", *insn) for insn in program)
        buf = ctypes.create_string_buffer(code)
        fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv_block(self) -> FrameBlock | None:
        """Every frame queued now (up to max_batch), parsed; None when there was none.
        The block's arrays are views of the receive buffer: valid until the next call."""
        frames, lengths = self.recv_rows()
        return parse_block(frames, lengths) if len(lengths) else None

    def recv_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Every frame queued now (up to max_batch), unparsed: ``frames[k, :lengths[k]]`` is frame k
        (views of the receive buffer, valid until the next call; none when nothing was queued)."""
        n = self.rx.recv(self.sock.fileno())
        self.read += n
        return self.rx.frames[:n], self.rx.lengths[:n]

    def recv_batch(self) -> list[bytes]:
        n = self.rx.recv(self.sock.fileno())
        self.read += n
        return [self.rx.frames[k, : self.rx.lengths[k]].tobytes() for k in range(n)]

    def recv_stamped(self) -> list[tuple[float, bytes]]:
        """Every frame queued now (up to max_batch), each with the instant the kernel received it on the
        ``time.monotonic()`` clock (its SO_TIMESTAMPNS, taken on the realtime clock; frames the kernel did not
        stamp, as the first batch read before stamping was asked, get the instant they were read)."""
        self.stamp_receive()
        n = self.rx.recv(self.sock.fileno())
        self.read += n
        now = time.monotonic()
        offset = time.time() - now  # the realtime clock's lead on the monotonic one, now
        return [(min(now, float(self.rx.stamps[k]) - offset) if self.rx.stamps[k] else now,
                 self.rx.frames[k, : self.rx.lengths[k]].tobytes()) for k in range(n)]

    def stamp_receive(self) -> None:
        """Have the kernel stamp every frame this port receives (SO_TIMESTAMPNS), for ``recv_stamped``. Asked as the
        port opens, before a frame can come: the kernel starts stamping frames some time after a socket first asks
        (from a work queue; machine-wide), and reads a frame that came before with the instant it is read. Asked at
        the first read, a worker's first frame, the exponent's answer, began its hold 0.25-0.66 ms late (the
        calibration's eBPF star at 80 Mbit/s: every later frame within 8 us of leaving the switch's port)."""
        if self.rx.control is None:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self.rx.stamp()

    def _set_band(self, tos: int) -> None:
        """Queue what follows in the frame's priority band: set the socket priority pfifo_fast maps to it."""
        band = band_of(tos)
        if band != self.band:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, SOCKET_PRIORITY[band])
            self.band = band

    def send(self, frame: bytes) -> None:
        if len(frame) > TOS_OFFSET:
            self._set_band(frame[TOS_OFFSET])
        while True:
            try:
                self.sock.send(frame)
                return
            except BlockingIOError:  # the qdisc is full: wait for room, never drop silently
                self._wait_for_room()
            except OSError as exc:  # ENOBUFS: the queue refused the frame (as sendmmsg's path, innet.io.mmsg)
                if exc.errno != errno.ENOBUFS:
                    raise
                self._wait_for_room()

    def send_block(self, block: np.ndarray) -> None:
        """Send the equal-length frames of ``block`` (one per row, all of one band), max_batch per sendmmsg."""
        if block.shape[1] > TOS_OFFSET:
            self._set_band(int(block[0, TOS_OFFSET]))
        if block.strides[1] != 1:
            block = np.ascontiguousarray(block)
        done = 0
        while done < len(block):  # from the block's own memory (the kernel copies each frame once)
            sent = self.tx.send_block(self.sock.fileno(), block, done, len(block) - done)
            if sent == 0:  # the qdisc is full: wait for room, never drop silently
                self._wait_for_room()
            done += sent

    QDISC_WAIT = 0.0005

    def _wait_for_room(self) -> None:
        """The link's queue is full. A packet socket stays writable regardless (its send buffer is not
        what filled), so poll() would return at once and spin: sleep a fraction of a millisecond instead."""
        self.qdisc_waits += 1
        time.sleep(self.QDISC_WAIT)

    def statistics(self) -> None:
        """Add the kernel's counts since the last call (it resets them): frames queued at this socket,
        and dropped because its buffer was full (PACKET_STATISTICS counts those among its packets)."""
        packets, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self.queued += packets - drops
        self.socket_drops += drops

    def drops(self) -> int:
        """Frames the kernel dropped because this socket's buffer was full (cumulative)."""
        self.statistics()
        return self.socket_drops

    def backlog(self) -> int:
        """Frames queued at this socket and not read yet, as of the last ``statistics()``."""
        return self.queued - self.read

    def close(self) -> None:
        self.sock.close()

