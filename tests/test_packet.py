import numpy as np
import pytest
from scapy.fields import FieldListField

from innet.wire.layer import InnetAgg, scapy_frame, to_scapy
from innet.wire.packet import (
    ALL_RANKS,
    HEADER_DTYPE,
    HEADER_LEN,
    PAYLOAD_OFFSET,
    RESULT,
    RETX,
    VER,
    frame_fields,
    make_packet,
    node_ip,
    parse_frame,
)


def test_header_dtype_is_derived_from_the_scapy_layer():
    scapy_names = [f.name for f in InnetAgg.fields_desc if not isinstance(f, FieldListField)]
    assert list(HEADER_DTYPE.names) == scapy_names
    assert HEADER_LEN == len(bytes(InnetAgg(values=[]))) == 16
    assert PAYLOAD_OFFSET == 58


def test_fast_path_frame_is_byte_exact_with_scapy():
    values = [1, -2, 2**31 - 1, -(2**31)]
    crafted = scapy_frame(3, 9, job=7, rank=2, nworkers=4, slot=11, chunk=123456, flags="VER+RETX", exp=-5, values=values)
    built = make_packet(np.array(values), job=7, rank=2, nworkers=4, slot=11, chunk=123456, flags=VER | RETX, exp=-5)
    assert built.to_frame(3, 9) == crafted
    assert crafted.hex()[-32:] == "01000000feffffffffffff7f00000080"  # little-endian int32 payload


def test_parse_agrees_with_scapy_dissection():
    frame = scapy_frame(1, 2, job=1, rank=ALL_RANKS, nworkers=32, slot=5, chunk=2**32 - 1, flags="RESULT", exp=127,
                        values=list(range(-3, 4)))
    pkt = parse_frame(frame, port=4)
    dissected = to_scapy(frame)[InnetAgg]
    for name in HEADER_DTYPE.names:
        assert getattr(pkt, name) == int(getattr(dissected, name)), name
    assert list(pkt.values) == dissected.values == list(range(-3, 4))
    assert pkt.port == 4 and pkt.src == 1 and pkt.dst == 2 and pkt.has(RESULT) and pkt.version == 0
    assert to_scapy(frame)["IP"].dst == "10.77.0.3" and node_ip(2) == (10 << 24 | 77 << 16 | 3)


def test_full_size_packets_dissect():
    frame = make_packet(np.arange(1024), job=1).to_frame(0, 1)
    assert list(to_scapy(frame)[InnetAgg].values) == list(range(1024))


def test_ip_checksum_is_valid():
    frame = make_packet(np.arange(5), job=1).to_frame(0, 1)
    ip = to_scapy(frame)["IP"]
    stored = ip.chksum
    del ip.chksum
    assert type(ip)(bytes(ip)).chksum == stored


@pytest.mark.parametrize("mutate", [
    lambda f: f[:PAYLOAD_OFFSET - 1],          # truncated header
    lambda f: f[:-1],                          # payload shorter than count says
    lambda f: f[:12] + b"\x86\xdd" + f[14:],   # not IPv4
    lambda f: f[:36] + b"\x00\x35" + f[38:],   # another UDP port
    lambda f: f[:38] + b"\x00\x09" + f[40:],   # UDP length disagrees with count
    lambda f: b"",
])
def test_malformed_frames_are_refused(mutate):
    frame = make_packet(np.arange(8), job=1).to_frame(0, 1)
    assert parse_frame(frame) is not None
    assert parse_frame(mutate(frame)) is None


@pytest.mark.parametrize("mutate", [
    lambda f: f,
    lambda f: f[:PAYLOAD_OFFSET - 1],
    lambda f: f[:-1],
    lambda f: f[:12] + b"\x86\xdd" + f[14:],
    lambda f: f[:14] + b"\x46" + f[15:],      # IPv4 options
    lambda f: f[:23] + b"\x06" + f[24:],      # TCP
    lambda f: f[:36] + b"\x00\x35" + f[38:],
    lambda f: f[:38] + b"\x00\x09" + f[40:],
    lambda f: f + b"\x00\x00",               # padding past the payload is allowed
])
def test_frame_fields_is_parse_frame_without_numpy(mutate):
    frame = mutate(make_packet(np.arange(-3, 5), job=7, rank=2, nworkers=9, slot=5, chunk=70000, flags=RESULT | VER,
                               exp=-4).to_frame(12, 300, band=2))
    pkt, fields = parse_frame(frame), frame_fields(frame)
    assert (pkt is None) == (fields is None)
    if pkt is not None:
        header = tuple(int(pkt.hdr[name]) for name in HEADER_DTYPE.names)
        assert fields == (pkt.src, pkt.dst, pkt.band, *header) == (12, 300, 2, 7, 2, 9, 5, 70000, 8, RESULT | VER, -4)
        assert tuple(getattr(pkt, name) for name in HEADER_DTYPE.names) == header  # the ints parse_frame sets


def test_replace_keeps_the_original_and_sets_count():
    pkt = make_packet(np.arange(4), job=1, slot=2)
    out = pkt.replace(np.arange(2), slot=3, flags=RESULT)
    assert (pkt.slot, pkt.count, out.slot, out.count) == (2, 4, 3, 2)
    assert out.has(RESULT) and not pkt.has(RESULT)
