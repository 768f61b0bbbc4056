"""``--data-plane ebpf`` on Mininet: whether this run's switches can run the eBPF switch (innet.ebpf), and its
program built once for all of them; otherwise one line says why the Python switch runs it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import networkx as nx

from innet.backends.mininet.network import log
from innet.ebpf.build import COLLECTIVES, object_path, unsupported_program, unsupported_routing
from innet.graph import is_switch
from innet.node.config import Faults
from innet.planning.spec import RunSpec
from innet.switch.program import SwitchProgram


def cache_dir() -> str:
    """Where what a machine measures or builds once is kept (the calibration, the eBPF switch): $INNET_CACHE_DIR,
    else /var/cache/innet as root, else ~/.cache/innet."""
    given = os.environ.get("INNET_CACHE_DIR")
    if given:
        return given
    return "/var/cache/innet" if os.geteuid() == 0 else os.path.join(os.path.expanduser("~"), ".cache", "innet")


def unsupported_run(run: RunSpec, program: type[SwitchProgram], faults: Sequence[Faults], dilation: float,
                    switch_links: int = 0) -> str:
    """Why this run's switches cannot run the eBPF switch, in a few words ("" when they can). A dilated run's
    hops are held by the hosts at their ends (innet.backends.mininet.nodes.port_faults), so ``switch_links``
    (links between two switches: nobody would hold them) keep it on the Python switch. With ``--mode pbox`` or
    ``ring`` the switches only route, whatever the collective and the program (unless it routes itself)."""
    if run.mode == "innet" and run.collective not in COLLECTIVES:
        return f"--collective {run.collective} is not translated"
    if run.cluster or run.crash:
        return "--cluster and --crash are not translated"
    if dilation > 1 and switch_links:
        return (f"links dilated {dilation:g}x between switches are held by the Python switch's ports; dilated, the "
                "eBPF switch needs one switch between hosts")
    if any(f.spec.loss or f.spec.dup or f.spec.reorder or (f.spec.delay and not f.rate)
           for ports in faults for f in ports.values()):  # a dilated hop's delay is held by the host at its end
        return "the links' faults are injected by the Python switch's ports"
    return unsupported_program(program) if run.mode == "innet" else unsupported_routing(program)


def ebpf_object(run: RunSpec, program: type[SwitchProgram], graph: nx.Graph, switches: Sequence[str],
                faults: Callable[[str], Faults], dilation: float) -> str:
    """The built eBPF switch every switch of the run loads, or "" (the Python switch; the line said why)."""
    if run.data_plane != "ebpf":
        return ""
    reason = unsupported_run(run, program, [faults(sw) for sw in switches], dilation, switch_links(graph))
    if reason:
        log(f"--data-plane ebpf: the Python switch runs this run ({reason})")
        return ""
    path = object_path(program.elements, max(2 * program.slots, 2), cache_dir())  # a map holds one entry at least
    held = (f"; dilated {dilation:g}x, each hop held by the host at its end (--dilation auto takes the eBPF "
            "switch's calibration)") if dilation > 1 else ""
    what = program.name if run.mode == "innet" else f"its routes (--mode {run.mode} aggregates in no switch)"
    log(f"--data-plane ebpf: every switch runs {what} as a tc program ({path}){held}")
    return path


def switch_links(graph: nx.Graph) -> int:
    return sum(1 for a, b in graph.edges if is_switch(graph, a) and is_switch(graph, b))


def calibrated_plane(graph: nx.Graph, run: RunSpec) -> str:
    """The data plane whose calibration (innet.backends.mininet.calibration) a dilated run of ``run`` on ``graph``
    takes: "ebpf" where its switches will run the eBPF switch, else "python"."""
    from innet.backends.mininet.nodes import port_faults
    from innet.planning.spec import program_of

    if run.data_plane != "ebpf":
        return "python"
    faults = [port_faults(graph, run, sw, latency=True) for sw in graph if is_switch(graph, sw)]
    return "python" if unsupported_run(run, program_of(run), faults, 2.0, switch_links(graph)) else "ebpf"
