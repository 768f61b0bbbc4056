"""``--data-plane ebpf`` (and ``auto``, the default) on Mininet: whether this run's switches can run the eBPF switch
(innet.ebpf), and its program built once for all of them; otherwise one line says why the Python switch runs it.

A dilated run's hops are held where they end (innet.backends.mininet.nodes.port_faults): the eBPF switch forwards at
once and its ports' htb paces each link, so the host at a hop's end holds each frame for the hop's latency and
serialization. Nobody stands at the end of a hop between two switches: the host at the end of the frame's path
holds those hops too (``path_holds``). That is exact where every frame into a queue crossed the same unheld hops
(then every queue's input is the Python switch's, shifted by one constant): where every switch of every job's tree
hears all its children after equal hops (leaf-spine, fat-tree with uniform links); elsewhere the run stays on the
Python switch with a line saying so."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Sequence
from itertools import pairwise

import networkx as nx

from innet.backends.mininet.network import log
from innet.ebpf.build import COLLECTIVES, object_path, unsupported_program, unsupported_routing
from innet.errors import UserError
from innet.graph import is_switch
from innet.node.config import Faults
from innet.planning.planner import JobPlan
from innet.planning.spec import RunSpec
from innet.switch.program import SwitchProgram


def cache_dir() -> str:
    """Where what a machine measures or builds once is kept (the calibration, the eBPF switch): $INNET_CACHE_DIR,
    else /var/cache/innet as root, else ~/.cache/innet."""
    given = os.environ.get("INNET_CACHE_DIR")
    if given:
        return given
    return "/var/cache/innet" if os.geteuid() == 0 else os.path.join(os.path.expanduser("~"), ".cache", "innet")


DILATED = 2.0  # a dilation over 1: what calibrated_plane asks about (its calibration is only for dilated runs)
Hold = tuple[float, float]  # seconds, and seconds per byte of the frame held


def unsupported_run(run: RunSpec, program: type[SwitchProgram], faults: Sequence[Faults], dilation: float,
                    unheld: str = "") -> str:
    """Why this run's switches cannot run the eBPF switch, in a few words ("" when they can). ``unheld``: why the
    hops between switches of a dilated run cannot be held by the hosts at the paths' ends (``path_holds``). With
    ``--mode pbox`` or ``ring`` the switches only route, whatever the collective and the program (unless it routes
    itself)."""
    if run.mode == "innet" and run.collective not in COLLECTIVES:
        return f"--collective {run.collective} is not translated"
    if run.cluster or run.crash:
        return "--cluster and --crash are not translated"
    if dilation > 1 and unheld:
        return unheld
    if any(f.spec.loss or f.spec.dup or f.spec.reorder or (f.spec.delay and not f.rate)
           for ports in faults for f in ports.values()):  # a dilated hop's delay is held by the host at its end
        return "the links' faults are injected by the Python switch's ports"
    return (unsupported_program(program) if run.mode == "innet" else unsupported_routing(program)) or _unbuildable(run, program)


def _hop(graph: nx.Graph, run: RunSpec, sender: str, receiver: str) -> Hold:
    """What the Python switch's port would hold a frame for on this hop: its latency (and --delay), and its
    serialization per byte."""
    return run.faults_on(sender, receiver).delay + graph.edges[sender, receiver]["latency"], 8 / (graph.edges[sender, receiver]["bw"] * 1e6)


def _plus(a: Hold, b: Hold) -> Hold:
    return a[0] + b[0], a[1] + b[1]


def _same(holds: Sequence[Hold]) -> bool:
    return all(math.isclose(h[0], holds[0][0], rel_tol=1e-9, abs_tol=1e-12)
               and math.isclose(h[1], holds[0][1], rel_tol=1e-9, abs_tol=1e-15) for h in holds)


def _up(graph: nx.Graph, run: RunSpec, plan: JobPlan, node: str) -> Hold | None:
    """The hops between switches crossed unheld behind what ``node`` sends up its job's tree (None: its children's
    differ, or theirs)."""
    if not is_switch(graph, node):
        return 0.0, 0.0
    kids = []
    for child in plan.children(node):
        got = _up(graph, run, plan, child)
        if got is None:
            return None
        kids.append(_plus(got, _hop(graph, run, child, node)) if is_switch(graph, child) else got)
    if kids and not _same(kids):
        return None
    return kids[0] if kids else (0.0, 0.0)


def path_holds(graph: nx.Graph, run: RunSpec, plans: Sequence[JobPlan]) -> tuple[dict[str, Hold], str]:
    """On a dilated run on eBPF switches, what each worker host holds a frame it receives for beyond its own
    link's hop: the hops between switches its job's frames crossed unheld, up to the tree's root and down again
    (seconds, seconds per byte). "" or why that is not exact: a switch that hears its children after unequal hops
    (its queue up, and the result's instant, would differ from the Python switch's), jobs whose trees' hops
    differ (sharing a queue), a job through a PBox."""
    holds: dict[str, Hold] = {}
    roots: list[Hold] = []
    for plan in plans:
        if plan.root is None:
            if any(is_switch(graph, a) and is_switch(graph, b) for a, b in graph.edges):
                return {}, (f"job {plan.job}'s frames go host to host (--mode {run.mode}) over links between "
                            "switches, which nobody would hold")
            continue
        root = _up(graph, run, plan, plan.root)
        if root is None:
            return {}, (f"job {plan.job}'s switches hear their children after unequal hops between switches, which "
                        "the hosts cannot hold for them")
        if root != (0.0, 0.0):
            roots.append(root)
        for w in plan.workers:
            way = plan.way_up(plan.first_hop[w])
            hold = root
            for child, parent in pairwise(way):
                hold = _plus(hold, _hop(graph, run, parent, child))
            if w in holds and not _same([holds[w], hold]):
                return {}, f"{w} is in jobs whose trees cross different hops between switches"
            holds[w] = hold
    if roots and not _same(roots):
        return {}, "the jobs' trees cross different hops between switches (their frames would share queues)"
    return holds, ""


def ebpf_object(run: RunSpec, program: type[SwitchProgram], graph: nx.Graph, switches: Sequence[str],
                faults: Callable[[str], Faults], dilation: float,
                plans: Sequence[JobPlan] | None = None) -> tuple[str, dict[str, Hold]]:
    """The built eBPF switch every switch of the run loads, or "" (the Python switch; the line said why), and on a
    dilated run what each worker host holds for the hops between switches (``path_holds``). ``plans``: the run's
    (None: not known, so a dilated run with links between switches stays on the Python switch)."""
    if run.data_plane == "python":
        return "", {}
    holds, unheld = path_holds(graph, run, plans) if plans is not None else (
        {}, "links between switches on a run whose plan is not known here" if switch_links(graph) else "")
    reason = unsupported_run(run, program, [faults(sw) for sw in switches], dilation, unheld)
    if reason:
        log(f"--data-plane {run.data_plane}: the Python switch runs this run ({reason})")
        return "", {}
    path = object_path(program.elements, _keys(program), cache_dir())
    held = ""
    if dilated := dilation > 1:
        across = " and the hops between switches on its path" if any(h != (0.0, 0.0) for h in holds.values()) else ""
        once = ", once cached, else the Python switch's" if run.data_plane == "auto" else ""
        held = (f"; dilated {dilation:g}x, each hop held by the host at its end{across} (--dilation auto takes the "
                f"eBPF switch's calibration{once})")
    what = program.name if run.mode == "innet" else f"its routes (--mode {run.mode} aggregates in no switch)"
    log(f"--data-plane {run.data_plane}: every switch runs {what} as a tc program ({path}){held}")
    return path, holds if dilated else {}


def _keys(program: type[SwitchProgram]) -> int:
    """The slot keys the eBPF switch's maps hold for ``program``: a map holds one entry at least."""
    return max(2 * program.slots, 2)


def _unbuildable(run: RunSpec, program: type[SwitchProgram]) -> str:
    """With ``--data-plane auto``, why this machine cannot build or load the eBPF switch ("" when it can): root, and
    clang or a cached build (``ebpf`` asked for it: a run without them stops with what to install)."""
    if run.data_plane != "auto":
        return ""
    if os.geteuid() != 0:
        return "loading a tc program needs root"
    if shutil.which("clang") is None:
        try:
            object_path(program.elements, _keys(program), cache_dir())  # built before: taken from the cache
        except UserError:
            return "clang is not installed and no build is cached (make deps installs it)"
    return ""


def switch_links(graph: nx.Graph) -> int:
    return sum(1 for a, b in graph.edges if is_switch(graph, a) and is_switch(graph, b))


def calibrated_plane(graph: nx.Graph, run: RunSpec, plans: Sequence[JobPlan] | None = None) -> str:
    """The data plane whose calibration (innet.backends.mininet.calibration) a dilated run of ``run`` on ``graph``
    takes: "ebpf" where its switches will run the eBPF switch, else "python" (innet.api.dilation_choice: with
    ``auto``, the eBPF switch's once cached). ``plans``: the run's (else planned)."""
    from innet.backends.mininet.nodes import port_faults
    from innet.planning.spec import program_of

    if run.data_plane == "python":
        return "python"
    if plans is None and switch_links(graph):
        from innet.schemes.modes import plan_run

        plans = plan_run(graph, run, program_of(run)).plans
    program = program_of(run)
    faults = [port_faults(graph, run, sw, latency=True) for sw in graph if is_switch(graph, sw)]
    unheld = path_holds(graph, run, plans)[1] if plans is not None else ""
    return "python" if unsupported_run(run, program, faults, DILATED, unheld) else "ebpf"
