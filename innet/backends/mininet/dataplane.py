"""``--data-plane ebpf`` (and ``auto``, the default) on Mininet: whether this run's switches can run the eBPF switch
(innet.ebpf), and its program built once for all of them; otherwise one line says why the Python switch runs it.

A dilated run's hops are held where they end (innet.backends.mininet.nodes.port_faults): the eBPF switch forwards at
once and its ports' htb paces each link, so the host at a hop's end holds each frame for the hop's latency and
serialization. Nobody stands at the end of a hop between two switches: the host at the end of the frame's path
holds those hops too (``path_holds``). That is exact where every frame into a queue crossed the same unheld hops
(then every queue's input is the Python switch's, shifted by one constant): in-network, where every switch of every
job's tree hears all its children after equal hops (leaf-spine, fat-tree with uniform links); from host to host
(pbox, ring), where a sender's hold before it sends evens out the hops flows crossed before the queues they share;
elsewhere the run stays on the Python switch with a line saying so."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence

import networkx as nx

from innet.backends.mininet.network import log
from innet.ebpf.build import COLLECTIVES, object_path, unsupported_program, unsupported_routing
from innet.ebpf.holds import Holds, HostHold, path_holds, switch_links
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
    if run.timeline and run.mode == "innet":
        return "--timeline's track of the slots held is the Python switch's"
    if dilation > 1 and unheld:
        return unheld
    if any(f.spec.loss or f.spec.dup or f.spec.reorder or (f.spec.delay and not f.rate)
           for ports in faults for f in ports.values()):  # a dilated hop's delay is held by the host at its end
        return "the links' faults are injected by the Python switch's ports"
    return (unsupported_program(program) if run.mode == "innet" else unsupported_routing(program)) or _unbuildable(run, program)


def ebpf_object(run: RunSpec, program: type[SwitchProgram], graph: nx.Graph, switches: Sequence[str],
                faults: Callable[[str], Faults], dilation: float,
                plans: Sequence[JobPlan] | None = None) -> tuple[str, Holds]:
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
        across = " and the hops between switches on its path" if any(h != HostHold() for h in holds.values()) else ""
        if any(h.out != (0.0, 0.0) for h in holds.values()):
            across += ", some by their senders so that flows meet as on the Python switch"
        held = (f"; dilated {dilation:g}x, each hop held by the host at its end{across} (--dilation auto takes the "
                f"eBPF switch's calibration)")
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


def calibrated_plane(graph: nx.Graph, run: RunSpec, plans: Sequence[JobPlan] | None = None) -> str:
    """The data plane whose calibration (innet.backends.mininet.calibration) a dilated run of ``run`` on ``graph``
    takes: "ebpf" where its switches will run the eBPF switch, else "python" (innet.api.dilation_choice), with
    ``auto`` as with ``ebpf``. ``plans``: the run's (else planned)."""
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
