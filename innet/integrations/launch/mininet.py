"""``innet launch --backend mininet``: every rank inside its worker host's namespace, over the shaped links.

The topology comes up as for any Mininet run (innet.backends.mininet.emulation: every process recorded and removed
on success, error, Ctrl-C and SIGTERM) with the switches running the sum program and an IP network beside innet's
frames for the TCP side plane (innet.backends.mininet.iplane). Each rank's world group runs its float sums and
means (all-reduce, reduce-scatter, reduce), all-gathers, broadcasts and barriers with the worker client on its
host's interface (``ClientConf``), through the switches (innet.integrations.torch.switches), and its send/recv,
all-to-all, gather and scatter as messages from that interface (innet.integrations.torch.messages); every other
call takes the side plane over the same links. The bytes per link are the interfaces' counters, side plane
included; the messages' bytes per link are the switches' count of their frames (``message_link_bytes``), apart.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from innet.errors import UserError
from innet.hosts.job import JobSpec
from innet.integrations.launch.procs import rank_env, read_tally, wait_ranks
from innet.node.config import NO_FAULTS, Faults
from innet.planning.spec import RunSpec, program_of
from innet.schemes.modes import RunPlan

TORCH_PORT = 29500


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


def launch_mininet(graph: nx.Graph, run: RunSpec, command: list[str], site: str,
                   plan: RunPlan | None = None) -> tuple[dict[str, int], float, Any]:
    """Run ``command`` as every rank, each in its worker host; the bytes per link, the seconds, the ranks' tally
    (the messages' bytes per link in it, as the switches counted them). ``site``: the sitecustomize every rank
    imports; ``plan``: the run's, as ``innet.prepare`` placed it."""
    from innet.backends.mininet.emulation import network
    from innet.backends.mininet.iplane import host_address
    from innet.backends.mininet.network import link_bytes_between
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
    ranks = job_ranks(rp)
    ring = tuple(rp.ring(rp.plans[0].job))
    with network(graph, link_mtu(program.elements), "launch") as emu:
        emu.add_ip_network()
        emu.start_switches(run, program, installed_configs(graph, run, rp), None)
        with open(os.path.join(emu.run_dir, "sitecustomize.py"), "w", encoding="utf-8") as fh:
            fh.write(site)
        save_file(graph, os.path.join(emu.run_dir, "graph.json"))  # INNET_GRAPH: the messages' prediction
        hosts = tuple(host for host, _ in ranks)
        master = host_address(emu.graph, ranks[0][0])
        procs: list[subprocess.Popen[bytes]] = []
        for rank, (host, spec) in enumerate(ranks):
            conf = emu.write(f"{host}-client.json", ClientConf(spec, f"{host}-eth0", run.mode, ring,
                                                                  port_faults(graph, run, host), hosts))
            env = rank_env(emu.run_dir, rank, len(ranks), TORCH_PORT, master)
            env.update(INNET_CLIENT=conf, GLOO_SOCKET_IFNAME=f"{host}-eth0")
            given = [f"{k}={v}" for k, v in env.items() if k.startswith(("INNET_", "GLOO_", "OMP_", "PYTHONPATH"))
                     or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                              "MASTER_PORT")]
            with open(os.path.join(emu.run_dir, f"rank{rank}.err"), "wb") as err:
                procs.append(emu.spawn(host, ["env", *given, *command], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=err))
        before, started = emu.interface_bytes(), time.monotonic()
        wait_ranks(procs, emu.run_dir)
        wall = time.monotonic() - started
        link_bytes = link_bytes_between(emu.graph, before, emu.interface_bytes())
        tally = read_tally(os.path.join(emu.run_dir, "stats.jsonl"))
        reports = {sw: ctl.stats().runtime for sw, ctl in emu.switch_controls.items()}
        tally.message_link_bytes.update(message_link_bytes(emu.graph, {sw: r.ports for sw, r in reports.items() if r}))
    return link_bytes, wall, tally
