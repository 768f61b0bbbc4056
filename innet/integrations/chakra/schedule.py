"""A trace's nodes in virtual time: every rank's execution graph run as its dependencies allow, its communication
handed to a ``Network`` that says how long each took.

- A node starts once all its control and data dependencies (``ctrl_deps``, ``data_deps``: nodes of its own rank)
  have ended; a node without any starts at 0. A control dependency on a node the file does not have is met, and
  one that would close a cycle is left out (Chakra's PyTorch converter writes both: where it dropped nodes, and
  between a CPU op and its kernel); a data dependency on a missing node, or a cycle of them, is an error.
- A node that does not communicate (COMP, MEM_LOAD/STORE, METADATA; a COMM_COLL without ``comm_type``: the CPU
  side of a collective) takes its ``duration_micros``. A rank runs one CPU node (``is_cpu_op``) and one other node
  at a time, as ASTRA-sim's hardware resource does; others wait in order of readiness, then id.
- A COMM_COLL node with ``comm_type`` is its rank's k-th collective (in the order the ranks' graphs put them:
  dependencies first, then ids), and the k-th collective of every rank are one call: it starts once every rank
  has issued it, and ends for all of them together. Every collective spans every rank (process groups are not
  read), and the ranks' k-th collectives must agree on type and size.
- A COMM_SEND from rank s to d with tag t meets the COMM_RECV on d from s with tag t (in order, as MPI's); the
  message starts once both are issued and ends both.
- The network carries one call at a time, in the order they became ready (then by rank and node); messages ready
  at the same moment travel together, at once. So the fabric's clock is the trace's: a call's time is what the
  network took for it, measured.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from innet.errors import UserError
from innet.integrations.chakra.trace import COLL, COMM_TYPES, RECV, SEND, Malformed, Node, RankTrace


@dataclass(frozen=True)
class Comm:
    """One call the network carries: a collective (``kind``: COMM_TYPES' name) of every rank, or a message
    (``kind`` "SEND") from ``src`` to ``dst``; ``size``: its nodes' ``comm_size`` bytes; ``nodes``: (rank, node id)
    of every node it ends; ``name``: the first node's name."""

    kind: str
    size: int
    nodes: tuple[tuple[int, int], ...]
    name: str = ""
    root: int = 0
    src: int = -1
    dst: int = -1
    tag: int = 0


@dataclass(frozen=True)
class Timed:
    """A call and when it ran, in virtual seconds."""

    comm: Comm
    start: float
    end: float


Network = Callable[[list[Comm]], float]  # carries calls that start together; the seconds until the last ends


@dataclass
class _Lane:
    busy_until: float = 0.0
    waiting: list[tuple[float, int]] = field(default_factory=list)  # (ready time, node id)


def _communicates(node: Node) -> bool:
    return node.type in (SEND, RECV) or (node.type == COLL and "comm_type" in node.attrs)


def _named(trace: RankTrace, node: Node, what: str) -> UserError:
    return UserError(f"{trace.path}: node {node.id} ({node.name or node.type_name}) {what}")


class Schedule:
    """Every rank's graph checked and ordered: ``run`` replays it."""

    def __init__(self, traces: Sequence[RankTrace]) -> None:
        self.traces = list(traces)
        self.nodes: list[dict[int, Node]] = []
        self.deps: list[dict[int, frozenset[int]]] = []  # per rank, each node's dependencies that the file has
        self.collectives: list[list[int]] = []  # per rank, its collectives' node ids in order
        self.dropped = 0  # control dependencies left out: they would have closed a cycle
        for trace in self.traces:
            nodes: dict[int, Node] = {}
            for node in trace.nodes:
                if node.id in nodes:
                    raise _named(trace, node, "appears twice")
                nodes[node.id] = node
            for node in trace.nodes:
                missing = sorted(set(node.data_deps) - set(nodes))
                if missing:
                    raise _named(trace, node, f"needs the data of node {missing[0]}, which the file does not have")
                self._check(trace, node)
            deps = _dependencies(trace, nodes)
            self.dropped += sum(len(set(n.deps) & set(nodes)) - len(deps[i]) for i, n in nodes.items())
            self.nodes.append(nodes)
            self.deps.append(deps)
            self.collectives.append([i for i in _order(trace, nodes, deps) if nodes[i].type == COLL and
                                     _communicates(nodes[i])])
        counts = [len(c) for c in self.collectives]
        if len(set(counts)) > 1:
            raise UserError(f"the ranks issue different numbers of collectives ({', '.join(map(str, counts))} for "
                            f"ranks 0..{len(counts) - 1}): every collective spans every rank")
        for k in range(counts[0] if counts else 0):
            first = self.nodes[0][self.collectives[0][k]]
            for rank in range(1, len(self.traces)):
                other = self.nodes[rank][self.collectives[rank][k]]
                if (other.attrs["comm_type"], other.int_attr("comm_size", 0)) != (first.attrs["comm_type"],
                                                                                   first.int_attr("comm_size", 0)):
                    raise UserError(f"collective {k + 1} of the trace: rank 0 issues {_what(first)}, rank {rank} "
                                    f"{_what(other)}; every rank must issue the same collective")

    def _check(self, trace: RankTrace, node: Node) -> None:
        if not _communicates(node):
            return
        try:
            if node.int_attr("comm_size", 0) < 0:
                raise Malformed("a negative comm_size")
            if node.type == COLL and not 0 <= node.int_attr("comm_type") < len(COMM_TYPES):
                raise Malformed(f"comm_type {node.attrs['comm_type']!r} is not one of Chakra's")
            node.int_attr("comm_tag", 0)
            if node.type == COLL and not 0 <= node.int_attr("root", 0) < len(self.traces):
                raise Malformed(f"root {node.attrs['root']!r} is not a rank of the {len(self.traces)}")
            if node.type != COLL:
                rank = self.traces.index(trace)
                for peer in ("comm_src", "comm_dst"):
                    if not 0 <= node.int_attr(peer, rank) < len(self.traces):
                        raise Malformed(f"{peer} {node.attrs[peer]!r} is not a rank of the {len(self.traces)}")
                if node.int_attr("comm_src", rank) == node.int_attr("comm_dst", rank):
                    raise Malformed(f"node {node.id} ({node.name or node.type_name}) sends to its own rank")
        except Malformed as exc:
            raise UserError(f"{trace.path}: {exc}") from None

    def run(self, network: Network) -> tuple[list[Timed], float]:
        """Replay the trace, ``network`` carrying its calls: the calls with their times, and when the last node ended."""
        return _Replay(self, network).run()


def _what(node: Node) -> str:
    return f"{COMM_TYPES[node.int_attr('comm_type')]} of {node.int_attr('comm_size', 0)} bytes"


def _followers(deps: dict[int, frozenset[int]]) -> dict[int, list[int]]:
    """The nodes that wait for each node."""
    after: dict[int, list[int]] = defaultdict(list)
    for i, ds in deps.items():
        for d in ds:
            after[d].append(i)
    return after


def _dependencies(trace: RankTrace, nodes: dict[int, Node]) -> dict[int, frozenset[int]]:
    """What each node waits for: its data dependencies, and its control dependencies on nodes the file has but
    those that would close a cycle (added in file order, each kept if the graph stays acyclic)."""
    deps = {i: frozenset(d for d in n.deps if d in nodes) for i, n in nodes.items()}
    if _order(trace, nodes, deps, strict=False):
        return deps
    data = {i: frozenset(n.data_deps) for i, n in nodes.items()}
    _order(trace, nodes, data)  # a cycle of data dependencies: the trace's own error
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from((d, i) for i, ds in data.items() for d in ds)
    for node in nodes.values():
        for d in node.ctrl_deps:
            if d in nodes and not graph.has_edge(d, node.id) and not nx.has_path(graph, node.id, d):
                graph.add_edge(d, node.id)
    return {i: frozenset(graph.predecessors(i)) for i in nodes}


def _order(trace: RankTrace, nodes: dict[int, Node], deps: dict[int, frozenset[int]], strict: bool = True) -> list[int]:
    """The rank's nodes in dependency order, ties by id (on a cycle: a ``UserError``, or not ``strict``, [])."""
    waiting = {i: len(ds) for i, ds in deps.items()}
    after = _followers(deps)
    ready = [i for i, w in waiting.items() if not w]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(i)
        for j in after[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, j)
    if len(out) < len(nodes):
        if not strict:
            return []
        stuck = min(i for i in nodes if i not in set(out))
        raise _named(trace, nodes[stuck], "is on a cycle of dependencies")
    return out


class _Replay:
    """One replay's state: the event heap, each rank's lanes, the calls issued and not yet carried."""

    def __init__(self, schedule: Schedule, network: Network) -> None:
        self.s, self.network = schedule, network
        self.events: list[tuple[float, int, str, int, int]] = []  # (time, seq, what, rank, node id)
        self.seq = 0
        self.left = [{i: len(ds) for i, ds in deps.items()} for deps in schedule.deps]
        self.after = [_followers(deps) for deps in schedule.deps]
        self.lanes: dict[tuple[int, bool], _Lane] = defaultdict(_Lane)
        self.index = [{i: k for k, i in enumerate(c)} for c in schedule.collectives]
        self.issued: dict[int, dict[int, float]] = defaultdict(dict)  # collective k: rank -> when issued
        self.sends: dict[tuple[int, int, int], deque[tuple[float, int]]] = defaultdict(deque)
        self.recvs: dict[tuple[int, int, int], deque[tuple[float, int]]] = defaultdict(deque)
        self.ready: list[tuple[float, int, int, Comm]] = []  # calls every party has issued: (when, rank, node id, call)
        self.network_free = 0.0
        self.timed: list[Timed] = []
        self.done = 0
        self.end = 0.0

    def push(self, time: float, what: str, rank: int, node: int) -> None:
        heapq.heappush(self.events, (time, self.seq, what, rank, node))
        self.seq += 1

    def run(self) -> tuple[list[Timed], float]:
        for rank, left in enumerate(self.left):
            for i in sorted(i for i, w in left.items() if not w):
                self.push(0.0, "ready", rank, i)
        total = sum(len(n) for n in self.s.nodes)
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:  # everything at this moment, then what it starts
                _, _, what, rank, i = heapq.heappop(self.events)
                (self.on_ready if what == "ready" else self.on_end)(now, rank, i)
            self.start_lanes(now)
            self.start_network(now)
        if self.done < total:
            raise UserError(self.stuck())
        return self.timed, self.end

    def on_ready(self, now: float, rank: int, i: int) -> None:
        node = self.s.nodes[rank][i]
        if not _communicates(node):
            heapq.heappush(self.lanes[rank, bool(node.attrs.get("is_cpu_op", False))].waiting, (now, i))
        elif node.type == COLL:
            k = self.index[rank][i]
            self.issued[k][rank] = now
            if len(self.issued[k]) == len(self.s.nodes):
                first = self.s.nodes[0][self.s.collectives[0][k]]
                nodes = tuple((r, self.s.collectives[r][k]) for r in range(len(self.s.nodes)))
                comm = Comm(COMM_TYPES[first.int_attr("comm_type")], first.int_attr("comm_size", 0), nodes, first.name,
                            first.int_attr("root", 0))
                heapq.heappush(self.ready, (now, 0, nodes[0][1], comm))
        else:
            src, dst = node.int_attr("comm_src", rank), node.int_attr("comm_dst", rank)
            key = (src, dst, node.int_attr("comm_tag", 0))
            mine, theirs = (self.sends, self.recvs) if node.type == SEND else (self.recvs, self.sends)
            if theirs[key]:
                _, j = theirs[key].popleft()
                peer = dst if node.type == SEND else src
                send, recv = ((rank, i), (peer, j)) if node.type == SEND else ((peer, j), (rank, i))
                named = self.s.nodes[send[0]][send[1]]
                comm = Comm("SEND", named.int_attr("comm_size", 0), (send, recv), named.name, src=src, dst=dst, tag=key[2])
                heapq.heappush(self.ready, (now, src, send[1], comm))
            else:
                mine[key].append((now, i))

    def on_end(self, now: float, rank: int, i: int) -> None:
        self.done += 1
        self.end = max(self.end, now)
        for j in self.after[rank][i]:
            self.left[rank][j] -= 1
            if not self.left[rank][j]:
                self.push(now, "ready", rank, j)

    def start_lanes(self, now: float) -> None:
        for (rank, _), lane in self.lanes.items():
            if lane.waiting and lane.busy_until <= now:
                _, i = heapq.heappop(lane.waiting)
                lane.busy_until = now + self.s.nodes[rank][i].duration_micros * 1e-6
                self.push(lane.busy_until, "end", rank, i)

    def start_network(self, now: float) -> None:
        if not self.ready or self.network_free > now:
            return
        first = heapq.heappop(self.ready)[3]
        calls = [first]
        if first.kind == "SEND":  # every message ready now travels with it
            calls += [heapq.heappop(self.ready)[3] for _ in range(len(self.ready)) if self.ready[0][3].kind == "SEND"]
        self.network_free = now + self.network(calls)
        for comm in calls:
            self.timed.append(Timed(comm, now, self.network_free))
            for rank, i in comm.nodes:
                self.push(self.network_free, "end", rank, i)

    def stuck(self) -> str:
        """Why the trace cannot go on: the first call some rank waits in that another never issues."""
        for k, ranks in sorted(self.issued.items()):
            if len(ranks) < len(self.s.nodes):
                missing = [r for r in range(len(self.s.nodes)) if r not in ranks]
                return (f"the trace cannot finish: collective {k + 1} is issued by rank(s) {', '.join(map(str, sorted(ranks)))} "
                        f"but never by rank(s) {', '.join(map(str, missing))} (a dependency that never ends?)")
        for (src, dst, tag), queue in self.sends.items():
            if queue:
                return f"the trace cannot finish: rank {src}'s send to rank {dst} (tag {tag}) has no matching receive"
        for (src, dst, tag), queue in self.recvs.items():
            if queue:
                return f"the trace cannot finish: rank {dst}'s receive from rank {src} (tag {tag}) has no matching send"
        return "the trace cannot finish: some nodes never become ready"
