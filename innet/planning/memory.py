"""How much memory a run will take, from the topology and the job alone, before anything is built.

A run that cannot fit in the machine's available memory is refused in one line
rather than left to the kernel's OOM killer halfway through bring-up. The figures
are per-part costs measured on this kind of machine (``scripts/bench_scale.py``
prints the estimate next to the measured peak); the estimate errs high.

- local: the interpreter and its libraries; per worker, its gradients and what a
  call holds for them (the fixed-point copy, every chunk's frame, the result:
  ``LOCAL_PER_ELEMENT`` bytes per element of every call); per switch its
  registers and its route table (one entry per node); per link direction its
  queues and fault injector.
- mininet: the same, plus one Python process per switch, worker and PBox, or per node group of them
  (innet.planning.grouping; ``MININET_PER_PROCESS``: an interpreter with numpy and innet loaded), every
  node's namespace with its links, and every raw port's buffers.
- torch ranks (``--backend gloo``, the gloo baseline of ``--mode all``, ``innet launch``): one process per worker
  host with torch, gloo and innet loaded (``TORCH_RANK``) and its tensors, in place of innet's processes.
"""

from __future__ import annotations

import os

import networkx as nx

from innet.errors import UserError
from innet.graph import is_switch
from innet.planning.configs import pick_workers
from innet.planning.grouping import process_count
from innet.planning.spec import RunSpec, program_of
from innet.wire.packet import ETH_LEN, link_mtu

MIB = 1 << 20
BASE = 150 * MIB  # python, numpy, scapy, networkx, innet loaded: 115 MiB measured (fat-tree k=4)
LOCAL_PER_ELEMENT = 24  # bytes per gradient element per worker: measured 16 at fat-tree k=16 (65536), 20 at k=32 (16384)
PER_ROUTE = 90  # one switch's route to one node (a dict entry, its int key)
PER_LINK = 8 * 1024  # both directions' queues, counters and fault injectors, and the graph's own
PER_NODE = 4 * 1024
MININET_PER_PROCESS = 45 * MIB  # measured: an innet switch or worker process, resident
MININET_PER_NODE = 3 * MIB // 2  # a node's namespace, shell and links: a bare fat-tree k=8 took 235 MiB for 208 nodes
TORCH_RANK = 270 * MIB  # measured: a rank with innet, torch and a gloo group of 2, after an all-reduce (268-269 MiB)
MININET_PORT_FRAMES = 256  # a raw port's receive buffer: 256 frames (innet.io.rawport; it sends frames from where they are)


def estimate_bytes(graph: nx.Graph, run: RunSpec, backend: str, node_group: int | None = None,
                   cores: int | None = None) -> int:
    """The estimated peak memory of ``run`` over ``graph`` on ``backend`` (``local`` or ``mininet``), its
    nodes ``node_group`` to a process there (None: innet.planning.grouping's choice for ``cores``)."""
    workers = len(pick_workers(graph, run.workers))
    switches = sum(1 for n in graph if is_switch(graph, n))
    degree = max((d for n, d in graph.degree if is_switch(graph, n)), default=1)
    program = program_of(run, degree)
    registers = program.memory_bytes()
    per_worker = 0 if run.train else LOCAL_PER_ELEMENT * sum(run.call_sizes())  # a learner's model is small
    total = (BASE + workers * per_worker + switches * (registers + PER_ROUTE * len(graph))
             + PER_LINK * graph.number_of_edges() + PER_NODE * len(graph))
    if run.backend == "gloo":  # no innet process: Mininet's nodes and one torch rank per worker host
        return total + MININET_PER_NODE * len(graph) + torch_ranks_bytes(workers, sum(run.call_sizes()))
    if backend == "mininet":
        cores = cores or os.cpu_count() or 1
        processes = process_count(switches, cores, node_group) + process_count(workers, cores, node_group, hosts=True)
        ports = sum(d for n, d in graph.degree if is_switch(graph, n)) + workers + 1
        per_port = MININET_PORT_FRAMES * (ETH_LEN + link_mtu(program.elements) + 64)  # a row: a frame, aligned
        total += MININET_PER_PROCESS * (processes + 1) + MININET_PER_NODE * len(graph) + per_port * ports
    return total


def torch_ranks_bytes(ranks: int, elements: int = 0) -> int:
    """The memory ``ranks`` torch ranks take, each holding ``elements`` gradient elements (what ``innet launch``
    and ``--backend gloo`` start: one per worker host)."""
    return ranks * (TORCH_RANK + LOCAL_PER_ELEMENT * elements)


def check_torch_ranks(ranks: int, elements: int = 0, available: int | None = None, besides: int = BASE) -> int:
    """Refuse, in one line, ``ranks`` torch ranks (and ``besides`` bytes of the rest of the run) that do not fit in the
    available memory; else return their estimate."""
    need = besides + torch_ranks_bytes(ranks, elements)
    have = available_bytes() if available is None else available
    if need > have:
        raise UserError(f"{ranks} torch ranks need about {need / 2**30:.1f} GiB ({TORCH_RANK // MIB} MiB each) but "
                        f"{have / 2**30:.1f} GiB is available; use fewer {{workers}} or a smaller topology")
    return need


def wont_fit(graph: nx.Graph, run: RunSpec, backend: str, available: int | None = None,
             node_group: int | None = None) -> str:
    """Why ``run`` does not fit in the available memory, in one line ("" when it does): ``check_memory``'s
    refusal as a note, for a part a run can leave out (``--mode all``'s gloo baseline)."""
    try:
        check_memory(graph, run, backend, available, node_group)
    except UserError as exc:
        return str(exc).split(";")[0]
    return ""


def available_bytes() -> int:
    """MemAvailable: what the kernel says can be had without swapping."""
    with open("/proc/meminfo", encoding="utf-8") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))


def check_memory(graph: nx.Graph, run: RunSpec, backend: str, available: int | None = None,
                 node_group: int | None = None) -> int:
    """Refuse, in one line, a run whose estimate exceeds the available memory; else return the estimate."""
    need = estimate_bytes(graph, run, backend, node_group)
    have = available_bytes() if available is None else available
    if need > have:
        workers = len(pick_workers(graph, run.workers))
        ranks = f", {TORCH_RANK // MIB} MiB a torch rank" if run.backend == "gloo" else ""
        raise UserError(
            f"this run needs about {need / 2**30:.1f} GiB ({workers} workers x {sum(run.call_sizes())} elements{ranks} on "
            f"{graph.number_of_nodes()} nodes, {backend} backend) but {have / 2**30:.1f} GiB is available; "
            "use fewer {elements} or {workers}, a smaller topology"
            + (", or the local backend" if backend == "mininet" else ""))
    return need
