"""torch.distributed ranks inside Mininet hosts: gloo's all-reduce as a baseline (``--backend gloo``), and DDP trained
through innet's switches (the ``ClientState`` hook of innet.integrations.torch.ddp).

The topology comes up as for any Mininet run (innet.backends.mininet.emulation: the same shaped links, every process recorded
in the run's state file and removed on success, error, Ctrl-C and SIGTERM), with an IP network beside innet's
frames (innet.backends.mininet.iplane) for gloo. One rank per worker host (innet.integrations.ranks.rank), rank r being the
job's rank r; they meet at rank 0's address. Bytes per link are read from the same interface counters as innet's
runs, from "go" to the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from innet.backends.mininet.emulation import Emulation, network
from innet.backends.mininet.iplane import host_address
from innet.backends.mininet.network import direction_bytes_between, link_bytes_between, log
from innet.backends.mininet.nodes import port_faults
from innet.errors import Unfinished, UserError
from innet.graph import link_totals
from innet.hosts.job import JobSpec
from innet.hosts.learning.model import Task
from innet.integrations.ranks.rank import DdpHook, DdpResult, GlooCalls, RankConfig
from innet.node.codec import read
from innet.planning.spec import RunSpec
from innet.results.check import run_record, with_directions
from innet.results.fidelity import kernel_fidelity
from innet.results.outcome import WorkerOutcome
from innet.results.record import RunRecord
from innet.schemes.modes import RunPlan, installed_configs
from innet.schemes.prepared import ModeRun
from innet.wire.packet import link_mtu

RENDEZVOUS_PORT = 29500
STARTUP_S = 120.0  # for the ranks to import torch and meet (a loaded 2-core machine is slow at it)


def torch_available() -> bool:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


def job_ranks(rp: RunPlan) -> list[tuple[str, JobSpec]]:
    if len(rp.plans) != 1:
        raise UserError("torch ranks run one job: give {jobs} 1")
    return sorted(rp.specs[rp.plans[0].job].items(), key=lambda kv: kv[1].rank)


def _start_ranks(emu: Emulation, ranks: list[tuple[str, JobSpec]], tag: str, tasks: list[GlooCalls | DdpHook],
                 timeout: float) -> dict[str, subprocess.Popen[bytes]]:
    """Start one rank per worker host, each with its task, and wait until all have met ("ready")."""
    master = host_address(emu.graph, ranks[0][0])
    procs = {}
    for (host, spec), task in zip(ranks, tasks, strict=True):
        conf = RankConfig(spec.rank, len(ranks), f"{host}-eth0", timeout, f"tcp://{master}:{RENDEZVOUS_PORT}",
                          os.path.join(emu.run_dir, f"{host}-{tag}.out"),
                          allreduce=task if isinstance(task, GlooCalls) else None,
                          ddp=task if isinstance(task, DdpHook) else None)
        path = emu.write(f"{host}-{tag}.json", conf)
        with open(os.path.join(emu.run_dir, f"{host}-{tag}.log"), "wb") as log_file:
            procs[host] = emu.spawn(host, [sys.executable, "-m", "innet.integrations.ranks.rank", path],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file)
    for host, proc in procs.items():
        assert proc.stdout is not None
        said = proc.stdout.readline().strip()
        if said.startswith(b"unfinished: "):  # its ranks did not meet in time: a baseline ``--mode all`` goes without
            raise Unfinished(f"torch ranks did not meet within {timeout:.0f}s ({said.decode(errors='replace')[12:]})")
        if said != b"ready":
            raise UserError(f"torch rank on {host} failed to start: {_last_words(emu, host, tag)}")
    return procs


def _go_and_wait(emu: Emulation, procs: dict[str, subprocess.Popen[bytes]], tag: str, limit: float) -> float:
    """Release the ranks together; wait for all to exit (each must succeed); the seconds it took."""
    started = time.monotonic()
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    while any(p.poll() is None for p in procs.values()):
        if time.monotonic() - started > limit:
            raise Unfinished(f"torch ranks did not finish within {limit:.0f}s")
        failed = [h for h, p in procs.items() if p.poll() not in (None, 0)]
        if failed:
            raise UserError(f"torch rank on {failed[0]} failed: {_last_words(emu, failed[0], tag)}")
        time.sleep(0.01)
    failed = [h for h, p in procs.items() if p.returncode != 0]
    if failed:
        raise UserError(f"torch rank on {failed[0]} failed: {_last_words(emu, failed[0], tag)}")
    return time.monotonic() - started


def _last_words(emu: Emulation, host: str, tag: str) -> str:
    try:
        with open(os.path.join(emu.run_dir, f"{host}-{tag}.log"), encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else "no message"


def run_gloo(graph: nx.Graph, ring: RunSpec, rp: RunPlan) -> RunRecord:
    """``--backend gloo``: torch.distributed's gloo all-reduce of the run's tensors between the job's worker hosts,
    over the same links; its record beside innet's modes (``ring``, ``rp``: the ring's spec and plan, whose
    predicted bytes it is laid out with; correct: every rank's result is the float sum within float32 rounding).
    Prepared (innet.prepare) as any run: what gloo can run is checked there (innet.planning.rules)."""
    ranks = job_ranks(rp)
    timeout = STARTUP_S + ring.timeout * ring.iterations
    lossy = graph.copy()
    lossy.graph["kernel_loss"] = ring.faults.loss  # gloo's TCP under the loss innet's ports inject, the kernel's
    with network(lossy, link_mtu(0), "gloo") as emu:
        emu.add_ip_network()
        job = rp.plans[0].job
        procs = _start_ranks(emu, ranks, "gloo", [GlooCalls(ring.seed, job, tuple(ring.call_sizes()), ring.layers())
                                                  for _ in ranks], timeout)
        before = emu.interface_bytes()
        log(f"gloo all-reduce: {len(ranks)} ranks x {ring.elements} elements x {ring.iterations} iteration(s)")
        wall = _go_and_wait(emu, procs, "gloo", timeout)
        after = emu.interface_bytes()
        outcomes, host_cpu = [], 0.0
        for host, spec in ranks:
            data = np.load(os.path.join(emu.run_dir, f"{host}-gloo.out.npz"))
            floats = np.split(data["floats"], np.cumsum(data["sizes"])[:-1])
            outcomes.append(WorkerOutcome(spec.job, spec.rank, [], floats, list(data["started"]), list(data["finished"]), 0))
            host_cpu += float(data["cpu_s"])
        directions = direction_bytes_between(emu.graph, before, after)
    return gloo_record(graph, ring, rp, outcomes, directions, host_cpu_s=round(host_cpu, 3), wall_s=round(wall, 3))


def gloo_record(graph: nx.Graph, ring: RunSpec, rp: RunPlan, outcomes: list[WorkerOutcome],
                directions: dict[tuple[str, str], int], **extra: object) -> RunRecord:
    """gloo's run record from the bytes each link direction (from, to) carried: laid out as the ring's (same plan
    and predicted bytes), its verdict in floats: every rank's every result within float32 rounding of the float64
    sum (N ulps of the largest partial sum)."""
    record = with_directions(run_record(graph, ring, rp, "gloo", outcomes, link_totals(directions), {}, **extra),
                             graph, directions)
    inputs = [ring.tensors(o.job, o.rank) for o in outcomes]
    correct, max_err = True, 0.0
    for call in range(len(inputs[0])):
        exact = np.sum([t[call].astype(np.float64) for t in inputs], axis=0)
        bound = len(inputs) * np.finfo(np.float32).eps * np.sum([np.abs(t[call].astype(np.float64)) for t in inputs], axis=0)
        for o in outcomes:
            got = o.floats[call] if call < len(o.floats) else None
            if got is None or got.shape != exact.shape:
                correct = False
                continue
            err = np.abs(got.astype(np.float64) - exact)
            correct &= bool(np.all(err <= bound + 1e-30))
            max_err = max(max_err, float(err.max(initial=0.0)))
    errors = () if correct else ("gloo's result differs from the float sum by more than float32 rounding",)
    jobs = tuple(replace(j, placement="gloo", correct=correct, max_abs_error=max_err, errors=errors) for j in record.jobs)
    record = replace(record, mode="gloo", placement="gloo", correct=correct, max_abs_error=max_err, errors=errors, jobs=jobs)
    return record.with_figures(fidelity=kernel_fidelity())


@dataclass(frozen=True)
class DdpOutcome:
    """One hook's DDP run: every rank's result, and the bytes per link."""

    ranks: list[DdpResult]
    link_bytes: dict[str, int]


def ddp_mininet(graph: nx.Graph, ready: ModeRun, train: Task,
                hooks: tuple[str, ...] = ("innet", "plain")) -> dict[str, DdpOutcome]:
    """Train the torch example with DDP, one rank per worker host, once per hook: "innet" (every bucket through the
    switches: ClientState, the prepared run's mode innet, pbox or ring, its plan and program made once by
    innet.prepare) and "plain" (DDP's own gloo all-reduce). Per hook: every rank's test accuracy and seconds, and
    the bytes per link."""
    if not torch_available():
        raise UserError("the DDP example needs torch: pip install -e '.[torch]' (torch==2.13.0, the CPU build)")
    run, rp, program = ready.spec, ready.plan, ready.program
    assert rp is not None and program is not None
    ranks = job_ranks(rp)
    job = rp.plans[0].job
    timeout = STARTUP_S + 60.0 * train.epochs
    out: dict[str, DdpOutcome] = {}
    with network(graph, link_mtu(program.elements), "ddp") as emu:
        emu.add_ip_network()
        if "innet" in hooks:
            emu.start_switches(run, program, installed_configs(graph, run, rp), None)
        for hook in hooks:
            procs = _start_ranks(emu, ranks, hook, [DdpHook(train, hook, spec, run.mode, tuple(rp.ring(job)),
                                                            port_faults(graph, run, host)) for host, spec in ranks], timeout)
            before = emu.interface_bytes()
            log(f"DDP ({hook} all-reduce): {len(ranks)} ranks, {train.epochs} epochs")
            _go_and_wait(emu, procs, hook, timeout)
            after = emu.interface_bytes()
            ranks_out = [read(DdpResult, os.path.join(emu.run_dir, f"{host}-{hook}.out")) for host, _ in ranks]
            out[hook] = DdpOutcome(ranks_out, link_bytes_between(emu.graph, before, after))
    return out
