"""A point-to-point message on the wire (innet.hosts.p2p): its words, its pieces, and what it costs a path.

Data frame: job ``P2P_JOB``, ``rank`` the sender's rank, ``nworkers`` the channel, ``slot`` the message's sequence
number (mod 2**16), ``chunk`` the piece, flags ROUTE, values the piece's words. ACK: the same fields from the
receiver, flags ROUTE|RESULT (RETX echoing a retransmission), ``chunk`` the piece whose arrival sent it, values the
ring's cumulative ACK with its bitmap (innet.hosts.ring.acks.encode).
"""

from __future__ import annotations

import numpy as np

from innet.hosts.ring.acks import ACK_EVERY, ACK_SPAN
from innet.wire.packet import P2P_JOB as P2P_JOB  # the messages' job number, declared with the packet
from innet.wire.packet import PAYLOAD_OFFSET

USER, EXCHANGE = 0, 1  # channels: torch's send/recv; a collective's messages (all-to-all, gather, scatter)
PREAMBLE = 3  # words in front of a message's bytes: its length (low word, high word), its tag
ACK_WORDS = 1 + ACK_SPAN // 32


def message_words(nbytes: int) -> int:
    """Words a message of ``nbytes`` bytes travels as: the preamble, then its bytes padded to a whole word."""
    return PREAMBLE + -(-nbytes // 4)


def pieces_of(nbytes: int, per_packet: int) -> int:
    """The frames a message of ``nbytes`` bytes takes, ``per_packet`` values each (the last may be shorter)."""
    return -(-message_words(nbytes) // per_packet)


def message_bytes(nbytes: int, per_packet: int) -> tuple[int, int]:
    """What a message of ``nbytes`` bytes puts on each link of its path without loss: its frames (sender to
    receiver), and its ACKs (the way back: one per ACK_EVERY pieces, and one for the last)."""
    pieces = pieces_of(nbytes, per_packet)
    return pieces * PAYLOAD_OFFSET + 4 * message_words(nbytes), -(-pieces // ACK_EVERY) * (PAYLOAD_OFFSET + 4 * ACK_WORDS)


def encode(data: bytes | np.ndarray, tag: int) -> np.ndarray:
    """A message's int32 words: the preamble, then ``data`` (raw bytes) padded to a whole word."""
    raw = data.view(np.uint8).ravel() if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    words = np.zeros(message_words(len(raw)), np.int32)
    words[:PREAMBLE] = np.array([len(raw) & 0xFFFFFFFF, len(raw) >> 32, tag & 0xFFFFFFFF], np.uint32).view(np.int32)
    words[PREAMBLE:].view(np.uint8)[: len(raw)] = raw
    return words


def decode(words: np.ndarray) -> tuple[int, bytes]:
    """``encode``'s inverse: the tag and the bytes."""
    low, high, tag = np.asarray(words[:PREAMBLE], np.int32).view(np.uint32).tolist()
    nbytes = low | high << 32
    return int(np.int32(np.uint32(tag))), np.ascontiguousarray(words[PREAMBLE:], np.int32).view(np.uint8)[:nbytes].tobytes()
