"""The package layout is the architecture: each layer imports only from the layers below it, and
nothing imports in a circle. Every import counts, those inside functions too."""

import ast
import os

import networkx as nx

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "innet")

# lowest first; a module may import from its own layer and those before it
# io: raw ports; ebpf: the eBPF switch and its loader; node: what runs inside a namespace; backends: the local
# fabric and Mininet orchestration; integrations: torch on top of them; api: innet.run and innet.plan; the CLI and
# the experiments call the api; commands is the ``innet`` front door
LAYERS = ["base", "wire", "switch", "hosts", "planning", "results", "schemes", "io", "ebpf", "node", "backends", "integrations",
          "api", "cli", "experiments", "commands"]
BASE = {"innet.errors", "innet.graph", "innet.events", "innet.shipped"}


def layer_of(module: str) -> str:
    if module in BASE:
        return "base"
    if module == "innet.cli":
        return "cli"
    if module in ("innet.commands", "innet.__main__"):
        return "commands"
    return module.split(".")[1]


def innet_modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                found[rel.removesuffix(".__init__")] = path
    return found


def parse(path: str) -> ast.Module:
    with open(path) as f:
        return ast.parse(f.read())


def imports_of(path: str, modules: dict[str, str]) -> set[str]:
    out = set()
    for node in ast.walk(parse(path)):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("innet"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("innet")]
        out |= {n for n in names if n in modules and not modules[n].endswith("__init__.py")}
    return out


def import_graph() -> nx.DiGraph:
    modules = innet_modules()
    graph = nx.DiGraph()
    for module, path in modules.items():
        if not path.endswith("__init__.py"):
            graph.add_node(module)
            graph.add_edges_from((module, dep) for dep in imports_of(path, modules))
    return graph


def test_every_module_belongs_to_a_known_layer():
    assert {layer_of(m) for m in import_graph()} <= set(LAYERS)


def test_there_are_no_import_cycles():
    assert list(nx.simple_cycles(import_graph())) == []


def test_each_layer_imports_only_from_layers_below_it():
    wrong = [f"{a} ({layer_of(a)}) imports {b} ({layer_of(b)})" for a, b in import_graph().edges
             if LAYERS.index(layer_of(b)) > LAYERS.index(layer_of(a))]
    assert wrong == []


def test_only_the_mininet_backend_imports_mininet():  # and its cluster nodes and links (innet.backends.cluster.remote)
    users = [m for m, path in innet_modules().items()
             if any(isinstance(n, (ast.Import, ast.ImportFrom))
                    and any((getattr(n, "module", None) or a.name).startswith("mininet") for a in n.names)
                    for n in ast.walk(parse(path)))]
    assert sorted(users) == ["innet.backends.cluster.remote", "innet.backends.mininet.emulation", "innet.backends.mininet.network"]


def test_library_errors_name_parameters_not_flags():
    """Only the CLI knows about flags: a UserError raised in the library names a parameter in braces
    ({pool_slots}), which the CLI renders as its flag."""
    import re

    flagged = []
    for module, path in innet_modules().items():
        if module in ("innet.cli", "innet.commands"):
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "UserError":
                texts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                flagged += [f"{module}: {t}" for t in texts if re.search(r"(^|\W)--[a-z]", t)]
    assert flagged == []


def test_the_cli_renders_a_parameter_as_its_flag():
    from innet.cli import flag
    from innet.errors import UserError

    err = UserError("{packet_elements} must be 1..2239 and {slice_elements} positive")
    assert str(err) == "packet_elements must be 1..2239 and slice_elements positive"
    assert err.render(flag) == "--packet-elements must be 1..2239 and --slice positive"


def test_a_process_inside_a_namespace_imports_nothing_of_the_planner_or_the_specs():
    """A Mininet node (innet.node) runs its endpoint from its configuration: it loads neither the planner, the
    run's options, the schemes nor the backends, only what it uses (the seeded tensors, the endpoints, an outcome);
    nor scapy or networkx (~0.35 and ~0.17 s of CPU, which every node process of every run paid)."""
    import subprocess
    import sys

    code = ("import sys, innet.node.__main__; print(' '.join(sorted(m for m in sys.modules if m.startswith("
            "('innet.planning', 'innet.schemes', 'innet.backends', 'innet.api', 'scapy', 'networkx')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.path.dirname(ROOT),
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(ROOT)), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []


def test_a_node_process_runs_one_thread_so_its_cpu_times_stay_with_it():
    """NODE_ENV: without it numpy's OpenBLAS starts a thread per core, whose CPU time leaves the process's
    per-thread schedstat when it ends (innet.node.usage.process_times)."""
    import subprocess
    import sys

    from innet.backends.mininet.network import NODE_ENV

    code = "import os, innet.node.__main__; print(len(os.listdir('/proc/self/task')))"
    threads = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.path.dirname(ROOT),
                              env=dict(os.environ, PYTHONPATH=os.path.dirname(ROOT), **env), timeout=120).stdout.strip()
               for env in ({}, NODE_ENV)]
    assert threads[1] == "1" and int(threads[0]) >= 1  # without: one per core, here
