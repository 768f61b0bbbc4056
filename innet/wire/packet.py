"""The innet gradient packet: one declaration of its header (``HEADER_DTYPE``), and the views of it.

A gradient frame is Ether / IPv4 / UDP(dport=AGG_PORT) / InnetAgg / payload, where
the payload is ``count`` little-endian int32 values (fixed-point gradients). ``HEADER_DTYPE``
below is the only declaration of the header: the fast path's numpy view is it, and scapy's layer
(``InnetAgg`` in innet.wire.layer, with ``to_scapy`` and ``scapy_frame``) is built from it there,
apart, so a process that only moves frames never loads scapy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

AGG_PORT = 48879
ALL_RANKS = 0xFFFF  # ``rank`` of a result multicast to every contributor
FLAG_NAMES = ["RESULT", "RETX", "ROUTE", "OVERFLOW", "VER", "SPARSE", "FALLBACK", "ABORT"]
FLAGS = {name: 1 << bit for bit, name in enumerate(FLAG_NAMES)}
RESULT, RETX, ROUTE, OVERFLOW, VER, SPARSE, FALLBACK, ABORT = (FLAGS[n] for n in FLAG_NAMES)


HEADER_DTYPE = np.dtype([  # the header, in network byte order: 16 bytes (innet.wire.layer's scapy view is built from it)
    ("job", ">u2"), ("rank", ">u2"), ("nworkers", ">u2"), ("slot", ">u2"), ("chunk", ">u4"), ("count", ">u2"),
    ("flags", "u1"), ("exp", "i1"),
])
HEADER_NAMES: tuple[str, ...] = HEADER_DTYPE.names  # type: ignore[assignment]
HEADER_LEN = HEADER_DTYPE.itemsize
VALUE_DTYPE = np.dtype("<i4")
ETH_LEN, IP_LEN, UDP_LEN = 14, 20, 8
HEADER_OFFSET = ETH_LEN + IP_LEN + UDP_LEN
PAYLOAD_OFFSET = HEADER_OFFSET + HEADER_LEN
FLAGS_OFFSET = HEADER_OFFSET + HEADER_DTYPE.fields["flags"][1]  # type: ignore[index]
ETHERTYPE_IPV4 = 0x0800
BANDS = 3  # strict-priority queues per port (pfifo_fast's three); a frame's band travels as its DSCP (0: most urgent)
TOS_OFFSET = ETH_LEN + 1
ETH_MTU, JUMBO_MTU = 1500, 9000
MAX_PACKET_ELEMENTS = (JUMBO_MTU + ETH_LEN - PAYLOAD_OFFSET) // 4  # 2239: the most values a jumbo frame holds


def link_mtu(elements: int) -> int:
    """The MTU (bytes after the Ethernet header) links need for frames of ``elements`` values: Ethernet's 1500
    unless the frames are longer."""
    return max(ETH_MTU, PAYLOAD_OFFSET + 4 * elements - ETH_LEN)


# Fixed-offset view of the Ethernet/IPv4/UDP prefix the fast path checks.
PREFIX_DTYPE = np.dtype(
    {
        "names": ["eth_dst", "eth_src", "ethertype", "ver_ihl", "tos", "ip_len", "proto", "ip_src", "ip_dst", "dport",
                  "udp_len"],
        "formats": ["V6", "V6", ">u2", "u1", "u1", ">u2", "u1", ">u4", ">u4", ">u2", ">u2"],
        "offsets": [0, 6, 12, 14, TOS_OFFSET, 16, 23, 26, 30, 36, 38],
        "itemsize": HEADER_OFFSET,
    }
)


GROUP_BASE = 0x8000  # node indices from here on are multicast groups (10.77.128.1 on)
INPUT_JOB = 0xFFFF  # the job number of an ensemble's input frames (innet.hosts.ensemble): no training job has it
P2P_JOB = 0xFFFD  # the job number of point-to-point messages' frames (innet.hosts.p2p), which switches count apart
# per port (innet.switch.runtime.PortStats); no training job has it (background's is 0xFFFE)


def node_mac(index: int) -> bytes:
    """The MAC address innet gives node ``index`` (locally administered; a group's has the multicast bit)."""
    return bytes([0x03 if index >= GROUP_BASE else 0x02, 0x69, 0x6E, 0x00, (index >> 8) & 0xFF, index & 0xFF])


def node_ip(index: int) -> int:
    """The IPv4 address (as an int) innet gives node ``index``: 10.77.x.y."""
    return (10 << 24) | (77 << 16) | (index + 1)


def ip_str(addr: int) -> str:
    return ".".join(str((addr >> s) & 0xFF) for s in (24, 16, 8, 0))


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack("!10H", header))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


_prefix_cache: dict[tuple[int, int, int, int], bytes] = {}


def band_of(tos: Any) -> Any:
    """The priority band a frame's IPv4 TOS byte (or an array of them) names: its DSCP, capped at the last band."""
    return min(tos >> 2, BANDS - 1) if isinstance(tos, int) else np.minimum(tos >> 2, BANDS - 1)


def frame_prefix(src: int, dst: int, payload_len: int, band: int = 0) -> bytes:
    """Ethernet + IPv4 + UDP headers from node ``src`` to node ``dst``, DSCP ``band`` (cached)."""
    key = (src, dst, payload_len, band)
    prefix = _prefix_cache.get(key)
    if prefix is None:
        ip_total = IP_LEN + UDP_LEN + payload_len
        ip = struct.pack("!BBHHHBBHII", 0x45, band << 2, ip_total, 0, 0x4000, 64, 17, 0, node_ip(src), node_ip(dst))
        ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
        udp = struct.pack("!HHHH", AGG_PORT, AGG_PORT, UDP_LEN + payload_len, 0)
        prefix = node_mac(dst) + node_mac(src) + struct.pack("!H", ETHERTYPE_IPV4) + ip + udp
        if len(_prefix_cache) > 65536:
            _prefix_cache.clear()
        _prefix_cache[key] = prefix
    return prefix


@dataclass
class Packet:
    """A parsed gradient packet: header record, values, and where it came from.

    ``hdr`` is a ``HEADER_DTYPE`` record; header fields read as attributes
    (``pkt.slot``, ``pkt.chunk``...). ``values`` is an int32 array (a view into
    the frame for received packets). ``port`` is the ingress port, ``src`` and
    ``dst`` the node indices from the IPv4 addresses, ``band`` the priority band
    its DSCP carried.
    """

    hdr: np.ndarray
    values: np.ndarray
    port: int = -1
    src: int = -1
    dst: int = -1
    band: int = 0

    def __getattr__(self, name: str) -> Any:
        if name in HEADER_NAMES:
            return int(self.hdr[name])
        if name == "hdr" and "_frame" in self.__dict__:  # a received packet's header, made when first asked for
            hdr = self.hdr = np.frombuffer(self.__dict__["_frame"], HEADER_DTYPE, 1, HEADER_OFFSET)[0]
            return hdr
        raise AttributeError(name)

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)

    @property
    def version(self) -> int:
        return 1 if self.has(VER) else 0

    def replace(self, values: np.ndarray | None = None, **fields: int) -> Packet:
        """A new packet with some header fields (and optionally values) changed."""
        hdr = self.hdr.copy()
        for name, value in fields.items():
            hdr[name] = value
        vals = self.values if values is None else values
        hdr["count"] = len(vals)
        return Packet(hdr, vals, self.port, self.src, self.dst, self.band)

    def payload(self) -> bytes:
        """The header and values as the wire carries them (what follows the UDP header)."""
        return self.hdr.tobytes() + np.ascontiguousarray(self.values, VALUE_DTYPE).tobytes()

    def to_frame(self, src: int, dst: int, band: int = 0) -> bytes:
        """Serialise as a full Ethernet frame from node ``src`` to node ``dst``, in priority ``band``."""
        payload = self.payload()
        return frame_prefix(src, dst, len(payload), band) + payload


def make_packet(values: np.ndarray | None = None, **fields: int) -> Packet:
    """Build a packet from header field values; ``count`` follows ``values``."""
    hdr = np.zeros((), HEADER_DTYPE)
    for name, value in fields.items():
        hdr[name] = value
    vals = np.zeros(0, VALUE_DTYPE) if values is None else np.asarray(values, VALUE_DTYPE)
    hdr["count"] = len(vals)
    return Packet(hdr, vals)


def ip_to_node(addr: int) -> int:
    return (addr & 0xFFFF) - 1 if (addr >> 16) == (10 << 8 | 77) else -1


_STRUCT_CODES = {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i"}
# The prefix fields parse_frame tests (ethertype, ver_ihl, tos, proto, ip_src, ip_dst, dport, udp_len) at
# PREFIX_DTYPE's offsets, then the header's fields in HEADER_DTYPE's order: a frame's first PAYLOAD_OFFSET bytes.
FRAME_STRUCT = struct.Struct("!12xHBB7xB2xII2xHH2x" + "".join(
    _STRUCT_CODES[HEADER_DTYPE.fields[name][0].str[1:]] for name in HEADER_NAMES))  # type: ignore[index]
assert FRAME_STRUCT.size == PAYLOAD_OFFSET
_COUNT = 8 + HEADER_NAMES.index("count")


def frame_fields(frame: bytes) -> tuple[int, ...] | None:
    """``parse_frame``'s test and fields as plain ints, without numpy (one frame's fast path):
    (src, dst, band, *the header's fields in HEADER_DTYPE's order), or None when it is not an innet frame."""
    if len(frame) < PAYLOAD_OFFSET:
        return None
    fields = FRAME_STRUCT.unpack_from(frame)
    payload = 4 * fields[_COUNT]
    if (fields[0] != ETHERTYPE_IPV4 or fields[1] != 0x45 or fields[3] != 17 or fields[6] != AGG_PORT
            or len(frame) < PAYLOAD_OFFSET + payload or fields[7] != UDP_LEN + HEADER_LEN + payload):
        return None
    return (ip_to_node(fields[4]), ip_to_node(fields[5]), min(fields[2] >> 2, BANDS - 1), *fields[8:])


def parse_frame(frame: bytes, port: int = -1) -> Packet | None:
    """Parse a frame into a Packet, or None when it is not a well-formed innet frame.

    The header's fields are also set on the packet as plain ints (``pkt.chunk`` then reads no numpy):
    a received packet's ``hdr`` is a read-only view of the frame, so they cannot go stale. That view is
    made only when something asks for it (a switch folds most contributions without it)."""
    fields = frame_fields(frame)
    if fields is None:
        return None
    src, dst, band, *header = fields
    pkt = Packet.__new__(Packet)  # Packet(hdr, ...) with hdr left to __getattr__
    attrs = pkt.__dict__
    attrs.update(zip(HEADER_NAMES, header, strict=True))
    attrs["values"] = np.frombuffer(frame, VALUE_DTYPE, header[_COUNT - 8], PAYLOAD_OFFSET)
    attrs["port"], attrs["src"], attrs["dst"], attrs["band"], attrs["_frame"] = port, src, dst, band, frame
    return pkt


@dataclass
class FrameBlock:
    """A block of received frames parsed at once: ``frames[k, :lengths[k]]`` is frame k.

    ``ok`` marks the well-formed innet frames (the same test as ``parse_frame``);
    ``hdr``, ``src``, ``dst``, ``band`` are meaningful where ``ok``. ``frames`` rows should
    start 2 bytes past a 4-byte boundary so the int32 payload views are aligned.
    """

    frames: np.ndarray
    lengths: np.ndarray
    ok: np.ndarray
    hdr: np.ndarray
    pre: np.ndarray  # the Ethernet, IPv4 and UDP headers (PREFIX_DTYPE)

    @cached_property
    def src(self) -> np.ndarray:
        return _nodes(self.pre["ip_src"])

    @cached_property
    def dst(self) -> np.ndarray:
        return _nodes(self.pre["ip_dst"])

    @cached_property
    def band(self) -> np.ndarray:
        return band_of(self.pre["tos"].astype(np.int64))

    def values(self, rows: np.ndarray | slice, count: int) -> np.ndarray:
        """The (len(rows), count) int32 payloads of ``rows`` (a copy when rows is an index array)."""
        return self.frames[rows, PAYLOAD_OFFSET:PAYLOAD_OFFSET + 4 * count].view(VALUE_DTYPE)

    def frame(self, k: int) -> bytes:
        return self.frames[k, : self.lengths[k]].tobytes()


def pack_frames(frames: list[bytes], stride: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Frames copied into rows of one aligned array (as a receive buffer holds them), and their lengths."""
    stride = max(stride, PAYLOAD_OFFSET, *(len(f) for f in frames)) + 2 + 3 & ~3
    buf = np.zeros((len(frames), stride), np.uint8)
    for k, frame in enumerate(frames):
        buf[k, 2 : 2 + len(frame)] = np.frombuffer(frame, np.uint8)
    return buf[:, 2:], np.array([len(f) for f in frames], np.int64)


def _nodes(addrs: np.ndarray) -> np.ndarray:
    return np.where(addrs >> 16 == (10 << 8 | 77), (addrs & 0xFFFF).astype(np.int64) - 1, -1)


def parse_block(frames: np.ndarray, lengths: np.ndarray) -> FrameBlock:
    """Parse ``frames[k, :lengths[k]]`` for every row k with a few numpy calls."""
    pre = frames[:, :HEADER_OFFSET].view(PREFIX_DTYPE)[:, 0]
    hdr = frames[:, HEADER_OFFSET:PAYLOAD_OFFSET].view(HEADER_DTYPE)[:, 0]
    payload = 4 * hdr["count"].astype(np.int64)
    ok = (
        (lengths >= PAYLOAD_OFFSET)
        & (pre["ethertype"] == ETHERTYPE_IPV4)
        & (pre["ver_ihl"] == 0x45)
        & (pre["proto"] == 17)
        & (pre["dport"] == AGG_PORT)
        & (lengths >= PAYLOAD_OFFSET + payload)
        & (pre["udp_len"] == UDP_LEN + HEADER_LEN + payload)
    )
    return FrameBlock(frames, lengths, ok, hdr, pre)


def build_frames(src: int | np.ndarray, dst: int | np.ndarray, hdr: np.ndarray, values: np.ndarray,
                 band: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """``len(hdr)`` frames from node ``src`` to ``dst`` (or ``src[k]`` to ``dst[k]``), in priority
    ``band``, as one (n, frame length) uint8 array (``out``, if given)."""
    n, count = values.shape
    if out is None:
        out = np.empty((n, PAYLOAD_OFFSET + 4 * count), np.uint8)
    frame_heads(src, dst, hdr, count, band, out)
    out[:, PAYLOAD_OFFSET:] = np.ascontiguousarray(values, VALUE_DTYPE).view(np.uint8).reshape(n, 4 * count)
    return out


def frame_heads(src: int | np.ndarray, dst: int | np.ndarray, hdr: np.ndarray, count: int, band: int,
                out: np.ndarray) -> None:
    """``build_frames``' headers alone (Ethernet, IPv4, UDP and innet's) into ``out``'s rows, for frames of ``count``
    values: a worker writes them before it knows its values (innet.hosts.worker.framing)."""
    n = len(hdr)
    one: tuple[int, int] | None = None  # the one (src, dst) pair of every frame
    if isinstance(src, (int, np.integer)) and isinstance(dst, (int, np.integer)):
        one = int(src), int(dst)
    elif n:
        src, dst = np.broadcast_to(src, (n,)), np.broadcast_to(dst, (n,))
        if ((src != src[0]) | (dst != dst[0])).any():  # a prefix per (src, dst) pair
            pair = src.astype(np.int64) << 32 | dst.astype(np.int64) & 0xFFFFFFFF  # one integer per pair
            pairs, which = np.unique(pair, return_inverse=True)
            prefixes = np.array([np.frombuffer(frame_prefix(p >> 32, (p & 0xFFFFFFFF ^ 1 << 31) - (1 << 31),
                                                            HEADER_LEN + 4 * count, band), np.uint8) for p in pairs.tolist()])
            out[:, :HEADER_OFFSET] = prefixes[which.ravel()]
        else:
            one = int(src[0]), int(dst[0])
    if n and one is not None:
        out[:, :HEADER_OFFSET] = np.frombuffer(frame_prefix(*one, HEADER_LEN + 4 * count, band), np.uint8)
    out[:, HEADER_OFFSET:PAYLOAD_OFFSET] = np.ascontiguousarray(hdr, HEADER_DTYPE).view(np.uint8).reshape(n, HEADER_LEN)

