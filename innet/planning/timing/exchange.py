"""The time of point-to-point messages sent at once (innet.hosts.p2p: an all-to-all, a gather, sends and
receives that meet): the busiest link direction's bytes over its rate, its frames and the ACKs coming back on the
other directions counted as the planner counts them (``exchange_link_bytes``), plus the last piece's trip to its
receiver and that ACK's way back, less the piece's serialization on the busiest link (already in the stream).
Each host's pieces share its window (round robin among its messages), which paces it only when a round trip is
longer than the window takes to send."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import networkx as nx

from innet.hosts.p2p.wire import ACK_WORDS, message_bytes, message_words
from innet.hosts.ring.acks import ACK_EVERY, WINDOW
from innet.planning.prediction import frame_bytes, link_rate, one_way, path_links
from innet.planning.timing.calls import busiest_direction
from innet.planning.timing.queues import back


def exchange_directions(graph: nx.Graph, messages: Sequence[tuple[str, str, int]],
                        per_packet: int) -> dict[tuple[str, str], int]:
    """Bytes each link direction carries for ``messages`` (sender's host, receiver's host, bytes): the frames
    along the path, their ACKs back (``exchange_link_bytes``, one direction at a time)."""
    out: Counter[tuple[str, str]] = Counter()
    for src, dst, nbytes in messages:
        data, acks = message_bytes(nbytes, per_packet)
        for u, v in path_links(graph, src, dst):
            out[(u, v)] += data
            out[(v, u)] += acks
    return dict(out)


def exchange_time(graph: nx.Graph, messages: Sequence[tuple[str, str, int]], per_packet: int, hop: float = 0.0,
                  delay: Callable[[str, str], float] = lambda u, v: 0.0) -> float:
    """Predicted seconds from the moment ``messages`` are posted (all at once) until the last is acknowledged."""
    moving = [(s, d, n) for s, d, n in messages if s != d]
    if not moving:
        return 0.0
    loads = {uv: float(b) for uv, b in exchange_directions(graph, moving, per_packet).items()}
    stream = busiest_direction(graph, loads)[1]
    full = frame_bytes(per_packet)
    slowest = min(link_rate(graph, u, v) for u, v in loads)
    links: dict[tuple[str, str], tuple[float, float, float, float]] = {}
    rtt = max(one_way(graph, path_links(graph, s, d), full, hop, delay, links)
              + one_way(graph, back(path_links(graph, s, d)), frame_bytes(ACK_WORDS), hop, delay, links)
              for s, d, _ in moving)
    sent: Counter[str] = Counter()  # each host's pieces: a window of them per round trip at most
    for s, _, n in moving:
        sent[s] += -(-message_words(n) // per_packet)
    windows = max(-(-pieces // max(WINDOW, ACK_EVERY * sum(m[0] == s for m in moving)))
                  for s, pieces in sent.items())
    return max(stream + rtt - full / slowest, windows * rtt)
