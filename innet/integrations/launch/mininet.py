"""``innet launch --backend mininet``: every rank inside its worker host's namespace, over the shaped links.

The topology comes up as for any Mininet run (innet.backends.mininet.emulation: every process recorded and removed
on success, error, Ctrl-C and SIGTERM) with the switches running the sum program and an IP network beside innet's
frames for the TCP side plane (innet.backends.mininet.iplane). Each rank's world group runs its float sums and
means (all-reduce, reduce-scatter, reduce), all-gathers, broadcasts and barriers with the worker client on its
host's interface (``ClientConf``), through the switches (innet.integrations.torch.switches), and its send/recv,
all-to-all, gather and scatter as messages from that interface (innet.integrations.torch.messages); every other
call takes the side plane over the same links. The bytes per link are the interfaces' counters, side plane
included; the messages' bytes per link are the switches' count of their frames (``message_link_bytes``), apart.

The ranks' store is held, and watched, by a process of its own in rank 0's host (innet.integrations.launch.watch:
``serve``), so that the start and collective timeouts hold here as on this machine: its verdict, a file in the
run's folder, ends the run as the local launcher's own watch does (``Served``). The calls through the switches
outwait it (``patient``): a rank that is late, or hangs, is the watch's to name, as on this machine, not the
switches' (which would abort the job after half of --timeout, and the waiting ranks fail with that).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import networkx as nx

from innet.errors import UserError
from innet.hosts.job import JobSpec
from innet.integrations.launch.procs import last_line, rank_env, read_tally, wait_ranks
from innet.integrations.launch.watch import COLLECTIVE_TIMEOUT_S, START_TIMEOUT_S, VERDICT, Hang, WatchConf, store_env
from innet.node import codec
from innet.node.config import NO_FAULTS, Faults
from innet.planning.spec import RunSpec, program_of
from innet.schemes.modes import RunPlan

if TYPE_CHECKING:
    from innet.backends.mininet.network import Network

TORCH_PORT = 29500
PATIENCE = 4.0  # the calls through the switches give up after this many collective timeouts without progress


@dataclass(frozen=True)
class ClientConf:
    """A rank's worker client and messages (innet.integrations.torch.messages): its job's spec, its interface, the
    scheme, every rank's node index by rank (the ring's order), its ports' faults, and every rank's host by rank."""

    spec: JobSpec
    iface: str
    mode: str
    ring: tuple[int, ...]
    faults: Faults = field(default_factory=lambda: dict(NO_FAULTS))
    hosts: tuple[str, ...] = ()


class Served:
    """The launcher's view of ``serve``'s process ``proc`` (its standard output a pipe, its standard error kept in
    the file ``err``, in the run's folder): its store up, and its verdict (``hung``, a procs.Watch)."""

    def __init__(self, proc: subprocess.Popen[bytes], err: str) -> None:
        self.proc, self.err = proc, err
        self.verdict = os.path.join(os.path.dirname(err), VERDICT)

    @classmethod
    def start(cls, emu: Network, host: str, conf: WatchConf) -> Served:
        """``serve`` started in ``host`` of the network ``emu``."""
        path = emu.write("watch-conf.json", conf)
        with open(os.path.join(emu.run_dir, "watch.err"), "wb") as err:
            return cls(emu.spawn(host, [sys.executable, "-m", "innet.integrations.launch.watch", path],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err), err.name)

    def ready(self) -> None:
        """Once the store is up (the ranks, started meanwhile, retry until it is); one line if it cannot be."""
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise self._stopped()

    def hung(self) -> tuple[int, str] | None:
        if os.path.exists(self.verdict):
            hang = codec.read(Hang, self.verdict)
            return hang.rank, hang.how
        if self.proc.poll() is not None:
            raise self._stopped()
        return None

    def _stopped(self) -> UserError:
        return UserError(f"the ranks' store in rank 0's host stopped (exit {self.proc.wait()}): {last_line(self.err)}")


def patient(run: RunSpec, collective_timeout: float) -> RunSpec:
    """``run`` with a no-progress timeout (``--timeout``: a worker client gives up after it, a switch aborts a job
    stalled for half of it) of at least ``PATIENCE`` collective timeouts, so the watch judges first. Said in the
    help; one given that is shorter is refused, never replaced."""
    least = PATIENCE * collective_timeout
    if "timeout" in run.given() and run.timeout < least:
        raise UserError(f"{{timeout}} {run.timeout:g} would have the switches abort a waiting call before "
                        f"{{collective_timeout}} {collective_timeout:g} judges it: give {{timeout}} at least {least:g} "
                        f"({PATIENCE:g} x {{collective_timeout}}), or leave it out")
    return replace(run, timeout=max(run.timeout, least))


def launch_mininet(graph: nx.Graph, run: RunSpec, command: list[str], site: str, plan: RunPlan | None = None,
                   start_timeout: float = START_TIMEOUT_S,
                   collective_timeout: float = COLLECTIVE_TIMEOUT_S) -> tuple[float, Any]:
    """Run ``command`` as every rank, each in its worker host; the seconds and the ranks' tally, with the bytes
    per link and link direction the interfaces counted in it (the messages' bytes per link too, as the switches
    counted them). ``site``: the sitecustomize every rank
    imports; ``plan``: the run's, as ``innet.prepare`` placed it. A rank
    that has not joined its group within ``start_timeout`` seconds, or keeps the others waiting in a collective for
    ``collective_timeout``, ends the run, named."""
    from innet.backends.mininet.emulation import network
    from innet.backends.mininet.iplane import host_address
    from innet.backends.mininet.network import direction_bytes_between
    from innet.backends.mininet.nodes import port_faults
    from innet.integrations.ranks.mininet import job_ranks
    from innet.results.metrics import message_link_bytes
    from innet.schemes.modes import installed_configs, plan_run
    from innet.shipped import save_file
    from innet.wire.packet import link_mtu

    if run.mode == "pbox":
        raise UserError("innet launch on Mininet runs {mode} innet or ring (no PBox process is started)")
    rp = plan or plan_run(graph, run, program_of(run))
    program = program_of(run, rp.fan_in)
    run = patient(run, collective_timeout)
    ranks = [(host, replace(spec, timeout=run.timeout)) for host, spec in job_ranks(rp)]
    ring = tuple(rp.ring(rp.plans[0].job))
    with network(graph, link_mtu(program.elements), "launch") as emu:
        emu.add_ip_network()
        master = host_address(emu.graph, ranks[0][0])
        served = Served.start(emu, ranks[0][0], WatchConf(len(ranks), start_timeout, collective_timeout, master,
                                                          TORCH_PORT))  # while the switches start
        emu.start_switches(run, program, installed_configs(graph, run, rp), None)
        with open(os.path.join(emu.run_dir, "sitecustomize.py"), "w", encoding="utf-8") as fh:
            fh.write(site)
        save_file(graph, os.path.join(emu.run_dir, "graph.json"))  # INNET_GRAPH: the messages' prediction
        hosts = tuple(host for host, _ in ranks)
        procs: list[subprocess.Popen[bytes]] = []
        for rank, (host, spec) in enumerate(ranks):
            conf = emu.write(f"{host}-client.json", ClientConf(spec, f"{host}-eth0", run.mode, ring,
                                                                  port_faults(graph, run, host), hosts))
            env = dict(rank_env(emu.run_dir, rank, len(ranks), TORCH_PORT, master), **store_env(master, TORCH_PORT))
            env.update(INNET_CLIENT=conf, GLOO_SOCKET_IFNAME=f"{host}-eth0")
            given = [f"{k}={v}" for k, v in env.items() if k.startswith(("INNET_", "GLOO_", "OMP_", "PYTHONPATH"))
                     or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                              "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")]
            with open(os.path.join(emu.run_dir, f"rank{rank}.err"), "wb") as err:
                procs.append(emu.spawn(host, ["env", *given, *command], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=err))
        before, started = emu.interface_bytes(), time.monotonic()
        served.ready()  # the ranks, importing torch meanwhile, reach the store once it is up
        wait_ranks(procs, emu.run_dir, served.hung)
        wall = time.monotonic() - started
        directions = direction_bytes_between(emu.graph, before, emu.interface_bytes())
        tally = replace(read_tally(os.path.join(emu.run_dir, "stats.jsonl")), link_bytes=Counter(),
                        link_bytes_up=Counter(), link_bytes_down=Counter())
        tally.carried(emu.graph, directions)  # what the interfaces counted, the side plane's TCP included
        reports = {sw: ctl.stats().runtime for sw, ctl in emu.switch_controls.items()}
        tally.message_link_bytes.update(message_link_bytes(emu.graph, {sw: r.ports for sw, r in reports.items() if r}))
    return wall, tally
