"""``innet launch [run flags] -- python train.py ARGS``: one torch rank per worker host, torchrun's environment, every
collective of the script's default backend through the emulated network (innet.integrations.torch.group).

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK (0: one rank per host), LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
and a ``sitecustomize`` that imports innet.torch, which makes "innet" the backend of CPU tensors: a script that names
no backend (``dist.init_process_group()``) runs through innet unchanged, and under plain torchrun on gloo. The run's
options (topology, scheme, faults) reach the group's rank 0 in files (INNET_RUN, INNET_GRAPH); its fabric counts
the bytes per link into INNET_STATS, which the launcher prints at the end, per link and per tier. The ranks'
standard output comes out whole lines at a time, each prefixed "[rankR]: " (torchrun's ``--tee``); their standard
error stays in the run's folder, for a failing rank's last words.

Ranks that cannot fit in the available memory are refused in one line before any starts. A rank that fails ends
the run with one line (its last words); Ctrl-C or SIGTERM at any point ends every rank
(each in its own session, so the terminal's signal reaches the launcher alone) and removes the run's folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import networkx as nx

from innet.errors import UserError
from innet.graph import hosts
from innet.integrations.launch.procs import SITE, rank_env, read_tally, stop, wait_ranks
from innet.integrations.launch.record import launch_record, write_record
from innet.integrations.launch.watch import COLLECTIVE_TIMEOUT_S, START_TIMEOUT_S, Store
from innet.integrations.torch.fabric import Tally
from innet.node.codec import write
from innet.planning.memory import check_torch_ranks
from innet.planning.spec import RunSpec
from innet.results.fidelity import Fidelity, verdict_line, virtual_fidelity
from innet.results.metrics import tier_bytes
from innet.schemes.modes import RunPlan


def workers_of(graph: nx.Graph, run: RunSpec) -> int:
    """How many ranks: the run's workers, else every host of the topology."""
    return run.workers if run.workers is not None else len(hosts(graph))


def launch(graph: nx.Graph, run: RunSpec, command: list[str], start_timeout: float = START_TIMEOUT_S,
           collective_timeout: float = COLLECTIVE_TIMEOUT_S, plan: RunPlan | None = None) -> list[str]:
    """Run ``command`` as every rank (``run.backend``: on this machine with the fabric, or in Mininet hosts); the
    lines that say what the collectives cost, and the fidelity verdict. On either backend, a rank that has not
    joined its process group within ``start_timeout`` seconds, or keeps the others waiting in a collective for
    ``collective_timeout``, ends the run, named (innet.integrations.launch.watch)."""
    if not command:
        raise UserError("innet launch needs a command after --, e.g. innet launch {backend} local -- python train.py")
    if shutil.which(command[0]) is None:
        raise UserError(f"innet launch cannot run {command[0]}: no such command, or not an executable file")
    for name, value in (("--start-timeout", start_timeout), ("--collective-timeout", collective_timeout)):
        if not 0 < value < float("inf"):
            raise UserError(f"{name} must be a positive number of seconds, got {value:g}")
    check_torch_ranks(workers_of(graph, run))  # before any rank starts: ~270 MiB each
    if run.backend == "mininet":
        from innet.integrations.launch.mininet import launch_mininet

        wall, tally = launch_mininet(graph, run, command, SITE, plan, start_timeout, collective_timeout)
        fid = Fidelity(1.0, "not judged", ("Mininet: the side plane's TCP shares the links and is counted in their "
                                           "bytes (the messages' bytes are the switches' count of their frames, apart); "
                                           "the ranks' and switches' CPU are not measured",), {}, {}, {})
    else:
        tally, wall = launch_local(graph, run, command, start_timeout, collective_timeout)
        fid = virtual_fidelity()
    lines = [*summary(graph, run, tally, workers_of(graph, run), wall), verdict_line(f"launch {run.mode}", fid.to_json())]
    if run.out:
        lines.append(f"results: {write_record(run.out, launch_record(graph, run, tally, workers_of(graph, run), wall))}")
    return lines


def launch_local(graph: nx.Graph, run: RunSpec, command: list[str], start_timeout: float = START_TIMEOUT_S,
                 collective_timeout: float = COLLECTIVE_TIMEOUT_S) -> tuple[Tally, float]:
    """Run ``command`` as every rank on this machine, the collectives on the fabric: what they cost, the seconds.
    The ranks meet at the launcher's own store, on loopback (innet.integrations.launch.watch.Store)."""
    from innet.shipped import save_file

    world = workers_of(graph, run)
    folder = tempfile.mkdtemp(prefix="innet-launch-")
    procs: list[subprocess.Popen[bytes]] = []
    store: Store | None = None
    try:
        write(os.path.join(folder, "run.json"), run)
        save_file(graph, os.path.join(folder, "graph.json"))
        with open(os.path.join(folder, "sitecustomize.py"), "w", encoding="utf-8") as fh:
            fh.write(SITE)
        store = Store(world, start_timeout, collective_timeout)
        for rank in range(world):
            with open(os.path.join(folder, f"rank{rank}.err"), "wb") as err:
                env = dict(rank_env(folder, rank, world, store.port), **store.env())
                procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=err,
                                              start_new_session=True))
        started = time.monotonic()
        wait_ranks(procs, folder, store.hung)
        return read_tally(os.path.join(folder, "stats.jsonl")), time.monotonic() - started
    except OSError as exc:  # the command would not start (found by which, then not executable after all)
        raise UserError(f"innet launch cannot run {command[0]}: {exc.strerror}") from None
    finally:
        stop(procs)
        if store is not None:
            store.close()
        shutil.rmtree(folder, ignore_errors=True)


def summary(graph: nx.Graph, run: RunSpec, tally: Tally, world: int, wall: float) -> list[str]:
    """What the launcher prints at the end: the collectives, bytes per tier and per link."""
    calls = ", ".join(f"{n} {c}" for n, c in sorted(tally.calls.items())) or "none (did the script use backend innet?)"
    virtual = f"; {tally.virtual_s:.3f} virtual seconds in them" if run.backend == "local" else ""
    fused = f" ({tally.fused} small all-reduces in {tally.fusions} fused collectives)" if tally.fused else ""
    out = [f"innet launch: {world} ranks, {run.mode}, {wall:.1f} s; collectives through the network: {calls}{fused}"
           f"{virtual}"]
    if tally.messages:
        measured, predicted = sum(tally.message_link_bytes.values()), sum(tally.predicted_message_link_bytes.values())
        on_links = (f": {measured} bytes on the links, {predicted} predicted" if measured else
                    f": {predicted} bytes on the links predicted" if predicted else "")
        out.append(f"messages through the network (send/recv, all-to-all, gather, scatter): {tally.messages}{on_links}")
    if tally.side_plane:
        counted = "counted on the links" if run.backend == "mininet" else "not counted"
        out.append(f"over the TCP side plane ({counted}): {', '.join(sorted(tally.side_plane))}")
    tiers = tier_bytes(graph, dict(tally.link_bytes))
    out.append("bytes per tier: " + (", ".join(f"{t} {b}" for t, b in sorted(tiers.items())) or "none"))
    out.append("bytes per link: " + (", ".join(f"{name} {b}" for name, b in sorted(tally.link_bytes.items())) or "none"))
    return out
