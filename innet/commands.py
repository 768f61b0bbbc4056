"""``innet``: the command, one subcommand per thing a user does.

``run``, ``plan``, ``train``, ``launch`` and ``replay`` take the options of a run as flags, made from ``RunSpec``'s
fields (innet.cli.add_options), each subcommand the sections that mean something to it; so ``innet run ARGS`` is
``run_topology.py ARGS``. The rest: ``bench``, ``clean`` and ``reproduce``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable

from innet.errors import UserError
from innet.shipped import CHECKOUT, SCRIPTS

# subcommand: (its help line, the table's sections it shows, flags of those sections it leaves out)
SUBCOMMANDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "run": ("run all-reduce over a topology, check it, say where bytes went",
            ("backend", "topology", "job", "workload", "shared input", "consistency", "faults", "output"), ()),
    "plan": ("print the placement plan and the predicted bytes per link; start nothing",
             ("topology", "job", "workload", "shared input"),
             ("seed", "timeout", "pbox_cores", "job_priority", "predict", "hop_latency")),
    "train": ("train a real model (--train digits, the default) with its gradients all-reduced through the network",
              ("backend", "training", "topology", "job", "consistency", "faults", "output"),
              ("elements", "iterations", "jobs", "job_slots", "job_priority", "stragglers", "pbox_layout")),
    "launch": ("run a torch.distributed script (after --), one rank per worker host, its collectives through the network",
               ("backend", "topology", "job", "faults", "output"),
               ("collective", "root", "program", "elements", "iterations", "jobs", "job_slots", "job_priority", "topk",
                "crash", "background", "link_faults", "pcap", "cli", "cluster", "cluster_key", "cluster_known_hosts",
                "json", "plots", "pbox_layout")),
    "replay": ("replay MLCommons Chakra execution traces on the local fabric",
               ("backend", "topology", "job", "faults", "output"),
               ("collective", "root", "program", "elements", "iterations", "jobs", "job_slots", "job_priority", "topk",
                "crash", "background", "pcap", "cli", "cluster", "cluster_key", "cluster_known_hosts", "dilation",
                "node_group", "timeline", "plots", "placement", "pool_slots", "pbox_cores", "pbox_layout")),
}


def parser() -> argparse.ArgumentParser:
    from innet import cli  # on first use: the networkx and numpy behind it load where an interrupt is handled
    p = cli.Parser(prog="innet", description="In-network gradient aggregation, emulated: Python software switches "
                                              "in Mininet, or an in-process fabric in virtual time.",
                    epilog="`innet COMMAND --help` lists a command's flags. README.md is the guide.")
    subs = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=cli.Parser)
    for name, (text, groups, left_out) in SUBCOMMANDS.items():  # each its sections of the run's options
        sub = subs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        cli.add_options(sub, groups, left_out)
        if name == "launch":
            _launch_flags(sub)
        if name == "replay":
            sub.add_argument("trace", nargs="+", metavar="TRACE", help="the trace: NAME.RANK.et files, or their folder")
        if name == "run":  # as run_topology.py: innet run --plan-only is innet plan
            sub.add_argument("--plan-only", action="store_true",
                             help="print the placement plan and predicted bytes, start nothing (as innet plan)")
    b = subs.add_parser("bench", help="run the benchmarks in scripts/ (bench_*.py), or one by name",
                        description="Run the benchmarks in scripts/bench_*.py, or one by name; flags after the name go "
                                    "to the benchmark (see `innet bench NAME --help`). Most need root (Mininet).")
    b.add_argument("name", nargs="?", default=None, help="a benchmark: " + (", ".join(bench_names()) or "(in a source checkout)"))
    b.add_argument("--list", action="store_true", help="list the benchmarks with their first lines")
    subs.add_parser("clean", help="remove what an interrupted innet run left behind",
                    description="Remove what interrupted innet runs left behind (namespaces, links, processes), and "
                                "only that; runs still alive are left alone.")
    r = subs.add_parser("reproduce", help="run an experiment file (a seed paper's figure): CSV, JSON and a plot",
                        description="Run an experiment: a TOML file under experiments/ (by name) or a path. Writes "
                                    "points.csv, points.json and the figure into --out.")
    r.add_argument("name", nargs="?", default=None, help="an experiment's name (see --list) or a path to a .toml file")
    r.add_argument("--list", action="store_true", help="list the shipped experiments, one line each")
    r.add_argument("--backend", choices=("local", "mininet"), default="local",
                   help="local: the fabric in virtual time (the default); mininet: real switches (root)")
    r.add_argument("--quick", action="store_true", help="the experiment's short sweep (its `quick` values)")
    r.add_argument("--out", default=None, help="directory for the results (default results/<name>-<timestamp>)")
    r.add_argument("--jobs", type=_jobs, default=os.cpu_count() or 1,
                   help="points run at once on the local backend, each in its own process (default: one per core; "
                        "the mininet backend runs one at a time)")
    return p


def _launch_flags(p: argparse.ArgumentParser) -> None:
    from innet.integrations.launch.watch import COLLECTIVE_TIMEOUT_S, START_TIMEOUT_S

    g = p.add_argument_group("launch")
    g.add_argument("--start-timeout", type=float, default=START_TIMEOUT_S, metavar="S",
                   help=f"end the run, naming the rank, if a rank has not joined its process group S seconds "
                        f"after it started (default {START_TIMEOUT_S:g})")
    g.add_argument("--collective-timeout", type=float, default=COLLECTIVE_TIMEOUT_S, metavar="S",
                   help=f"end the run, naming the rank, if a rank keeps the others waiting in a collective "
                        f"(or it does not finish) for S seconds (default {COLLECTIVE_TIMEOUT_S:g}); on mininet the "
                        f"switches' calls wait as long (--timeout at least 4 S)")


def bench_names() -> list[str]:
    """The benchmarks in scripts/: none where innet is installed, since a checkout's scripts/ does not ship."""
    if SCRIPTS is None:
        return []
    return sorted(f[len("bench_"):-3] for f in os.listdir(SCRIPTS) if f.startswith("bench_") and f.endswith(".py"))


def _bench(name: str | None, listing: bool, rest: list[str]) -> int:
    if SCRIPTS is None:
        raise UserError("the benchmarks (scripts/bench_*.py) run from a source checkout of innet, not from an installed "
                        "package: run innet bench there")
    names = bench_names()
    if listing:
        for n in names:
            with open(os.path.join(SCRIPTS, f"bench_{n}.py")) as f:
                doc = f.read().split('"""')[1].strip().splitlines()[0]
            print(f"{n:<10} {doc}")
        return 0
    if name is not None and name not in names:
        raise UserError(f"unknown benchmark {name!r}; choose one of {', '.join(names)}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [CHECKOUT, os.environ.get("PYTHONPATH")])))
    for n in [name] if name else names:
        rc = subprocess.run([sys.executable, os.path.join(SCRIPTS, f"bench_{n}.py"), *rest], env=env).returncode
        if rc:
            return rc
    return 0


def main(argv: list[str] | None = None) -> int:
    from innet import cli
    return cli.guarded(lambda: _main(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    from innet import cli
    p = parser()
    if argv[:1] == ["bench"]:  # the rest of a bench's line is the benchmark's own
        args, rest = p.parse_known_args(argv)
        return _bench(args.name, args.list, rest)
    command: list[str] = []
    if argv[:1] == ["launch"] and "--" in argv:  # the rest of a launch's line is the ranks' command
        argv, command = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = p.parse_args(argv)
    if args.command == "train" and not getattr(args, "train", ""):
        args.train = "digits"
    commands: dict[str, Callable[[], int]] = {
        "run": lambda: cli.execute(args),
        "plan": lambda: cli.execute(argparse.Namespace(**vars(args), plan_only=True)),
        "train": lambda: cli.execute(args),
        "clean": lambda: cli.execute(argparse.Namespace(clean=True)),
        "reproduce": lambda: _reproduce(args),
        "launch": lambda: _launch(args, command),
        "replay": lambda: _replay(args),
    }
    return commands[args.command]()


def _reproduce(args: argparse.Namespace) -> int:
    from innet.experiments.file import describe, load
    from innet.experiments.paper import lines
    from innet.experiments.sweep import reproduce

    if args.list:
        print(describe())
        return 0
    if args.name is None:
        raise UserError("name an experiment (innet reproduce --list shows them) or give a .toml file")
    files = reproduce(load(args.name), backend=args.backend, quick=args.quick, out=args.out, jobs=args.jobs)
    with open(files[1]) as f:  # points.json: the paper beside innet, point by point
        for line in lines(json.load(f)):
            print(line)
    print(f"results: {', '.join(files)}")
    return 0


def _launch(args: argparse.Namespace, command: list[str]) -> int:
    """``innet launch [run flags] -- COMMAND``: on Mininet as root (the default there), else on the local fabric."""
    from innet import cli
    from innet.api import prepare
    from innet.integrations.launch.command import launch

    timeouts = {name: vars(args).pop(name) for name in ("start_timeout", "collective_timeout")}
    options = cli.options(args)
    if options.get("mode") == "all" or options.get("backend") == "gloo":
        given = "{mode} all" if options.get("mode") == "all" else "{backend} gloo (that is plain torchrun)"
        raise UserError(f"innet launch runs the script's collectives as innet, pbox or ring, one at a time: not {given}")
    prepared = prepare(default_backend="local" if os.geteuid() else "mininet", calibrate=False, **options)
    [ready] = prepared.runs  # the ranks' collectives run undilated: the side plane is real TCP
    for line in launch(prepared.graph, ready.spec, command, plan=ready.plan, **timeouts):
        print(line)
    return 0


def _replay(args: argparse.Namespace) -> int:
    """``innet replay [run flags] TRACE...``: the trace on the fabric in each mode asked, one report each."""
    from innet import cli
    from innet.api import prepare
    from innet.integrations.chakra.record import lines, write
    from innet.integrations.chakra.replay import replay
    from innet.integrations.chakra.schedule import Schedule
    from innet.integrations.chakra.trace import load

    paths = vars(args).pop("trace")
    options = cli.options(args)
    if options.get("backend", "local") != "local":
        raise UserError(f"innet replay runs on the local fabric ({{backend}} local), not {{backend}} {options['backend']}")
    traces = load(paths)
    schedule = Schedule(traces)  # every rule of the trace checked before anything is built
    if options.setdefault("workers", len(traces)) != len(traces):
        raise UserError(f"the trace has {len(traces)} ranks: {{workers}} {options['workers']} cannot replay it")
    prepared = prepare(default_backend="local", calibrate=False, **options)
    records = []
    for m in prepared.runs:
        records.append(replay(prepared.graph, m.spec, traces, schedule))
        for line in lines(records[-1]):
            print(line)
    for path in write(records, prepared.spec.out, prepared.spec.json):
        print(f"results: {path}")
    return 0 if all(r.correct for r in records) else 1


def _interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an interrupt or was raised by one: Python 3.11 wraps an interrupt that lands in a
    class body's ``__set_name__`` (e.g. while networkx is being imported) in a RuntimeError."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def console(entry: Callable[[], int] | None = None) -> int:
    """The ``innet`` entry point (``entry``: another command's main, e.g. ``innet.cli.main``): SIGTERM tears a run
    down as Ctrl-C does, and an interrupt, however wrapped, is exit 130. (This module loads only the standard
    library and ``import innet`` loads nothing, so the guard is in place before anything slow loads.)"""
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return (entry or main)()
    except BaseException as exc:  # noqa: BLE001 -- an interrupt, however wrapped, is exit 130; the rest goes on up
        if isinstance(exc, SystemExit) or not _interrupted(exc):
            raise
        print("interrupted", file=sys.stderr)
        return 130


def _jobs(text: str) -> int:
    """``--jobs``: a whole number of processes, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"jobs must be a whole number of at least 1, got {text!r}")
    return int(text)
