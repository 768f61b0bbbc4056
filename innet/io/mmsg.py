"""Many frames per system call: recvmmsg and sendmmsg over rows of one numpy array.

A ``FrameBuffer`` holds ``rows`` frames of up to ``stride - 2`` bytes, frame k at
``buf[k, 2:]`` (so the int32 payload at frame offset 58 is 4-byte aligned), with
the ``iovec`` and ``mmsghdr`` arrays the kernel reads built once, as numpy
structured arrays: a receive or a send of a whole batch is one ctypes call and
a few vectorised assignments, with no Python work per frame.
"""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

ALIGN = 2
MSG_DONTWAIT = 0x40
STAMP_BYTES = 32  # CMSG_SPACE(struct timespec): a cmsghdr (len, level, type) then the seconds and nanoseconds
SOL_SOCKET, SCM_TIMESTAMPNS = 1, 35
IOVEC = np.dtype([("base", "<u8"), ("len", "<u8")])
MMSGHDR = np.dtype({  # struct mmsghdr on 64-bit Linux: struct msghdr (56 bytes), unsigned msg_len, padding
    "names": ["name", "namelen", "iov", "iovlen", "control", "controllen", "flags", "len"],
    "formats": ["<u8", "<u4", "<u8", "<u8", "<u8", "<u8", "<i4", "<u4"],
    "offsets": [0, 8, 16, 24, 32, 40, 48, 56],
    "itemsize": 64,
})

_libc = ctypes.CDLL(None, use_errno=True)
_libc.recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]


class FrameBuffer:
    def __init__(self, rows: int, stride: int) -> None:
        stride = -(-(stride + ALIGN) // 64) * 64
        self.buf = np.zeros((rows, stride), np.uint8)
        self.frames = self.buf[:, ALIGN:]  # frame k is frames[k, :lengths[k]]
        self.lengths = np.zeros(rows, np.int64)
        self.iov = np.zeros(rows, IOVEC)
        self.iov["base"] = self.buf.ctypes.data + ALIGN + stride * np.arange(rows, dtype=np.uint64)
        self.iov["len"] = stride - ALIGN
        self.msgs = np.zeros(rows, MMSGHDR)
        self.msgs["iov"] = self.iov.ctypes.data + IOVEC.itemsize * np.arange(rows, dtype=np.uint64)
        self.msgs["iovlen"] = 1
        self.control: np.ndarray | None = None  # each row's receive timestamp's cmsg, once ``stamp()``
        self.stamps = np.zeros(rows)  # each frame received's kernel timestamp (CLOCK_REALTIME seconds; 0: none)

    def stamp(self) -> None:
        """Read each frame's receive timestamp too (the socket must have SO_TIMESTAMPNS set): ``stamps``."""
        self.control = np.zeros((self.rows, STAMP_BYTES // 8), np.int64)
        self.msgs["control"] = self.control.ctypes.data + STAMP_BYTES * np.arange(self.rows, dtype=np.uint64)

    @property
    def rows(self) -> int:
        return len(self.buf)

    def recv(self, fd: int, most: int = 0) -> int:
        """Receive up to ``most`` (all ``rows`` when 0) queued frames without blocking; return how many."""
        self.iov["len"] = self.buf.shape[1] - ALIGN
        if self.control is not None:
            self.msgs["controllen"] = STAMP_BYTES
        n = _libc.recvmmsg(fd, self.msgs.ctypes.data, min(most or self.rows, self.rows), MSG_DONTWAIT, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(err, os.strerror(err))
        self.lengths[:n] = self.msgs["len"][:n]
        if self.control is not None:
            self._stamps(n)
        return n

    def _stamps(self, n: int) -> None:
        """The timestamps of the ``n`` frames just received, from their control messages (0 where none came)."""
        assert self.control is not None
        ctl = self.control[:n]
        words = self.control.view(np.int32)[:n]  # the cmsghdr's level and type are its 3rd and 4th
        ok = (self.msgs["controllen"][:n] >= STAMP_BYTES) & (words[:, 2] == SOL_SOCKET) & (words[:, 3] == SCM_TIMESTAMPNS)
        self.stamps[:n] = np.where(ok, ctl[:, 2] + ctl[:, 3] * 1e-9, 0.0)
        self.msgs["controllen"][:n] = STAMP_BYTES  # the kernel wrote each one's length: room for the next

    def send_block(self, fd: int, block: np.ndarray, start: int, count: int) -> int:
        """sendmmsg rows ``start .. start+count-1`` of ``block`` (equal-length frames, one per row, rows
        contiguous but at any stride: e.g. a view of a receive buffer) from where they are, without a copy;
        how many the kernel took (0 when its queue is full). Uses this buffer's headers, not its rows."""
        count = min(count, self.rows)
        data, stride = block.ctypes.data, block.strides[0]
        self.iov["base"][:count] = data + stride * np.arange(start, start + count, dtype=np.uint64)
        self.iov["len"][:count] = block.shape[1]
        return self._sendmmsg(fd, 0, count)

    def load(self, block: np.ndarray, at: int = 0) -> None:
        """Copy the equal-length frames of ``block`` (one per row) into rows ``at``... for sending."""
        n, length = block.shape
        self.frames[at:at + n, :length] = block
        self.lengths[at:at + n] = length

    def send(self, fd: int, start: int, count: int) -> int:
        """sendmmsg rows ``start .. start+count-1``; return how many the kernel took (0 when its queue is full)."""
        self.iov["len"][start:start + count] = self.lengths[start:start + count]
        return self._sendmmsg(fd, start, count)

    def _sendmmsg(self, fd: int, start: int, count: int) -> int:
        """sendmmsg this buffer's headers ``start .. start+count-1`` as they are set; how many the kernel took."""
        n = _libc.sendmmsg(fd, self.msgs.ctypes.data + start * MMSGHDR.itemsize, count, MSG_DONTWAIT)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.ENOBUFS, errno.EINTR):
                return 0
            raise OSError(err, os.strerror(err))
        return n
