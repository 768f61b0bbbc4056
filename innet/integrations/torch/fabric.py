"""One torch collective on the in-process fabric: every rank's tensor in, every rank's result out, the bytes per link
and the virtual seconds counted (what the ``innet`` process group's rank 0 runs; innet.integrations.torch.group).

A collective reaches the fabric as innet's own (innet.wire.collectives) with the program of its operator. Values the
switches only move (all-gather, broadcast) travel as int32 bit patterns through the bit-or program, so any dtype
arrives bit for bit; values they combine go through fixed point (floats) or exactly (integers small enough for it,
see ``exact_ints``).

torch shards a tensor evenly; innet's shards are whole packets (``Collective.shards``). So a reduce-scatter's input
and an all-gather's whole are laid out as N pieces, each padded to whole packets (``padded``), innet's shard r then
being torch's piece r; the call's packets are as short as hold a piece in as few of them as the job's packets would
(``unit``), so a piece pads by less than one value a packet.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from innet.backends.local.exchange import Post, exchange
from innet.backends.local.run import LocalRun
from innet.graph import link_totals
from innet.hosts.worker.process import WorkerProcess
from innet.integrations.torch.programs import PROD_FILE, XOR_FILE
from innet.planning.prediction import exchange_link_bytes
from innet.planning.spec import RunSpec, program_of
from innet.results.metrics import up_and_down
from innet.schemes.modes import RunPlan, plan_run
from innet.switch.program import SwitchProgram
from innet.wire import fixedpoint
from innet.wire.collectives import COLLECTIVES

PROGRAMS = {"sum": "sum_allreduce", "avg": "sum_allreduce", "min": "min_allreduce", "max": "max_allreduce",
            "bor": "or_allreduce", "band": "and_allreduce", "bits": "or_allreduce",
            "prod": PROD_FILE, "bxor": XOR_FILE}
EXACT_FLOAT = 2**24  # integers a float32 holds exactly: fixed point carries an integer sum below it unrounded


@dataclass
class Tally:
    """What collectives cost on the fabric, summed over calls (a group's, or a launch's over its groups)."""

    link_bytes: Counter[str] = field(default_factory=Counter)
    link_bytes_up: Counter[str] = field(default_factory=Counter)  # of ``link_bytes``, each link's up direction's
    link_bytes_down: Counter[str] = field(default_factory=Counter)  # (innet.graph.uplink) and down direction's
    virtual_s: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)
    side_plane: set[str] = field(default_factory=set)  # the calls that went over the side plane instead
    fused: int = 0  # of ``calls``, small all-reduces that travelled together with others (batch.fuse)
    fusions: int = 0  # the collectives they travelled in
    message_link_bytes: Counter[str] = field(default_factory=Counter)  # of ``link_bytes``, the messages' (send/recv,
    # all-to-all, gather, scatter: innet.hosts.p2p)
    predicted_message_link_bytes: Counter[str] = field(default_factory=Counter)  # the planner's of those
    messages: int = 0  # point-to-point messages on the links (an all-to-all's: one per pair that moves bytes)

    def carried(self, graph: nx.Graph, directions: Mapping[tuple[str, str], int]) -> None:
        """Count the bytes each link direction (from, to) of ``graph`` carried."""
        up, down = up_and_down(graph, directions)
        self.link_bytes.update(link_totals(directions))
        self.link_bytes_up.update(up)
        self.link_bytes_down.update(down)

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts to these."""
        self.link_bytes.update(other.link_bytes)
        self.link_bytes_up.update(other.link_bytes_up)
        self.link_bytes_down.update(other.link_bytes_down)
        self.message_link_bytes.update(other.message_link_bytes)
        self.predicted_message_link_bytes.update(other.predicted_message_link_bytes)
        self.messages += other.messages
        self.virtual_s += other.virtual_s
        self.calls.update(other.calls)
        self.side_plane.update(other.side_plane)
        self.fused += other.fused
        self.fusions += other.fusions


def exact_ints(tensors: list[np.ndarray], op: str) -> bool:
    """Whether integer ``tensors`` reduce exactly on the wire with ``op``: bit operators on int32 values; sums,
    minima and maxima whose fixed-point scale is whole (no bit dropped) and whose every partial result a float32
    holds exactly."""
    if op in ("bor", "band", "bxor"):
        return all(np.all((t >= -(2**31)) & (t < 2**31)) for t in tensors)
    q = max(fixedpoint.magnitude_exponent(t.astype(np.float64)) for t in tensors)
    bound = sum(int(np.abs(t.astype(np.int64)).max(initial=0)) for t in tensors)
    return bound < EXACT_FLOAT and fixedpoint.scale_for(q, len(tensors) if op == "sum" else 1) >= 0


def as_words(tensor: np.ndarray) -> np.ndarray:
    """A tensor's bytes as int32 words (padded to a whole word)."""
    raw = np.ascontiguousarray(tensor).view(np.uint8).ravel()
    return np.concatenate([raw, np.zeros(-len(raw) % 4, np.uint8)]).view(np.int32)


def from_words(words: np.ndarray, like: np.ndarray, count: int) -> np.ndarray:
    """``count`` values of ``like``'s dtype from int32 ``words`` (``as_words``' inverse)."""
    return np.ascontiguousarray(words, np.int32).view(np.uint8)[: count * like.itemsize].view(like.dtype).copy()


def unit(piece: int, elements: int) -> int:
    """The values a packet of a call of ``piece``-value pieces carries: the fewest packets of at most ``elements``
    that hold a piece, as evenly filled as they can be."""
    packets = max(1, -(-piece // elements))
    return max(1, -(-piece // packets))


def padded(pieces: np.ndarray, unit: int) -> np.ndarray:
    """The rows of ``pieces`` each padded with zeros to whole packets of ``unit`` values, as one flat array."""
    width = max(1, -(-pieces.shape[1] // unit)) * unit
    out = np.zeros((pieces.shape[0], width), pieces.dtype)
    out[:, : pieces.shape[1]] = pieces
    return out.reshape(-1)


def unpadded(whole: np.ndarray, pieces: int, piece: int) -> np.ndarray:
    """``padded``'s inverse: the first ``piece`` values of each of the ``pieces`` rows of ``whole``, as one array."""
    return whole.reshape(pieces, -1)[:, :piece].reshape(-1)


class FabricCollectives:
    """Rank 0's fabric: ``graph`` and ``run`` (topology, mode, faults), one ``LocalRun`` per collective call; each
    shape of call (collective, operator, root, length, packet) planned once."""

    def __init__(self, graph: nx.Graph, run: RunSpec) -> None:
        self.graph, self.run = graph, run
        self.tally = Tally()
        self.per_packet = program_of(run).elements  # the job's values a packet
        self._planned: dict[tuple[object, ...], tuple[RunSpec, RunPlan, type[SwitchProgram]]] = {}
        self.lock = threading.Lock()  # one call on the fabric at a time: collectives, and messages (another thread)

    def plan(self, name: str, op: str, root: int, workers: int, elements: int,
             per_packet: int) -> tuple[RunSpec, RunPlan, type[SwitchProgram]]:
        """The run, plan and program of a call of collective ``name`` with operator ``op`` on ``workers`` ranks,
        ``elements`` values, ``per_packet`` values a packet (0: the run's), made once per shape of call."""
        key = (name, op, root, workers, elements, per_packet, self.run)
        if key not in self._planned:
            run = replace(self.run, collective=name, root=root, program=PROGRAMS[op], workers=workers, elements=elements,
                          iterations=1, packet_elements=per_packet or self.run.packet_elements)
            rp = plan_run(self.graph, run, program_of(run))
            self._planned[key] = (run, rp, program_of(run, rp.fan_in))
        return self._planned[key]

    def collective(self, name: str, op: str, inputs: list[np.ndarray], root: int = 0, per_packet: int = 0,
                   planned: int = 0) -> list[np.ndarray]:
        """Every rank's result of collective ``name`` (innet.wire.collectives) with operator ``op`` over ``inputs``
        (rank r's flat numpy array at r), ``per_packet`` values a packet (default: the run's), planned as a call of
        ``planned`` values (default: its own): the whole result for each rank, its own part for routed collectives
        being assembled from the parts each rank received."""
        with self.lock:
            run, rp, program = self.plan(name, op, root, len(inputs), max(1, planned or len(inputs[0])), per_packet)
            local = LocalRun(self.graph, run, given={r: [t] for r, t in enumerate(inputs)}, planned=rp, program=program)
            self.tally.virtual_s += local.fabric.run()
            self.tally.carried(self.graph, local.fabric.direction_bytes())
        procs = sorted((p for p in local.procs if isinstance(p, WorkerProcess)), key=lambda p: p.spec.rank)
        for proc in procs:
            failed = proc.error or proc.calls[-1].error
            if failed is not None:
                raise RuntimeError(f"innet: {name} failed on the fabric: {failed}")
        values = [np.asarray(p.calls[-1].result) for p in procs]
        if COLLECTIVES[name].delivers == "owner":  # each rank got its shard: the whole is their concatenation
            spec = procs[0].spec
            whole = np.concatenate([COLLECTIVES[name].kept(v, r, len(values), root, spec.elements)
                                    for r, v in enumerate(values)])
            values = [whole for _ in values]
        return values

    def messages(self, size: int, posts: Sequence[tuple[int, int, bytes]], channel: int) -> list[list[list[bytes]]]:
        """Messages (sender's rank, receiver's rank, bytes) between the hosts of a group of ``size``, all at once,
        on ``channel`` (innet.hosts.p2p): what each rank received from each, in order (``[dst][src]`` is the list
        of src's messages to dst). Their bytes per link, and the planner's prediction of them, counted."""
        with self.lock:
            run, rp, program = self.plan("barrier", "sum", 0, size, 1, 0)
            done = exchange(self.graph, run, rp, program, [Post(s, d, channel, data) for s, d, data in posts])
            hosts = {spec.rank: host for host, spec in rp.specs[rp.plans[0].job].items()}
            self.tally.virtual_s += done.seconds
            self.tally.carried(self.graph, done.direction_bytes)
            self.tally.message_link_bytes.update({k: v for k, v in link_totals(done.direction_bytes).items() if v})
            self.tally.predicted_message_link_bytes.update(exchange_link_bytes(
                self.graph, [(hosts[s], hosts[d], len(data)) for s, d, data in posts], rp.per_packet))
            self.tally.messages += len(posts)
        out: list[list[list[bytes]]] = [[[] for _ in range(size)] for _ in range(size)]
        for dst, got in enumerate(done.received):
            for message in got:
                out[dst][message.src].append(message.data)
        return out
