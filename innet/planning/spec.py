"""What a run is: its parameters (``RunSpec``), the same for every backend, and what they derive (each call's
size and collective, the compute schedule). The rules about them are innet.planning.rules; the seeded
gradients, innet.hosts.job."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from innet.errors import UserError
from innet.graph import link_name
from innet.hosts.background import BackgroundSpec, parse_background
from innet.hosts.job import worker_tensors
from innet.hosts.learning.learner import Learner
from innet.hosts.learning.model import Task
from innet.hosts.ssp import Consistency
from innet.hosts.training import PHASES, PS_SCHEMES, Training, sharded_calls
from innet.hosts.workloads import WORKLOADS, load_workload
from innet.planning.checks import check_value
from innet.planning.options import (
    default_of,
    option,
    options_of,
    parse_bands,
    parse_crash,
    parse_dilation,
    parse_node_group,
    parse_straggler,
)
from innet.planning.planner import METHODS
from innet.switch.loader import load_program
from innet.switch.program import SwitchProgram
from innet.switch.runtime import DEFAULT_SWITCH_MEMORY
from innet.wire.collectives import COLLECTIVES, Collective
from innet.wire.faults import FaultSpec, parse_link_fault
from innet.wire.operators import SUM, Operator
from innet.wire.packet import BANDS

MODES = ("innet", "pbox", "ring")  # the schemes every run can compare; "all" is the command's
TOPOLOGIES = ("star", "leaf-spine", "fat-tree", "phub-rack")  # the builders (topologies.REGISTRY), or a file
RACKED = ("leaf-spine", "phub-rack")
TCLINK_MAX_MBPS = 1000.0  # the fastest rate Mininet's TCLink (tc htb) shapes: a dilation must bring links below it
LOCAL_MIN_RTO = 0.001  # the fabric's RTO floor: virtual time has no scheduling jitter
MININET_MIN_RTO = 0.02  # real seconds: a loaded 2-core machine delays an ACK this long now and then
FAULT_HELP = {  # the flags of ``faults``, one per FaultSpec field a user sets
    "loss": "loss probability on every link direction, e.g. 0.01",
    "dup": "duplication probability on every link direction",
    "reorder": "probability a frame is held back (reordered)",
    "delay": "extra one-way delay per link, seconds",
}


@dataclass(frozen=True)
class RunSpec:
    """Everything a run can be told: the one definition of every option. The command line's flags are made
    from its fields (each carries an ``Option``: flag, help, section, where it applies), and ``validate``
    holds every rule. Frozen: ``dataclasses.replace`` makes a variant."""

    # job
    mode: str = option("innet", group="job", choices=(*MODES, "all"),
                       help="innet: switches aggregate; pbox: the PBox host does (PHub); ring: ring all-reduce; all: "
                            "innet, pbox and ring (and the gloo backend on mininet when torch is installed), same "
                            "topology and gradients, side by side (default innet)")
    collective: str = option("allreduce", group="job", choices=tuple(COLLECTIVES),
                             help="what the job runs (SHARP's set): allreduce, reduce_scatter (rank r keeps the r-th "
                                  "shard of the reduction, whole packets), all_gather (rank r gives its shard, every "
                                  "rank gets the whole), broadcast (from --root), reduce (to --root), barrier (no "
                                  "payload) (default allreduce)")
    root: int = option(0, group="job", metavar="RANK",
                       help="the root rank of --collective broadcast and reduce (default 0)")
    program: str = option("", group="job", help="switch program: a name in switch_programs/ or a path to a .py file "
                                                 "(default sum_allreduce; topk_sparse with --topk)")
    placement: str = option("auto", group="job", choices=("auto", *METHODS, "pbox", "dynamic"),
                            help="which switches aggregate: auto (the fastest the timing model predicts, the default), "
                                 "root, tor (rack then root), tree (Steiner, links weighted by 1/bandwidth), pbox, "
                                 "dynamic (trees built chunk by chunk along the least congested uplinks: Canary; "
                                 "program dynamic_tree)")
    workers: int | None = option(None, group="job", help="workers in the job; for star, the number of hosts (default: "
                                                          "every host; star: 4)")
    elements: int = option(65536, group="job", help="gradient elements per worker per iteration (default 65536)")
    iterations: int = option(1, group="job", help="all-reduce calls per worker (default 1)")
    seed: int = option(0, group="job", help="seed of the gradients and of fault injection (default 0)")
    faults: FaultSpec = option(factory=FaultSpec, group="faults", help="the faults of every link direction")
    switch_memory: int = option(DEFAULT_SWITCH_MEMORY, group="job",
                                help="register memory per switch, bytes (default 4 MiB)")
    min_rto: float = option(0.0, group="job", help="the retransmission timer's floor, seconds (default "
                            f"{LOCAL_MIN_RTO:g} on local, {MININET_MIN_RTO:g} on mininet)")
    initial_rto: float = option(0.0, group="job", help="the retransmission timer before a round trip is measured, "
                                "seconds (default: four of the plan's unloaded round trips, at least the RTO floor)")
    timeout: float = option(10.0, group="job", help="seconds without progress before an all-reduce fails (default 10)")
    jobs: int = option(1, group="job", help="jobs at once, hosts dealt round-robin, each its own seed (default 1)")
    pool_slots: int = option(0, group="job", metavar="N",
                             help="slots in every switch's aggregation pool (per version), e.g. to cover a link's "
                                  "bandwidth-delay product (default: the program's own, 128 for sum_allreduce)")
    packet_elements: int = option(0, group="job", metavar="N",
                                  help="gradient values per packet (default: the program's own, 2048 for sum_allreduce: "
                                       "8250-byte frames); frames longer than Ethernet's 1500 bytes get jumbo MTUs on "
                                       "every link, up to 2239 values")
    job_slots: int = option(0, group="job", help="slots each job asks of every switch (default: the pool divided by "
                                                 "--jobs); a job that finds a switch full falls back to the PBox")
    job_priority: tuple[int, ...] = option((), group="job", metavar="B[,B...]", parse=parse_bands,
                                           help=f"priority band of each job's packets in every port's strict-priority "
                                                f"queues, job 1 first (0 = most urgent, up to {BANDS - 1}; default 0 for all)")
    background: BackgroundSpec = option(
        factory=BackgroundSpec, group="faults", metavar="PATTERN:LOAD[:tcp]", parse=parse_background,
        help="other tenants' traffic competing with the job: permutation, all-to-all, incast or hotspot:LINK, at LOAD "
             "(a fraction of link rate), e.g. permutation:0.5; open-loop streams, or with :tcp elastic flows that back "
             "off (TCP: the kernel's on Mininet); the report adds its throughput and utilisation.csv")
    link_faults: tuple[tuple[str, FaultSpec], ...] = option(
        (), group="faults", flag="--fault", metavar="LINK:K=V,...", parse=parse_link_fault, repeat=True,
        help="faults on one link (a--b) or one direction (a->b) instead, e.g. h3--t2:delay=0.01 (a straggler) or "
             "s1->t1:loss=0.2; repeatable")
    # workload
    workload: str = option("", group="workload", choices=tuple(sorted(WORKLOADS)),
                           help="train a model: each iteration all-reduces its layers' gradients (last layer first) as "
                                "backpropagation computes them, instead of one flat tensor (see README: Workloads)")
    workload_scale: float = option(0.01, group="workload", help="with --workload: shrink every layer (and the compute) "
                                                                "to this fraction (default 0.01)")
    pipeline: int = option(1, group="workload", choices=(1, 2),
                           help="with --workload: 1 = BSP; 2 = Pipe-SGD pipelining, iteration t+1 computes while t "
                                "communicates (default 1)")
    overlap: str = option("layers", group="workload", choices=("layers", "none"),
                          help="with --workload: when a layer's all-reduce may start: layers = once backpropagation "
                               "computed it (wait-free backpropagation, the default); none = after the whole backward "
                               "pass (Pipe-SGD's BSP baseline)")
    compute_scale: float = option(1.0, group="workload", help="with --workload: multiply every layer's compute time by "
                                                              "this (default 1: a V100 at batch 32)")
    topk: float = option(0.0, group="job", metavar="FRACTION",
                         help="send only this fraction of each gradient: top-k with error feedback, as (index, value) "
                              "pairs where shorter (innet and pbox; the ring sends the same values dense)")
    consistency: str = option("", group="consistency", choices=("bsp", "ssp", "asp"),
                              help="with --mode pbox: train against the PBox as a parameter server under BSP, SSP or ASP")
    staleness: int = option(3, group="consistency", help="ssp: the staleness bound s (default 3)")
    compute_time: float = option(0.01, group="consistency",
                                 help="--consistency: seconds of compute per iteration (default 0.01)")
    stragglers: tuple[tuple[str, float, float], ...] = option(
        (), group="consistency", flag="--straggler", metavar="HOST:FACTOR[:PROB]", parse=parse_straggler, repeat=True,
        help="--consistency: HOST's compute is FACTOR times longer, in each iteration with probability PROB (default 1)")
    sharded: bool = option(False, group="workload", switch=True,
                           help="with --workload: sharded data parallelism (FSDP's schedule): all-gather each layer "
                                "before its forward and backward pass, reduce-scatter its gradient, instead of all-reduce")
    slice_elements: int = option(0, group="workload", flag="--slice", metavar="ELEMENTS",
                                 help="with a workload: cut every layer into all-reduce calls of at most ELEMENTS "
                                      "(default 0: whole layers)")
    priority: str = option("fifo", group="workload", choices=("fifo", "p3"),
                           help="with a workload: send calls in backward order (fifo), or the ready layer needed first (p3)")
    ps: str = option("", group="workload", choices=PS_SCHEMES, needs="predict", metavar="SCHEME",
                     help="with a workload: also model its exchange on MXNet-style parameter servers beside the workers "
                          "(model only: --predict's ps_iteration_s; innet.planning.timing.kvstore): kvstore = MXNet's "
                          "KVStore (whole-layer keys round-robin over the servers, big ones split over all, a key pulled "
                          "once wholly pushed, FIFO); whole = one server per key, none split; sliced = the run's slices; "
                          "priority = the lowest layer first; p3 = both")
    input_elements: int = option(0, group="shared input", metavar="N",
                                 help="every worker also reads N int32 input values per iteration, streamed from the "
                                      "PBox host (rank r of every job reads the same shard)")
    shared_input: bool = option(False, group="shared input", switch=True,
                                help="with --input-elements: one stream per rank, multicast by the switches to every "
                                     "job, instead of one unicast copy per job")
    # training
    train: str = option("", group="training", metavar="DATASET",
                        help="train a real model on DATASET (digits: scikit-learn's handwritten digits), data-parallel: "
                             "every step's gradients all-reduced through the network; --mode all trains once per scheme "
                             "(innet, pbox, ring, top-k, ssp, asp) and compares each with an exact float baseline")
    model: str = option("mlp", group="training", needs="train",
                        help="with --train: the model (mlp: one hidden ReLU layer, softmax; default mlp)")
    epochs: int = option(10, group="training", needs="train", help="with --train: epochs (default 10)")
    batch: int = option(32, group="training", needs="train",
                        help="with --train: the global batch, split evenly among the workers (default 32)")
    lr: float = option(0.5, group="training", needs="train", help="with --train: the learning rate (default 0.5)")
    hidden: int = option(64, group="training", needs="train", help="with --train: the MLP's hidden width (default 64)")
    # topology
    topo: str = option("leaf-spine", group="topology",
                       help="star, leaf-spine, fat-tree, phub-rack, or a .graphml/.json file (default leaf-spine)")
    racks: int | None = option(None, group="topology", topos=RACKED, help="leaf-spine/phub-rack: racks (default 2)")
    hosts_per_rack: int | None = option(None, group="topology", topos=RACKED,
                                        help="leaf-spine/phub-rack: hosts per rack (default 2, phub-rack 4)")
    spines: int | None = option(None, group="topology", topos=("leaf-spine",),
                                help="leaf-spine: spine switches (default 1)")
    oversubscription: float | None = option(None, group="topology", topos=RACKED,
                                            help="leaf-spine/phub-rack: ToR uplink oversubscription")
    k: int | None = option(None, group="topology", topos=("fat-tree",), help="fat-tree: arity k (default 4)")
    bw: float | None = option(None, group="topology",
                              help=f"host link bandwidth in Mbit/s (default 1000; on Mininet at most "
                                   f"{TCLINK_MAX_MBPS:g} once divided by --dilation)")
    save_topology: str = option("", group="topology", metavar="FILE",
                                help="also write the topology as FILE: .json (node-link, as p4-utils writes it) or .graphml")
    # backend
    backend: str = option("", group="backend", choices=("mininet", "local", "gloo"),
                          help="mininet: real Python switches on veth links (needs root; the default as root); "
                               "local: the in-process fabric in virtual time (no root); gloo: torch.distributed's "
                               "gloo all-reduce between the same Mininet hosts, no innet process (root, torch)")
    pbox_cores: int = option(1, group="job", help="PBox shards (processes), keys spread by slot (default 1)")
    pbox_layout: str = option("central", group="job", choices=("central", "rack", "sharded"), backends=("local",),
                              help="with --mode pbox, where keys are summed: central (one PBox), rack (PHub's "
                                   "hierarchy: a PBox per rack sums its rack, the central PBox the racks' sums) or "
                                   "sharded (a stock PS: keys spread by slot over a server per worker, each an ordinary "
                                   "host); phub-rack builds the racks' boxes and servers (default central)")
    crash: tuple[tuple[str, float], ...] = option(
        (), group="faults", metavar="HOST@SECONDS", parse=parse_crash, repeat=True,
        help="kill a worker host's process that many seconds into the run (virtual seconds on local)")
    pcap: str = option("", group="backend", backends=("mininet",),
                       help="mininet: write a pcap per switch interface into this directory")
    cli: bool = option(False, group="backend", switch=True, backends=("mininet",),
                       help="mininet: open the Mininet CLI after the run")
    dilation: float | str = option("auto", group="backend", metavar="auto|off|F", parse=parse_dilation,
                                   help="mininet: time dilation (README: Performance): links F times slower, every delay, "
                                        "compute time and timeout F times longer, every reported time divided by F. auto "
                                        "(the default): F = the host link's rate over the rate this machine carries "
                                        "faithfully (calibrated once, cached); off: F = 1. The local backend runs in "
                                        "virtual time and takes auto or off only")
    data_plane: str = option("auto", group="backend", choices=("python", "ebpf", "auto"), backends=("mininet",),
                             help="mininet: the switches' data plane: python, ebpf: the built-in sum all-reduce as a "
                                  "tc program on every switch port (README: eBPF switch), or auto (the default): ebpf "
                                  "where this machine can build and load it (root, clang or a cached build), else "
                                  "python; what it cannot run stays on the Python switch, with a line saying so")
    node_group: int | None = option(None, group="backend", metavar="auto|off|G", parse=parse_node_group,
                                    backends=("mininet",),
                                    help="mininet: switches (and workers) served per Python process, each node still in "
                                         "its own namespace with its own links. auto (the default): a process per node "
                                         "up to 12 per core, else 4 processes per core per kind (a fat-tree k=8 in 16); "
                                         "off: a process per node")
    cluster: str = option("", group="backend", metavar="HOST1,HOST2,...", backends=("mininet",),
                          help="mininet: spread switches and hosts over these servers (ssh as root; Mininet's cluster "
                               "mode), links between servers as VXLAN tunnels; scripts/cluster_servers.py makes test servers")
    cluster_key: str = option("", group="backend", metavar="FILE", needs="cluster",
                              help="with --cluster: the private key for the servers' ssh logins (default: ssh's own)")
    cluster_known_hosts: str = option("", group="backend", metavar="FILE", needs="cluster",
                                      help="with --cluster: the servers' host keys (default: ssh's known_hosts)")
    # the model's prediction
    predict: bool = option(False, group="workload", switch=True,
                           help="print the timing model's prediction next to every measured run, with the error")
    hop_latency: float | None = option(None, group="workload", needs="predict",
                                       help="with --predict: seconds a node takes to pass a frame on (default 0 on "
                                            "local, 0.0006 on mininet)")
    # output
    out: str = option("", group="output", help="directory for results.json and links.csv (default results/<timestamp>)")
    json: str = option("", group="output", help="also write the results JSON to this path")
    timeline: str = option("", group="output", metavar="FILE",
                           help="also write a trace of the run to FILE (Chrome/Perfetto trace-event JSON): each rank's "
                                "calls, each switch's aggregation slots held")
    plots: bool = option(True, group="output", flag="--no-plots", switch=True,
                         help="do not write links.png and tiers.png")

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(RunSpec)
        for f, opt in options_of(RunSpec):
            check_value(f, opt, hints[f.name], getattr(self, f.name))
        if self.seed < 0:  # numpy's SeedSequence takes non-negative integers only
            raise UserError(f"{{seed}} must be a non-negative integer, got {self.seed}")
        self._read_texts()
        if not self.program:  # the program the run's options call for
            object.__setattr__(self, "program", "topk_sparse" if self.topk else
                               "dynamic_tree" if self.placement == "dynamic" else "sum_allreduce")
        if not self.min_rto:
            object.__setattr__(self, "min_rto", MININET_MIN_RTO if self.backend == "mininet" else LOCAL_MIN_RTO)
        if self.train:  # a training run all-reduces the model's parameters once a step
            task = self.task(1)
            object.__setattr__(self, "elements", task.mlp.size)
            object.__setattr__(self, "iterations", task.steps)

    def _read_texts(self) -> None:
        """Options given as their flag's text (``crash=["h1@2"]``, ``dilation="off"``), read as the flag reads them."""
        for f, opt in options_of(RunSpec):
            value = getattr(self, f.name)
            if opt.parse is None or (not opt.repeat and (not isinstance(value, str) or f.type == "str")):
                continue
            try:
                if opt.repeat:
                    value = tuple(opt.parse(v) if isinstance(v, str) else v for v in value)
                else:
                    value = opt.parse(value)
            except ValueError as exc:
                raise UserError(f"{{{f.name}}} {exc}") from None
            object.__setattr__(self, f.name, value)

    def given(self) -> set[str]:
        """The fields set to something other than their default."""
        return {f.name for f, _ in options_of(RunSpec) if getattr(self, f.name) != default_of(f)}

    def task(self, workers: int) -> Task:
        """What a training run trains, with ``workers`` workers (``train`` runs only)."""
        return Task(self.train, self.model, self.epochs, self.batch, self.lr, self.hidden, self.seed, workers)

    def learner(self, workers: int, rank: int) -> Learner:
        """Worker ``rank``'s gradients, step by step, of a training run."""
        return Learner(self.task(workers), rank, self.topk)

    def _slices(self) -> list[tuple[int, int, bool]]:
        """One iteration's calls in FIFO order, layers backward: (forward index of the layer, elements,
        first slice of its layer), each layer cut into slices of at most ``slice_elements``."""
        layers = load_workload(self.workload, self.workload_scale).layers
        out = []
        for index in reversed(range(len(layers))):
            n = layers[index].elements
            size = self.slice_elements or n
            out += [(index, min(size, n - at), at == 0) for at in range(0, n, size)]
        return out

    def _sharded(self) -> list[tuple[str, int]]:
        """One sharded iteration's calls (innet.hosts.training.sharded_calls), [] unless ``sharded``."""
        return sharded_calls(len(load_workload(self.workload, self.workload_scale).layers)) if self.sharded else []

    def call_sizes(self) -> list[int]:
        """The elements of each all-reduce call of a worker, in FIFO order (a barrier's carry none)."""
        if not self.collective_of.payload:
            return [0] * self.iterations
        if not self.workload:
            return [self.elements] * self.iterations
        if self.sharded:  # each call moves its whole layer (all-gathered or reduce-scattered)
            layers = load_workload(self.workload, self.workload_scale).layers
            return [layers[i].elements for _, i in self._sharded()] * self.iterations
        return [n for _, n, _ in self._slices()] * self.iterations

    def call_collectives(self) -> list[Collective]:
        """Each call's collective, in FIFO order: the run's, or a sharded schedule's own per call."""
        if not self.sharded:
            return [self.collective_of] * len(self.call_sizes())
        return [COLLECTIVES[PHASES[phase]] for phase, _ in self._sharded()] * self.iterations

    def calls(self) -> list[tuple[int, Collective]]:
        """Each call of a worker, in FIFO order: its elements and its collective."""
        return list(zip(self.call_sizes(), self.call_collectives(), strict=True))

    def layers(self) -> int:
        """Calls per iteration: a workload's layers (or their slices, or a sharded schedule's calls), else 1."""
        return len(self._sharded() or self._slices()) if self.workload else 1

    def tensors(self, job: int, rank: int) -> list[np.ndarray]:
        """What worker ``rank`` of ``job`` all-reduces, call by call."""
        return worker_tensors(self.seed, job, rank, self.call_sizes(), self.topk, self.layers(), self.operator.rule == "bits")

    @cached_property
    def collective_of(self) -> Collective:
        """The run's collective, as a value."""
        return COLLECTIVES[self.collective]

    @cached_property
    def operator(self) -> Operator:
        """The reduce operator of the run's program (sum for a program that names none)."""
        return getattr(program_of(self), "operator", SUM)

    def training(self) -> Training | None:
        """The compute schedule the calls follow (None: back to back, no compute)."""
        if self.train and self.compute_time and not self.consistency:  # each step computes, then all-reduces
            return Training(0.0, (self.compute_time,))
        if not self.workload:
            return None
        w = load_workload(self.workload, self.workload_scale)
        c, backward = self.compute_scale, w.backward_times()
        slices = self._slices()  # a layer's backward time passes before its first slice
        forward = tuple(c * f for f in w.forward_times())
        before = [c * backward[i] if first else 0.0 for i, _, first in slices]  # backward seconds before each call
        if self.sharded:  # a gradient call carries its layer's backward seconds (innet.hosts.training.ShardedClock)
            calls = self._sharded()
            return Training(sum(forward), tuple(c * backward[i] if p == "gradient" else 0.0 for p, i in calls),
                            layer=tuple(i for _, i in calls), forward_layers=forward, phases=tuple(p for p, _ in calls))
        if self.overlap == "none":  # every call waits for the whole backward pass
            before = [sum(before)] + [0.0] * (len(before) - 1)
        return Training(sum(forward), tuple(before),
                        self.pipeline, tuple(i for i, _, _ in slices), forward_layers=forward,
                        layerwise=self.priority == "p3")

    def parameter_server(self) -> Consistency:
        """How the PBox answers this run's training pushes (``consistency`` runs only)."""
        return Consistency(self.consistency, self.staleness, self.iterations, self.elements)

    def compute_times(self, host: str, job: int, rank: int) -> list[float]:
        """Seconds of compute of each iteration on ``host``: ``compute_time``, times a straggler's factor
        in the iterations it straggles (seeded)."""
        rng = np.random.default_rng([self.seed, job, rank, 7])
        factor, chance = next(((f, p) for h, f, p in self.stragglers if h == host), (1.0, 0.0))
        return [self.compute_time * (factor if rng.random() < chance else 1.0) for _ in range(self.iterations)]

    def band(self, job: int) -> int:
        """The priority band of job ``job``'s packets (jobs count from 1)."""
        return self.job_priority[job - 1] if self.job_priority else 0

    def faults_on(self, sender: str, receiver: str) -> FaultSpec:
        """The faults of frames ``sender`` puts on its link to ``receiver``: the direction's,
        else the link's, else the run's."""
        if not self.link_faults:  # asked per link of every path the timing model walks
            return self.faults
        given = dict(self.link_faults)
        return given.get(f"{sender}->{receiver}", given.get(link_name(sender, receiver), self.faults))


def program_of(run: RunSpec, fan_in: int = 0) -> type[SwitchProgram]:
    """The switch program ``run`` names, with its pool and packet size, and room for ``fan_in``
    contributors at one switch (the plan's largest)."""
    return load_program(run.program, run.pool_slots, run.packet_elements, fan_in)
