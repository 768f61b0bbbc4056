"""What a run is: its parameters (``RunSpec``), the same for every backend, and the seeded gradients
it all-reduces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from innet.errors import UserError
from innet.graph import link_name
from innet.hosts.learner import Learner
from innet.hosts.model import Task
from innet.hosts.ssp import Consistency
from innet.hosts.training import Training
from innet.hosts.workloads import load_workload
from innet.switch.loader import load_program
from innet.switch.program import SwitchProgram
from innet.switch.runtime import DEFAULT_SWITCH_MEMORY
from innet.wire.faults import FaultSpec
from innet.wire.operators import SUM, Operator
from innet.wire.sparse import topk_with_feedback


@dataclass(frozen=True)
class RunSpec:
    """What to run; the same for every backend."""

    mode: str = "innet"
    program: str = "sum_allreduce"
    placement: str = "auto"  # or a METHODS name, or "pbox"; auto: innet.run.modes.fastest_placement
    workers: int | None = None
    elements: int = 65536
    iterations: int = 1
    seed: int = 0
    faults: FaultSpec = field(default_factory=FaultSpec)
    switch_memory: int = DEFAULT_SWITCH_MEMORY
    min_rto: float = 0.001
    initial_rto: float = 1.0  # RFC 6298's: the first window may queue behind a slow link
    timeout: float = 10.0
    jobs: int = 1
    pool_slots: int = 0  # slots in every switch's pool, per version (0: the program's own)
    packet_elements: int = 0  # gradient values per packet (0: the program's own)
    job_slots: int = 0  # slots each job asks of every switch (0: the pool divided by the jobs)
    job_priority: tuple[int, ...] = ()  # each job's priority band, job 1 first (empty: band 0 for all)
    link_faults: tuple[tuple[str, FaultSpec], ...] = ()  # per link ("a--b") or direction ("a->b")
    workload: str = ""  # a model (innet.hosts.workloads): iterations over its layers instead of one flat tensor
    workload_scale: float = 0.01  # the model's layers (and compute) shrunk to this fraction
    pipeline: int = 1  # with a workload: 1 = BSP, 2 = Pipe-SGD width-2 pipelining
    overlap: str = "layers"  # with a workload: a layer's all-reduce starts once backpropagation computed it
    # ("layers", wait-free backpropagation) or once the whole backward pass is done ("none", Pipe-SGD's BSP)
    compute_scale: float = 1.0  # with a workload: multiplies every layer's compute time (a faster or slower GPU)
    topk: float = 0.0  # > 0: workers send only this fraction of each gradient, top-k with error feedback (innet.wire.sparse)
    consistency: str = ""  # pbox training (innet.hosts.ssp): "bsp", "ssp" or "asp"; "": all-reduce calls
    staleness: int = 0  # ssp: the bound s
    compute_time: float = 0.0  # training without a workload: seconds of compute per iteration
    stragglers: tuple[tuple[str, float, float], ...] = ()  # (host, compute factor, probability per iteration)
    slice_elements: int = 0  # with a workload: cut layers into all-reduce calls of at most this many elements (0: whole)
    priority: str = "fifo"  # with a workload: "fifo" (backward order) or "p3" (the layer needed first goes first)
    input_elements: int = 0  # > 0: every worker reads this many input values per iteration from the PBox host
    shared_input: bool = False  # with input_elements: one multicast stream for all jobs instead of a copy each
    train: str = ""  # a data set (innet.hosts.model): train a real model on it; elements and iterations follow from it
    model: str = "mlp"  # with train: the model
    epochs: int = 10  # with train
    batch: int = 32  # with train: the global batch, divided evenly among the workers
    lr: float = 0.5  # with train: the learning rate
    hidden: int = 64  # with train: the MLP's hidden width

    def __post_init__(self) -> None:
        if self.seed < 0:  # numpy's SeedSequence takes non-negative integers only
            raise UserError(f"{{seed}} must be a non-negative integer, got {self.seed}")
        if self.train:  # a training run all-reduces the model's parameters once a step
            task = self.task(1)
            object.__setattr__(self, "elements", task.mlp.size)
            object.__setattr__(self, "iterations", task.steps)

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

    def call_sizes(self) -> list[int]:
        """The elements of each all-reduce call of a worker, in FIFO order."""
        if not self.workload:
            return [self.elements] * self.iterations
        return [n for _, n, _ in self._slices()] * self.iterations

    def layers(self) -> int:
        """Calls per iteration: a workload's layers (or their slices), else 1."""
        return len(self._slices()) if self.workload else 1

    def tensors(self, job: int, rank: int) -> list[np.ndarray]:
        """What worker ``rank`` of ``job`` all-reduces, call by call."""
        return worker_tensors(self.seed, job, rank, self.call_sizes(), self.topk, self.layers(), self.operator.rule == "bits")

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


def make_tensors(seed: int, job: int, rank: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Seeded gradients: per call, normal values with a per-worker magnitude."""
    rng = np.random.default_rng([seed, job, rank])
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 1)).astype(np.float32) for n in sizes]


def make_bitsets(seed: int, job: int, rank: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Seeded int32 bit sets for the bit operators: each bit set with probability 1/8."""
    rng = np.random.default_rng([seed, job, rank])
    return [(rng.integers(0, 2**32, n, np.uint32) & rng.integers(0, 2**32, n, np.uint32)
             & rng.integers(0, 2**32, n, np.uint32)).view(np.int32) for n in sizes]


def worker_tensors(seed: int, job: int, rank: int, sizes: Sequence[int], topk: float = 0.0,
                   layers: int = 1, bits: bool = False) -> list[np.ndarray]:
    """The seeded gradients (bit sets with ``bits``), or with ``topk`` what top-k with error feedback per
    layer keeps of them."""
    if bits:
        return make_bitsets(seed, job, rank, sizes)
    tensors = make_tensors(seed, job, rank, sizes)
    return topk_with_feedback(tensors, topk, layers) if topk else tensors


def program_of(run: RunSpec, fan_in: int = 0) -> type[SwitchProgram]:
    """The switch program ``run`` names, with its pool and packet size, and room for ``fan_in``
    contributors at one switch (the plan's largest)."""
    return load_program(run.program, run.pool_slots, run.packet_elements, fan_in)
