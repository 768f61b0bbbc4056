"""``run_topology.py``: bring a topology up, run all-reduce, check it, report the bytes."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any, NoReturn

from innet.errors import UserError
from innet.hosts.workloads import WORKLOADS
from innet.plan.dilation import LOCAL_MIN_RTO, MININET_MIN_RTO, TCLINK_MAX_MBPS, auto_factor, host_link_rate
from innet.plan.planner import METHODS
from innet.plan.spec import RunSpec, program_of
from innet.results.fidelity import fidelity_line
from innet.results.learning import learning_lines
from innet.results.metrics import (
    cluster_lines,
    input_lines,
    job_lines,
    summary_table,
    training_lines,
    write_link_csv,
    write_results,
)
from innet.run.modes import MODES
from innet.wire.faults import FaultSpec, parse_link_fault
from innet.wire.packet import BANDS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad flags are one line too (argparse would print the usage first)."""
        self.exit(2, f"error: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="run_topology.py",
        description="Run gradient all-reduce over an emulated topology, in-network and as baselines, "
                    "check every result and report where the bytes went.",
    )
    p.add_argument("--backend", choices=("mininet", "local"), default=None,
                   help="mininet: real Python switches on veth links (needs root; the default as root); "
                        "local: the in-process fabric in virtual time (no root)")
    p.add_argument("--topo", default="leaf-spine",
                   help="star, leaf-spine, fat-tree, phub-rack, or a .graphml/.json file (default leaf-spine)")
    p.add_argument("--program", default=None,
                   help="switch program: a name in switch_programs/ or a path to a .py file "
                        "(default sum_allreduce; topk_sparse with --topk)")
    p.add_argument("--topk", type=float, default=0.0, metavar="FRACTION",
                   help="send only this fraction of each gradient: top-k with error feedback, as (index, value) "
                        "pairs where shorter (innet and pbox; the ring sends the same values dense)")
    p.add_argument("--mode", choices=(*MODES, "gloo", "all"), default="innet",
                   help="innet: switches aggregate; pbox: the PBox host does (PHub); ring: ring all-reduce; "
                        "gloo: torch.distributed's gloo all-reduce between the same hosts (mininet, needs torch); "
                        "all: innet, pbox and ring (and gloo on mininet when torch is installed), same topology "
                        "and gradients, side by side (default innet)")
    p.add_argument("--plan-only", action="store_true", help="print the placement plan and predicted bytes, start nothing")
    p.add_argument("--pbox-cores", type=int, default=1, help="PBox shards (processes), keys spread by slot (default 1)")
    p.add_argument("--no-plots", action="store_true", help="do not write links.png and tiers.png")
    p.add_argument("--placement", choices=("auto", *METHODS, "pbox"), default="auto",
                   help="which switches aggregate: auto (the fastest the timing model predicts, the default), "
                        "root, tor (rack then root), tree (Steiner, links weighted by 1/bandwidth), pbox")
    p.add_argument("--workers", type=int, default=None,
                   help="workers in the job; for star, the number of hosts (default: every host; star: 4)")
    p.add_argument("--elements", type=int, default=65536, help="gradient elements per worker per iteration (default 65536)")
    p.add_argument("--iterations", type=int, default=1, help="all-reduce calls per worker (default 1)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default=None,
                   help="train a model: each iteration all-reduces its layers' gradients (last layer first) as "
                        "backpropagation computes them, instead of one flat tensor (see README: Workloads)")
    p.add_argument("--workload-scale", type=float, default=0.01,
                   help="with --workload: shrink every layer (and the compute) to this fraction (default 0.01)")
    p.add_argument("--pipeline", type=int, default=1, choices=(1, 2),
                   help="with --workload: 1 = BSP; 2 = Pipe-SGD pipelining, iteration t+1 computes while t "
                        "communicates (default 1)")
    p.add_argument("--compute-scale", type=float, default=1.0,
                   help="with --workload: multiply every layer's compute time by this (default 1: a V100 at batch 32)")
    p.add_argument("--slice", type=int, default=0, metavar="ELEMENTS",
                   help="with a workload: cut every layer into all-reduce calls of at most ELEMENTS (default 0: whole layers)")
    p.add_argument("--priority", choices=("fifo", "p3"), default="fifo",
                   help="with a workload: send calls in backward order (fifo), or the ready layer needed first (p3)")
    p.add_argument("--predict", action="store_true",
                   help="print the timing model's prediction next to every measured run, with the error")
    p.add_argument("--hop-latency", type=float, default=None,
                   help="with --predict: seconds a node takes to pass a frame on (default 0 on local, 0.0006 on mininet)")
    p.add_argument("--consistency", choices=("bsp", "ssp", "asp"), default=None,
                   help="with --mode pbox: train against the PBox as a parameter server under BSP, SSP or ASP")
    p.add_argument("--staleness", type=int, default=3, help="ssp: the staleness bound s (default 3)")
    p.add_argument("--compute-time", type=float, default=0.01,
                   help="--consistency: seconds of compute per iteration (default 0.01)")
    p.add_argument("--straggler", action="append", default=[], metavar="HOST:FACTOR[:PROB]",
                   help="--consistency: HOST's compute is FACTOR times longer, in each iteration with probability PROB (default 1)")
    p.add_argument("--train", default=None, metavar="DATASET",
                   help="train a real model on DATASET (digits: scikit-learn's handwritten digits), data-parallel: every "
                        "step's gradients all-reduced through the network; --mode all trains once per scheme "
                        "(innet, pbox, ring, top-k, ssp, asp) and compares each with an exact float baseline")
    p.add_argument("--model", default="mlp", help="with --train: the model (mlp: one hidden ReLU layer, softmax; default mlp)")
    p.add_argument("--epochs", type=int, default=10, help="with --train: epochs (default 10)")
    p.add_argument("--batch", type=int, default=32, help="with --train: the global batch, split evenly among the workers (default 32)")
    p.add_argument("--lr", type=float, default=0.5, help="with --train: the learning rate (default 0.5)")
    p.add_argument("--hidden", type=int, default=64, help="with --train: the MLP's hidden width (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the gradients and of fault injection (default 0)")
    p.add_argument("--racks", type=int, default=None, help="leaf-spine/phub-rack: racks (default 2)")
    p.add_argument("--hosts-per-rack", type=int, default=None, help="leaf-spine/phub-rack: hosts per rack (default 2, phub-rack 4)")
    p.add_argument("--spines", type=int, default=None, help="leaf-spine: spine switches (default 1)")
    p.add_argument("--oversubscription", type=float, default=None, help="leaf-spine/phub-rack: ToR uplink oversubscription")
    p.add_argument("--k", type=int, default=None, help="fat-tree: arity k (default 4)")
    p.add_argument("--bw", type=float, default=None,
                   help=f"host link bandwidth in Mbit/s (default 1000; on Mininet at most {TCLINK_MAX_MBPS:g} once divided by --dilation)")
    p.add_argument("--loss", type=float, default=0.0, help="loss probability on every link direction, e.g. 0.01")
    p.add_argument("--dup", type=float, default=0.0, help="duplication probability on every link direction")
    p.add_argument("--reorder", type=float, default=0.0, help="probability a frame is held back (reordered)")
    p.add_argument("--delay", type=float, default=0.0, help="extra one-way delay per link, seconds")
    p.add_argument("--fault", action="append", default=[], metavar="LINK:K=V,...",
                   help="faults on one link (a--b) or one direction (a->b) instead, e.g. h3--t2:delay=0.01 (a straggler) "
                        "or s1->t1:loss=0.2; repeatable")
    p.add_argument("--crash", action="append", default=[], metavar="HOST@SECONDS",
                   help="kill a worker host's process that many seconds into the run (virtual seconds on local)")
    p.add_argument("--jobs", type=int, default=1, help="jobs at once, hosts dealt round-robin, each its own seed (default 1)")
    p.add_argument("--input-elements", type=int, default=0, metavar="N",
                   help="every worker also reads N int32 input values per iteration, streamed from the PBox host "
                        "(rank r of every job reads the same shard)")
    p.add_argument("--shared-input", action="store_true",
                   help="with --input-elements: one stream per rank, multicast by the switches to every job, "
                        "instead of one unicast copy per job")
    p.add_argument("--job-priority", default="", metavar="B[,B...]",
                   help=f"priority band of each job's packets in every port's strict-priority queues, job 1 first "
                        f"(0 = most urgent, up to {BANDS - 1}; default 0 for all)")
    p.add_argument("--job-slots", type=int, default=0,
                   help="slots each job asks of every switch (default: the pool divided by --jobs); "
                        "a job that finds a switch full falls back to the PBox")
    p.add_argument("--pool-slots", type=int, default=0, metavar="N",
                   help="slots in every switch's aggregation pool (per version), e.g. to cover a link's "
                        "bandwidth-delay product (default: the program's own, 128 for sum_allreduce)")
    p.add_argument("--packet-elements", type=int, default=0, metavar="N",
                   help="gradient values per packet (default: the program's own, 2048 for sum_allreduce: 8250-byte "
                        "frames); frames longer than Ethernet's 1500 bytes get jumbo MTUs on every link, up to 2239 values")
    p.add_argument("--switch-memory", type=int, default=4 << 20, help="register memory per switch, bytes (default 4 MiB)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds without progress before an all-reduce fails (default 10)")
    p.add_argument("--json", default=None, help="also write the results JSON to this path")
    p.add_argument("--out", default=None, help="directory for results.json and links.csv (default results/<timestamp>)")
    p.add_argument("--pcap", default=None, help="mininet: write a pcap per switch interface into this directory")
    p.add_argument("--save-topology", default=None, metavar="FILE",
                   help="also write the topology as FILE: .json (node-link, as p4-utils writes it) or .graphml")
    p.add_argument("--cli", action="store_true", help="mininet: open the Mininet CLI after the run")
    p.add_argument("--overlap", choices=("layers", "none"), default="layers",
                   help="with --workload: when a layer's all-reduce may start: layers = once backpropagation computed "
                        "it (wait-free backpropagation, the default); none = after the whole backward pass "
                        "(Pipe-SGD's BSP baseline)")
    p.add_argument("--clean", action="store_true", help="remove what an interrupted innet run left behind, then exit")
    p.add_argument("--cluster", default=None, metavar="HOST1,HOST2,...",
                   help="mininet: spread switches and hosts over these servers (ssh as root; Mininet's cluster mode), "
                        "links between servers as VXLAN tunnels; scripts/cluster_servers.py makes test servers")
    p.add_argument("--cluster-key", default=None, metavar="FILE",
                   help="with --cluster: the private key for the servers' ssh logins (default: ssh's own)")
    p.add_argument("--cluster-known-hosts", default=None, metavar="FILE",
                   help="with --cluster: the servers' host keys (default: ssh's known_hosts)")
    p.add_argument("--dilation", default="auto", metavar="auto|off|F",
                   help="mininet: time dilation (README: Performance): links F times slower, every delay, compute time "
                        "and timeout F times longer, every reported time divided by F. auto (the default): F = the host "
                        "link's rate over the rate this machine carries faithfully (calibrated once, cached); off: F = 1. "
                        "The local backend runs in virtual time and takes auto or off only")
    p.add_argument("--node-group", default="auto", metavar="auto|off|G",
                   help="mininet: switches (and workers) served per Python process, each node still in its own "
                        "namespace with its own links. auto (the default): a process per node up to 12 per core, else "
                        "4 processes per core per kind (a fat-tree k=8 in 16); off: a process per node")
    return p


# The flag table's sections. Each subcommand of ``innet`` (innet.commands) shows the sections it takes, each
# flag under its section's title; a flag in no section shows under "other" in ``innet run``.
GROUPS: dict[str, tuple[str, ...]] = {
    "backend": ("backend", "pcap", "cli", "dilation", "node_group", "cluster", "cluster_key", "cluster_known_hosts"),
    "topology": ("topo", "racks", "hosts_per_rack", "spines", "oversubscription", "k", "bw", "save_topology"),
    "job": ("mode", "program", "placement", "workers", "elements", "iterations", "seed", "topk", "jobs", "job_slots",
            "job_priority", "pool_slots", "packet_elements", "switch_memory", "pbox_cores", "timeout"),
    "workload": ("workload", "overlap", "workload_scale", "compute_scale", "pipeline", "slice", "priority", "predict", "hop_latency"),
    "shared input": ("input_elements", "shared_input"),
    "consistency": ("consistency", "staleness", "compute_time", "straggler"),
    "training": ("train", "model", "epochs", "batch", "lr", "hidden"),
    "faults": ("loss", "dup", "reorder", "delay", "fault", "crash"),
    "output": ("out", "json", "no_plots"),
    "maintenance": ("plan_only", "clean"),
}
SHAPES = {"racks": ("leaf-spine", "phub-rack"), "hosts_per_rack": ("leaf-spine", "phub-rack"), "spines": ("leaf-spine",),
          "oversubscription": ("leaf-spine", "phub-rack"), "k": ("fat-tree",)}  # topology flags and the topologies they shape
NEEDS = {"hop_latency": ("predict", "--predict"),
         **{name: ("train", "--train") for name in ("model", "epochs", "batch", "lr", "hidden")}}


def given_flags(argv: list[str]) -> set[str]:
    """The flags (by dest) ``argv`` sets, whatever their values: parsed again with no defaults."""
    p = parser()
    for action in p._actions:
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_args(argv)))


def meaningless(args: argparse.Namespace, given: set[str]) -> str | None:
    """Why a combination of flags means nothing (one line), or None."""
    for name, topos in SHAPES.items():
        if name in given and args.topo not in topos:
            return f"{flag(name)} shapes {' and '.join(topos)}: it means nothing with --topo {args.topo}"
    for name, (needed, text) in NEEDS.items():
        if name in given and not getattr(args, needed):
            return f"{flag(name)} means nothing without {text}"
    if "staleness" in given and args.consistency != "ssp" and not (args.train and args.mode == "all"):
        return "--staleness is SSP's bound: it needs --consistency ssp"
    if given & {"pcap", "cli"} and args.backend == "local":
        return "--pcap and --cli are Mininet's: they mean nothing with --backend local"
    if "node_group" in given and args.backend == "local":
        return "--node-group says how many Mininet nodes a process serves: it means nothing with --backend local"
    return None


def _spec(args: argparse.Namespace) -> RunSpec:
    for name in ("elements", "iterations"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.bw is not None and not 0 < args.bw:
        raise UserError(f"--bw must be positive, got {args.bw:g}")
    if args.switch_memory < 0 or args.timeout <= 0:
        raise UserError("--switch-memory must not be negative and --timeout must be positive")
    try:
        faults = FaultSpec(loss=args.loss, dup=args.dup, reorder=args.reorder, delay=args.delay)
        link_faults = tuple(parse_link_fault(f) for f in args.fault)
    except ValueError as exc:
        raise UserError(f"bad fault flag: {exc}") from None
    if not 0 < args.workload_scale <= 1 or args.compute_scale < 0:
        raise UserError("--workload-scale must be in (0, 1] and --compute-scale must not be negative")
    if args.slice < 0:
        raise UserError(f"--slice must not be negative, got {args.slice}")
    if args.overlap != "layers" and not args.workload:
        raise UserError("--overlap says when a workload's layers are all-reduced: it needs --workload")
    if args.pipeline != 1 and not args.workload:
        raise UserError("--pipeline overlaps a workload's compute with its communication: it needs --workload")
    if (args.slice or args.priority != "fifo") and not args.workload:
        raise UserError("--slice and --priority order a workload's layers: they need --workload")
    if not 0 <= args.topk <= 1:
        raise UserError(f"--topk must be a fraction in [0, 1], got {args.topk:g}")
    if args.job_slots < 0 or args.pool_slots < 0:
        raise UserError(f"--job-slots and --pool-slots must not be negative, got {args.job_slots} and {args.pool_slots}")
    stragglers = tuple(_straggler(s) for s in args.straggler)
    try:
        job_priority = tuple(int(b) for b in args.job_priority.split(",")) if args.job_priority else ()
    except ValueError:
        raise UserError(f"--job-priority wants bands like 0,2, got {args.job_priority!r}") from None
    if args.staleness < 0 or args.compute_time < 0:
        raise UserError("--staleness and --compute-time must not be negative")
    program = args.program or ("topk_sparse" if args.topk else "sum_allreduce")
    return RunSpec(mode=args.mode, program=program, placement=args.placement, topk=args.topk,
                   consistency=args.consistency or "", staleness=args.staleness if args.consistency == "ssp" else 0,
                   compute_time=args.compute_time, stragglers=stragglers, slice_elements=args.slice,
                   priority=args.priority,
                   workers=None if args.topo == "star" else args.workers, elements=args.elements,
                   iterations=args.iterations, seed=args.seed, faults=faults,
                   switch_memory=args.switch_memory, timeout=args.timeout, jobs=args.jobs, job_slots=args.job_slots,
                   pool_slots=args.pool_slots, packet_elements=args.packet_elements,
                   job_priority=job_priority, input_elements=args.input_elements, shared_input=args.shared_input,
                   link_faults=link_faults, workload=args.workload or "", workload_scale=args.workload_scale,
                   pipeline=args.pipeline, overlap=args.overlap, compute_scale=args.compute_scale,
                   min_rto=LOCAL_MIN_RTO if args.backend == "local" else MININET_MIN_RTO,
                   train=args.train or "", model=args.model, epochs=args.epochs, batch=args.batch, lr=args.lr,
                   hidden=args.hidden)


def parse_dilation(text: str) -> float | str:
    """``--dilation``: "auto", "off" (factor 1) or a factor of at least 1."""
    if text in ("auto", "off"):
        return 1.0 if text == "off" else "auto"
    try:
        factor = float(text)
    except ValueError:
        factor = float("nan")
    if not factor >= 1:
        raise UserError(f"--dilation wants auto, off or a factor of at least 1, got {text!r}")
    return factor


def parse_node_group(text: str) -> int | None:
    """``--node-group``: "auto" (None: innet.plan.grouping decides), "off" (1: a process per node) or G >= 1."""
    if text in ("auto", "off"):
        return None if text == "auto" else 1
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"--node-group wants auto, off or a number of nodes per process (at least 1), got {text!r}")
    return int(text)


def _dilation(args: argparse.Namespace, graph: Any) -> tuple[float, float | None]:
    """The run's time dilation factor (innet.plan.dilation) as far as the links decide it, and with
    --dilation auto the machine's faithful rate, from which each mode's own factor follows
    (innet.run.modes.auto_dilation): 1 on the local backend, which runs in virtual time; on Mininet
    --dilation's, or auto's from the calibration. The dilated links must be ones TCLink can shape."""
    wanted = parse_dilation(args.dilation)
    if args.backend == "local":
        if wanted not in ("auto", 1.0):
            raise UserError(f"--dilation {args.dilation} slows Mininet's clock; the local backend runs in virtual "
                            "time and needs none: use --dilation auto or off there")
        return 1.0, None
    faithful = None
    if wanted == "auto":
        from innet.backends.mininet.calibration import faithful_rate

        faithful = faithful_rate()
        wanted = auto_factor(host_link_rate(graph), faithful)
    factor = float(wanted)
    if args.bw is not None and args.bw / factor > TCLINK_MAX_MBPS:
        raise UserError(f"--bw {args.bw:g} is {args.bw / factor:g} Mbit/s on the dilated links (--dilation {args.dilation}: "
                        f"factor {factor:g}), above the {TCLINK_MAX_MBPS:g} TCLink can shape: dilate by at least "
                        f"{args.bw / TCLINK_MAX_MBPS:g}, or use the local backend")
    return factor, faithful


def mode_dilation(graph: Any, spec: RunSpec, dilation: tuple[float, float | None]) -> float:
    """The factor a Mininet run of ``spec`` takes, from ``_dilation``'s answer: --dilation's, or auto's
    for this mode (innet.run.modes.auto_dilation)."""
    factor, faithful = dilation
    if faithful is None:
        return factor
    from innet.run.modes import auto_dilation

    return auto_dilation(graph, spec, program_of(spec), faithful)


def _straggler(text: str) -> tuple[str, float, float]:
    host, _, rest = text.partition(":")
    try:
        factor, chance = (float(x) for x in (rest.split(":") + ["1"])[:2])
    except ValueError:
        raise UserError(f"--straggler wants HOST:FACTOR[:PROB], got {text!r}") from None
    if not host or factor < 1 or not 0 <= chance <= 1:
        raise UserError(f"--straggler wants a host, a factor of at least 1 and a probability in [0, 1], got {text!r}")
    return host, factor, chance


def _cluster(args: argparse.Namespace) -> Any:
    """The servers of --cluster (None without it), checked for form here and reached only when the run starts."""
    if args.cluster is None:
        if args.cluster_key or args.cluster_known_hosts:
            raise UserError("--cluster-key and --cluster-known-hosts go with --cluster HOST1,HOST2,...")
        return None
    if args.backend != "mininet":
        raise UserError("--cluster spreads a Mininet network over servers: it needs the mininet backend")
    from innet.backends.mininet.cluster import Cluster, parse_servers

    return Cluster(parse_servers(args.cluster), key=args.cluster_key or "", known_hosts=args.cluster_known_hosts or "")


def _graph(args: argparse.Namespace) -> Any:
    from topologies import build

    workers = args.workers if args.topo == "star" else None
    return build(args.topo, workers=workers if workers is not None else 4, racks=args.racks,
                 hosts_per_rack=args.hosts_per_rack, spines=args.spines, k=args.k, bw=args.bw,
                 oversubscription=args.oversubscription)


def _crashes(specs: list[str], graph: Any) -> dict[str, float]:
    crash = {}
    for text in specs:
        host, _, at = text.partition("@")
        try:
            seconds = float(at)
        except ValueError:
            raise UserError(f"--crash wants HOST@SECONDS, got {text!r}") from None
        if host not in graph or graph.nodes[host]["role"] != "host":
            raise UserError(f"--crash names {host!r}, which is not a host of this topology")
        crash[host] = seconds
    return crash


def _gloo_applies(run: RunSpec) -> bool:
    """Whether ``--mode all`` adds gloo: the run is one gloo can do, and torch is installed."""
    from innet.integrations.torch.ranks import gloo_applies, torch_available

    return gloo_applies(run) and torch_available()


FLAG_NAMES = {"slice_elements": "--slice"}  # RunSpec fields whose flag is not the field's name


def flag(field: str) -> str:
    """The flag that sets RunSpec field ``field``."""
    return FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    wrong = meaningless(args, given_flags(sys.argv[1:] if argv is None else argv))
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    try:
        return _main(args)
    except UserError as exc:
        print(f"error: {exc.render(flag)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything this run created was removed", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace) -> int:
    if args.clean:
        from innet.backends.mininet.cleanup import clean_leftovers
        from innet.backends.mininet.shaper import release

        cleaned = clean_leftovers()
        print(cleaned + ("; turned htb's hysteresis mode off (an innet run had turned it on)" if release() else ""))
        return 0
    if args.backend is None:
        if os.geteuid() != 0:
            raise UserError("the mininet backend needs root: run with sudo, or use --backend local")
        args.backend = "mininet"
    if args.backend == "mininet" and os.geteuid() != 0:
        raise UserError("the mininet backend needs root: run with sudo, or use --backend local")
    run = _spec(args)
    cluster = _cluster(args)
    graph = _graph(args)
    if args.save_topology:
        from topologies.files import save_file

        save_file(graph, args.save_topology)
        print(f"topology: {args.save_topology}")
    if args.plan_only:
        from innet.run.planreport import plan_report

        print("\n\n".join(plan_report(graph, dataclasses.replace(run, mode=mode))
                           for mode in (MODES if args.mode == "all" else (args.mode,))))
        return 0
    if args.pbox_cores < 1:
        raise UserError(f"--pbox-cores must be at least 1, got {args.pbox_cores}")
    crash = _crashes(args.crash, graph)
    dilation = _dilation(args, graph)
    node_group = parse_node_group(args.node_group)
    for link, _ in run.link_faults:
        ends = link.split("->") if "->" in link else link.split("--")
        if not graph.has_edge(*ends):
            raise UserError(f"--fault names link {link}, which this topology does not have")
    # gloo is the kernel's TCP on undilated links: only where TCLink can shape the hosts' links at the requested rate
    undilated = host_link_rate(graph)
    if run.train and args.mode == "all":
        from innet.run.learn import scheme_specs

        specs = scheme_specs(run, args.topk or 0.01, args.staleness)
    else:
        specs = [dataclasses.replace(run, mode=mode) for mode in (MODES if args.mode == "all" else (args.mode,))]
        if args.mode == "all" and args.backend == "mininet" and undilated <= TCLINK_MAX_MBPS and _gloo_applies(run):
            specs.append(dataclasses.replace(run, mode="gloo"))
    if args.mode == "gloo" and args.backend == "local":
        raise UserError("--mode gloo runs torch.distributed between Mininet hosts: it needs --backend mininet (and root)")
    if args.mode == "gloo" and undilated > TCLINK_MAX_MBPS:
        raise UserError(f"--mode gloo runs on undilated links, which TCLink shapes up to {TCLINK_MAX_MBPS:g} Mbit/s; "
                        f"this topology's hosts have {undilated:g} Mbit/s links")
    from innet.plan.memory import check_memory

    for spec in specs:  # before anything is built: a run that cannot fit is refused, not OOM-killed halfway
        check_memory(graph, spec, args.backend, node_group=node_group)
    runs = []
    for spec in specs:
        if spec.mode == "gloo":
            from innet.integrations.torch.ranks import run_gloo

            runs.append(run_gloo(graph, spec))
        elif args.backend == "local":
            from innet.backends.local.run import run_local

            runs.append(run_local(graph, spec, pbox_cores=args.pbox_cores, crash=crash))
        else:
            from innet.backends.mininet.emulation import run_mininet

            runs.append(run_mininet(graph, spec, pcap_dir=args.pcap, cli=args.cli, pbox_cores=args.pbox_cores, crash=crash,
                                    cluster=cluster, dilation=mode_dilation(graph, spec, dilation), node_group=node_group))
    exact: dict[str, Any] = {}
    if run.train:
        from innet.run.learn import exact_history

        history = exact_history(run, len(runs[0].jobs[0].workers))
        exact = {"accuracy_exact": history[-1][0], "exact_epochs": [{"epoch": e + 1, "accuracy": a, "loss": loss}
                                                                    for e, (a, loss) in enumerate(history)]}
    print(summary_table(runs))
    for r in runs:
        print(fidelity_line(r))
    for line in (job_lines(runs) + training_lines(runs) + input_lines(runs) + learning_lines(runs, exact.get("accuracy_exact"))
                 + cluster_lines(runs)):
        print(line)
    if args.predict:
        from innet.run.planreport import prediction_table

        table, runs = prediction_table(graph, run, runs, args.hop_latency)
        print(table)
    out = args.out or os.path.join("results", time.strftime("%Y%m%d-%H%M%S"))
    files = [os.path.join(out, "results.json"), os.path.join(out, "links.csv")]
    write_results(files[0], graph, runs, **exact)
    write_link_csv(files[1], graph, runs)
    if not args.no_plots:
        from innet.results.plots import write_plots

        files += write_plots(graph, runs, out, exact.get("accuracy_exact"))
    if args.json:
        write_results(args.json, graph, runs, **exact)
    print(f"results: {', '.join(files)}")
    for r in runs:
        for err in r.errors:
            print(f"error: {err}", file=sys.stderr)
    return 0 if all(r.correct for r in runs) else 1
