"""A Chakra trace replayed on the in-process fabric (innet.integrations.chakra.schedule says when each node runs):
each call through the emulated network as the ``innet`` process group sends torch's (innet.integrations.torch.fabric),
in the run's mode, with seeded values whose results are checked exactly, its virtual time measured beside the
timing model's prediction, its bytes per link counted beside the planner's.

What a node's ``comm_size`` bytes become:

- all-reduce, reduce, broadcast: a tensor of ``comm_size`` bytes (int32 values, the last padded) on every rank;
- all-gather, reduce-scatter: ``comm_size`` bytes is the whole tensor (the gathered result, the scattered input,
  as ASTRA-sim's), each rank's piece an N-th of it (in whole packets of its own, as torch's pieces travel);
- barrier: no values;
- all-to-all: every rank sends an N-th of its ``comm_size`` bytes to each other rank, as messages on the links
  (innet.hosts.p2p); gather and scatter: an N-th to (from) the root; a send: its ``comm_size`` bytes.

Sums travel as small integers in float32, which fixed point carries exactly; what the switches only move travels
as int32 bit patterns: every result must equal numpy's, bit for bit. Messages are their bytes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from innet.graph import link_name, natural_key
from innet.hosts.p2p.wire import EXCHANGE, USER
from innet.integrations.chakra.schedule import Comm, Schedule
from innet.integrations.chakra.trace import RankTrace
from innet.integrations.torch.fabric import FabricCollectives, padded, unit, unpadded
from innet.planning.prediction import run_link_bytes
from innet.planning.spec import RunSpec
from innet.planning.timing import call_times
from innet.planning.timing.exchange import exchange_time
from innet.results.metrics import tier_bytes

COLLECTIVE_OF = {"ALL_REDUCE": "allreduce", "REDUCE": "reduce", "ALL_GATHER": "all_gather", "BROADCAST": "broadcast",
                 "REDUCE_SCATTER": "reduce_scatter", "REDUCE_SCATTER_BLOCK": "reduce_scatter", "BARRIER": "barrier"}
EXCHANGED = {"ALL_TO_ALL": "all_to_all", "GATHER": "gather", "SCATTER": "scatter", "SEND": "send"}
SPREAD = 1000  # summed values are integers in [-SPREAD, SPREAD]: a float32 holds every partial sum exactly


@dataclass(frozen=True)
class Call:
    """One call of a replay: its collective (innet's name; ``send`` a message), the trace's name for it, its ranks
    and ``comm_size`` bytes, when it started and ended (virtual seconds), the model's time, and whether every
    rank's result was exact."""

    kind: str
    name: str
    ranks: tuple[int, ...]
    bytes: int
    start_s: float
    end_s: float
    model_s: float
    correct: bool

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class ReplayRecord:
    """A trace replayed in one mode: its calls, when its last node ended, bytes per link and tier as measured, and
    the planner's bytes per link for the same calls."""

    trace: str
    mode: str
    backend: str
    topology: str
    ranks: int
    nodes: int
    virtual_s: float
    correct: bool
    calls: tuple[Call, ...]
    link_bytes: dict[str, int]
    predicted_link_bytes: dict[str, int]
    tier_bytes: dict[str, int]


def words(size: int) -> int:
    """The int32 values a tensor of ``size`` bytes takes (at least one)."""
    return max(1, -(-size // 4))


class FabricNetwork:
    """The calls of a replay on a fabric of ``graph`` as ``run`` says (mode, faults, seed), ``size`` ranks: each
    call's model time and exactness kept in the order they ran (``outcomes``), the planner's bytes per link summed."""

    def __init__(self, graph: nx.Graph, run: RunSpec, size: int) -> None:
        self.graph, self.run, self.size = graph, run, size
        self.fabric = FabricCollectives(graph, run)
        self.outcomes: list[tuple[float, bool]] = []
        self.predicted: Counter[str] = Counter()

    def __call__(self, comms: list[Comm]) -> float:
        before = self.fabric.tally.virtual_s
        rng = np.random.default_rng([self.run.seed, len(self.outcomes)])
        if comms[0].kind in EXCHANGED:
            model, ok = self.exchange(comms, rng)
        else:
            [comm] = comms
            model, ok = self.collective(COLLECTIVE_OF[comm.kind], comm.size, comm.root, rng)
        self.outcomes += [(model, ok)] * len(comms)
        return self.fabric.tally.virtual_s - before

    def _delay(self, u: str, v: str) -> float:
        return self.run.faults_on(u, v).delay

    def collective(self, name: str, size: int, root: int, rng: np.random.Generator) -> tuple[float, bool]:
        """One collective of ``size`` bytes through the switches (or PBox, or ring): its model time, exactness."""
        n, e, fabric = self.size, words(size), self.fabric
        op, per_packet = "bits" if name in ("broadcast", "all_gather") else "sum", 0
        if name in ("all_gather", "reduce_scatter"):  # each rank's piece in whole packets of its own
            piece = -(-e // n)
            per_packet = unit(piece, fabric.per_packet)
            if name == "all_gather":
                x = rng.integers(-(2**31), 2**31, (n, piece), dtype=np.int64).astype(np.int32)
                inputs = [padded(x, per_packet)] * n
                got = fabric.collective(name, op, inputs, root, per_packet)
                ok = all(np.array_equal(unpadded(g, n, piece), x.ravel()) for g in got)
            else:
                x = rng.integers(-SPREAD, SPREAD + 1, (n, n * piece)).astype(np.float32)
                inputs = [padded(row.reshape(n, piece), per_packet) for row in x]
                got = fabric.collective(name, op, inputs, root, per_packet)
                ok = all(np.array_equal(unpadded(g, n, piece), x.sum(axis=0)) for g in got)
        elif name == "broadcast":
            x = rng.integers(-(2**31), 2**31, (n, e), dtype=np.int64).astype(np.int32)
            inputs = list(x)
            ok = all(np.array_equal(g, x[root]) for g in fabric.collective(name, op, inputs, root))
        elif name == "barrier":
            inputs = [np.zeros(1, np.float32)] * n
            fabric.collective(name, op, inputs)
            ok = True
        else:  # allreduce, reduce: the sum where it is delivered
            x = rng.integers(-SPREAD, SPREAD + 1, (n, e)).astype(np.float32)
            inputs = list(x)
            got = fabric.collective(name, op, inputs, root)
            ok = all(np.array_equal(got[r], x.sum(axis=0)) for r in (range(n) if name == "allreduce" else [root]))
        run, rp, _ = fabric.plan(name, op, root, n, len(inputs[0]), per_packet)
        self.predicted.update(run_link_bytes(self.graph, run.mode, rp.plans, rp.per_packet, run.calls(), 1.0, root))
        return call_times(self.graph, run, list(rp.plans), rp.per_packet, 0.0)[0], ok

    def exchange(self, comms: Sequence[Comm], rng: np.random.Generator) -> tuple[float, bool]:
        """Messages: an all-to-all's, a gather's or scatter's, or sends that met (together): model time, exactness."""
        n = self.size
        posts: list[tuple[int, int, bytes]] = []
        for comm in comms:
            if comm.kind == "SEND":
                pairs = [(comm.src, comm.dst, comm.size)]
            else:
                part = comm.size // n
                pairs = [(s, d, part) for s in range(n) for d in range(n) if s != d and
                         (comm.kind == "ALL_TO_ALL" or (comm.kind == "GATHER" and d == comm.root) or
                          (comm.kind == "SCATTER" and s == comm.root))]
            posts += [(s, d, rng.integers(0, 256, size, dtype=np.uint8).tobytes()) for s, d, size in pairs if size]
        got = self.fabric.messages(n, posts, USER if comms[0].kind == "SEND" else EXCHANGE)
        want: list[list[list[bytes]]] = [[[] for _ in range(n)] for _ in range(n)]
        for s, d, data in posts:
            want[d][s].append(data)
        _, rp, _ = self.fabric.plan("barrier", "sum", 0, n, 1, 0)
        hosts = {spec.rank: host for host, spec in rp.specs[rp.plans[0].job].items()}
        model = exchange_time(self.graph, [(hosts[s], hosts[d], len(data)) for s, d, data in posts], rp.per_packet, 0.0,
                              self._delay)
        return model, got == want


def replay(graph: nx.Graph, run: RunSpec, traces: Sequence[RankTrace], schedule: Schedule | None = None) -> ReplayRecord:
    """``traces`` (one per rank) replayed on a fabric of ``graph`` in ``run``'s mode: its record."""
    schedule = schedule or Schedule(traces)
    network = FabricNetwork(graph, run, len(traces))
    timed, ended = schedule.run(network)
    calls = tuple(Call(t.comm.kind.lower() if t.comm.kind in EXCHANGED else COLLECTIVE_OF[t.comm.kind], t.comm.name,
                       tuple(sorted({r for r, _ in t.comm.nodes})), t.comm.size, t.start, t.end, model, ok)
                  for t, (model, ok) in zip(timed, network.outcomes, strict=True))
    tally = network.fabric.tally
    names = sorted((link_name(u, v) for u, v in graph.edges), key=natural_key)  # every link, zero where nothing went
    links = {name: int(tally.link_bytes.get(name, 0)) for name in names}
    predicted = network.predicted + tally.predicted_message_link_bytes
    folders = {os.path.dirname(t.path) for t in traces}
    where = traces[0].path if len(traces) == 1 else f"{folders.pop() or '.'} ({len(traces)} files)" if len(folders) == 1 \
        else f"{traces[0].path} .. {traces[-1].path}"
    return ReplayRecord(where, run.mode, run.backend, run.topo, len(traces), sum(len(t.nodes) for t in traces), ended,
                        all(c.correct for c in calls), calls, links, {k: int(predicted.get(k, 0)) for k in names},
                        tier_bytes(graph, links))
