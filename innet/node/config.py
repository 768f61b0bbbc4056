"""What the controller tells each node process, as frozen values: ``python -m innet.node ROLE CONFIG``.

The Mininet backend builds one of these per process and writes it with innet.node.codec; the process
reads the same class back. A group of nodes in one process (innet.planning.grouping) is a tuple of them,
each naming the namespace (``netns``) its ports open in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from innet.hosts.ensemble import InputPlan, Receiver
from innet.hosts.job import JobSpec
from innet.hosts.learning.model import Task
from innet.hosts.pbox import PBoxJob
from innet.hosts.ssp import Consistency
from innet.hosts.training import Training
from innet.node.admission import AdmissionReport
from innet.switch.runtime import SwitchConfig, SwitchReport
from innet.wire.faults import FaultSpec, Hold


@dataclass(frozen=True)
class PortFaults:
    """The faults a port injects on the frames it sends (the link behind it), and their injector's seed
    (innet.wire.faults.fault_seed). ``rate``: the link's bytes per second where the port holds each frame for
    its serialization too (a dilated run, innet.backends.mininet.nodes.port_faults); 0: it does not. ``hold_in``:
    a host's port holds each frame it receives for the same, the hop's end the eBPF switch in front of it does not
    hold (innet.node.egress); ``hold_path``: and for the hops between switches its frames crossed unheld (seconds,
    seconds per byte: innet.ebpf.holds.path_holds); ``hold_from``: the sources (node indices) whose
    frames crossed other hops (a ring's acknowledgements from the other side), and theirs; ``hold_out``: a host's
    port holds each frame it sends this much longer too (so that it meets the frames of flows that crossed fewer
    hops between switches unheld as on the Python switch)."""

    spec: FaultSpec = field(default_factory=FaultSpec)
    seed: int = 0
    rate: float = 0.0
    hold_in: bool = False
    hold_path: Hold = (0.0, 0.0)
    hold_from: dict[int, Hold] = field(default_factory=dict)
    hold_out: Hold = (0.0, 0.0)


Faults = dict[int, PortFaults]  # port number -> its faults
NO_FAULTS: Faults = {0: PortFaults()}


@dataclass(frozen=True)
class SwitchNodeConfig:
    """One switch process's (or one switch of a group's): its program, ports and control socket."""

    program: str
    ports: dict[int, str]  # port number -> interface
    faults: Faults
    control: str  # the Unix socket the controller installs the switch through
    pool_slots: int = 0
    packet_elements: int = 0
    fan_in: int = 0
    netns: str = ""  # in a group: the namespace its ports open in
    ebpf: str = ""  # --data-plane ebpf: the built tc program (innet.ebpf) its ports run before this process
    xdp: bool = False  # and switch.c's XDP half before it (innet.ebpf.loader: contributions taken before an skb, a
    # root's results sent as XDP frames, unshaped: the bench's ports only)


@dataclass(frozen=True)
class Install:
    """The controller's ``install``: the switch's routes and jobs (innet.schemes.modes.installed_configs)."""

    config: SwitchConfig


@dataclass(frozen=True)
class Installed:
    """A switch's answer to ``install``: ``error`` when it refused the configuration."""

    error: str = ""
    memory_bytes: int = 0
    data_plane: str = "python"  # "ebpf": its ports run the tc program (innet.ebpf)


@dataclass(frozen=True)
class SwitchStats:
    """A switch's answer to ``stats``: its runtime's report (None before ``install``), the CPU seconds spent on
    it, the frames its fault injectors lost, and each port's socket drops and full-queue waits."""

    cpu_s: float
    lost: int
    socket_drops: dict[str, int]
    qdisc_waits: dict[str, int]
    admission: AdmissionReport
    runtime: SwitchReport | None = None

    @property
    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes if self.runtime is not None else 0

    @property
    def counters(self) -> dict[str, int]:
        return self.runtime.counters if self.runtime is not None else {}


@dataclass(frozen=True)
class WorkerConfig:
    """One worker host's: its job, the tensors it reduces (seeded, or its learner's), its schedule, and how
    long its ring rank may linger at most after its result is saved (innet.hosts.ring.linger.Linger)."""

    spec: JobSpec
    seed: int
    sizes: tuple[int, ...]
    topk: float
    layers: int
    ssp: Consistency | None
    compute: tuple[float, ...]
    task: Task | None
    training: Training | None
    port: str
    faults: Faults
    result: str  # the .npz file the worker writes what came back to
    mode: str
    ring: tuple[int, ...]
    linger_limit: float  # a ring rank's last resort when its predecessor's DONE does not come (0: no linger)
    netns: str = ""


@dataclass(frozen=True)
class PBoxConfig:
    """One PBox shard's: the keys with slot % cores == core of every job it serves."""

    node: int
    cores: int
    core: int
    port: str
    faults: Faults
    jobs: tuple[PBoxJob, ...]


@dataclass(frozen=True)
class InputConfig:
    """An ensemble's input reader beside a worker (innet.hosts.ensemble): it writes its outcome to ``result``."""

    plan: InputPlan
    port: str
    faults: Faults
    reader: Receiver
    result: str


@dataclass(frozen=True)
class InputServerConfig:
    """The ensemble's input server on the PBox host: it keeps its ``InputServerStats`` in ``stats``."""

    plan: InputPlan
    port: str
    faults: Faults
    stats: str


@dataclass(frozen=True)
class InputServerStats:
    sent_bytes: int
    nacks: int
    resent: int


@dataclass(frozen=True)
class SwitchGroup:
    switches: tuple[SwitchNodeConfig, ...]


@dataclass(frozen=True)
class WorkerGroup:
    workers: tuple[WorkerConfig, ...]
