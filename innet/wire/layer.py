"""scapy's view of the innet header: the ``InnetAgg`` layer, built from ``HEADER_DTYPE`` (innet.wire.packet, the one
declaration of the header) and bound to UDP port AGG_PORT, for tests, pcaps and debugging.

It lives apart from the packet's fast path so that a process that only moves frames (a switch, a worker) never loads
scapy: its import costs ~0.35 s of CPU, paid by each of a run's node processes before they did.
"""

from __future__ import annotations

import struct
from typing import Any

from scapy.config import conf
from scapy.fields import (
    Field,
    FieldListField,
    FlagsField,
    IntField,
    LESignedIntField,
    ShortField,
    SignedByteField,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet as ScapyPacket
from scapy.packet import bind_layers

from innet.wire.packet import AGG_PORT, FLAG_NAMES, HEADER_DTYPE, ip_str, node_ip, node_mac

_FIELDS = {">u2": ShortField, ">u4": IntField, "|i1": SignedByteField}  # numpy's str of each header type


def _field(name: str) -> Field[Any, Any]:
    """The scapy field of header field ``name``, from its numpy type."""
    if name == "flags":
        return FlagsField("flags", 0, 8, FLAG_NAMES)
    return _FIELDS[HEADER_DTYPE.fields[name][0].str](name, None if name == "count" else 0)  # type: ignore[index]


class InnetAgg(ScapyPacket):
    """Aggregation header (16 bytes) followed by the element values.

    ``chunk`` is the chunk's sequence number in the job's stream: it grows by
    one per chunk across all-reduce calls, so a stale packet is recognisable;
    the tensor offset is ``(chunk - first_chunk) * elements_per_packet``.
    ``exp`` is the fixed-point exponent (see innet.wire.fixedpoint); the ``VER``
    flag selects the slot's shadow copy.
    """

    name = "InnetAgg"
    fields_desc = [*(_field(name) for name in HEADER_DTYPE.names or ()),
                   FieldListField("values", [], LESignedIntField("", 0), count_from=lambda p: p.count)]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.count is None:
            offset = HEADER_DTYPE.fields["count"][1]  # type: ignore[index]
            pkt = pkt[:offset] + struct.pack("!H", len(self.values)) + pkt[offset + 2:]
        return pkt + pay


bind_layers(UDP, InnetAgg, dport=AGG_PORT)
conf.max_list_count = max(conf.max_list_count, 65535)  # scapy refuses lists over 100 items by default


def to_scapy(frame: bytes) -> Ether:
    """Dissect a frame with scapy (for tests, pcaps and debugging; slow)."""
    return Ether(frame)


def scapy_frame(src: int, dst: int, band: int = 0, **fields: Any) -> bytes:
    """Craft a frame with scapy (the reference the fast path is tested against)."""
    pkt = (
        Ether(dst=node_mac(dst), src=node_mac(src))
        / IP(src=ip_str(node_ip(src)), dst=ip_str(node_ip(dst)), tos=band << 2, flags="DF", id=0, ttl=64)
        / UDP(sport=AGG_PORT, dport=AGG_PORT, chksum=0)
        / InnetAgg(**fields)
    )
    return bytes(pkt)
