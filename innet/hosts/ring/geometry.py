"""The ring's geometry: the segments a tensor is cut into, the pieces every step sends, and which halves of the
ring all-reduce a collective runs. The ring (innet.hosts.ring.call) and the model (innet.planning) share it."""

from __future__ import annotations

from innet.wire.collectives import Collective


def ring_geometry(length: int, n: int, per_packet: int, collective: str = "allreduce",
                  root: int = 0) -> tuple[list[tuple[int, int]], int]:
    """The ring's ``n`` segments of a tensor of ``length`` values (sizes differ by at most one), and the
    pieces every step sends: as many as the longest segment needs, so a shorter segment's last may be empty.
    For another collective: its shards (whole packets, innet.wire.collectives), segment s being shard
    s-1, so that rank r ends the reduce-scatter holding shard r; for broadcast and reduce the root's
    segment (root+1) is the whole tensor and the others are empty, so the one half they run is a
    pipelined chain: from the root round to its predecessor, or from its successor round to the root."""
    if collective in ("broadcast", "reduce"):
        segments = [(0, length) if s == (root + 1) % n else (0, 0) for s in range(n)]
    elif collective != "allreduce":
        b = Collective.shards(length, n, per_packet).tolist()
        segments = [(b[(s - 1) % n], b[(s - 1) % n + 1]) for s in range(n)]
    else:
        segments = [(length * i // n, length * (i + 1) // n) for i in range(n)]
    return segments, max(1, -(-max(b - a for a, b in segments) // per_packet))


def ring_phases(collective: str) -> tuple[bool, bool]:
    """Which halves of the ring all-reduce a collective runs: (reduce-scatter, all-gather). Ring reduce-scatter
    and reduce are the first (the chain to the root), all-gather and broadcast the second (the chain from it);
    all-reduce and barrier run both."""
    return {"reduce_scatter": (True, False), "reduce": (True, False), "all_gather": (False, True),
            "broadcast": (False, True)}.get(collective, (True, True))
