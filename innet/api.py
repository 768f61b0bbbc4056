"""innet as a library: ``run`` and ``plan``. The command line, ``innet reproduce``, the scripts and the tests
are clients of these two.

>>> import innet
>>> report = innet.run("star", workers=4, elements=10000, backend="local")
>>> report.runs[0].correct
True

``topology`` (or the option ``topo``; default leaf-spine) is a builder's name (its sizes among the options:
``racks=3``, ``k=4``, ...), a .graphml or .json file, or a networkx graph with node roles (topologies.files).
The options are ``RunSpec``'s fields;
the faults of every link may also be given one by one (``loss=0.01``). Every rule is checked before anything
is built, each broken one a ``UserError`` of one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import networkx as nx

from innet.errors import Unfinished, UserError
from innet.events import Event, emit, listening
from innet.graph import host_link_rate
from innet.planning.planner import JobPlan
from innet.planning.prediction import run_link_bytes
from innet.planning.rules import gloo_applies, shapeable, validate
from innet.planning.spec import FAULT_HELP, MODES, TCLINK_MAX_MBPS, RunSpec, program_of
from innet.results.files import check_outputs
from innet.results.record import RunRecord
from innet.results.report import ExactTraining, Report
from innet.schemes.modes import RunPlan
from innet.schemes.prepared import ModeRun, Prepared
from innet.wire.faults import FaultSpec

__all__ = ["prepare", "run", "plan", "spec_of", "mode_specs", "dilation_of", "dilation_choice", "Prepared", "ModeRun",
           "Backend", "BACKENDS", "Plan", "ModePlan", "Report", "RunSpec"]


def spec_of(topology: str | nx.Graph | os.PathLike[str] | None = None, default_backend: str = "",
            **options: Any) -> tuple[RunSpec, nx.Graph]:
    """The validated ``RunSpec`` of ``options`` and the topology's graph: what ``run`` and ``plan`` start from.
    Without ``backend``: ``default_backend``, else Mininet as root."""
    options = dict(options)
    if topology is not None and "topo" in options:
        raise UserError("give the topology once: as the first argument or as {topo}, not both")
    topology = options.pop("topo", "leaf-spine") if topology is None else topology
    if not isinstance(topology, str | os.PathLike | nx.Graph):
        raise UserError(f"{{topo}} is a builder's name, a topology file or a networkx graph, got {topology!r}")
    faults = {k: options.pop(k) for k in FAULT_HELP if k in options}
    if faults:
        if not isinstance(options.get("faults", FaultSpec()), FaultSpec):
            raise UserError(f"{{faults}} must be a FaultSpec, got {options['faults']!r}")
        try:
            options["faults"] = replace(options.get("faults", FaultSpec()), **faults)
        except ValueError as exc:
            raise UserError(f"bad fault option: {exc}") from None
    graph = topology if isinstance(topology, nx.Graph) else None
    options["topo"] = graph.graph.get("name", "graph") if graph is not None else os.fspath(topology)
    options["backend"] = _backend(options.get("backend") or default_backend)
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(RunSpec)})
    if unknown:
        near = difflib.get_close_matches(unknown[0], [f.name for f in dataclasses.fields(RunSpec)], 1)
        raise UserError(f"unknown option {unknown[0]!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    if graph is not None:
        given = sorted(k for k in ("bw", "racks", "hosts_per_rack", "spines", "k", "oversubscription") if k in options)
        if given:
            raise UserError(f"{{{given[0]}}} sizes a topology innet builds: a graph given to innet carries its own "
                            "(set bw, latency and role on its links and nodes)")
        from innet.graph import validate as check_graph
        from innet.shipped import complete

        graph = check_graph(complete(graph, "graph"), "graph")
    if options.get("train"):  # a training run's calls are its model's: what it derives is not the user's to give
        for name in ("elements", "iterations"):
            if name in options:
                raise UserError(f"{{{name}}} is what {{train}} derives from its model and data: it takes no {{{name}}} "
                                "of its own; size it with {hidden}, {epochs} and {batch}")
    spec = validate(RunSpec(**options))
    if graph is None:
        from innet.shipped import build

        graph = build(spec.topo, workers=spec.workers if spec.topo == "star" and spec.workers is not None else 4,
                      racks=spec.racks, hosts_per_rack=spec.hosts_per_rack, spines=spec.spines, k=spec.k, bw=spec.bw,
                      oversubscription=spec.oversubscription,
                      rack_servers={"rack": "pbox", "sharded": "host"}.get(spec.pbox_layout, ""))
    validate(spec, graph)
    check_outputs((spec.out, spec.pcap), (spec.json, spec.save_topology, spec.timeline))  # refused now, not after the run
    if spec.save_topology:
        from innet.shipped import save_file

        save_file(graph, spec.save_topology)
    return spec, graph


def _backend(backend: str) -> str:
    """The backend a run takes: ``backend``, else Mininet; Mininet (and gloo, between its hosts) needs root."""
    if backend in ("", "mininet", "gloo") and os.geteuid() != 0:
        raise UserError(f"the {backend or 'mininet'} backend needs root: run with sudo, or use {{backend}} local")
    if backend == "gloo":
        from innet.integrations.ranks.mininet import torch_available

        if not torch_available():
            raise UserError("{backend} gloo needs torch: pip install -e '.[torch]' (torch==2.13.0, the CPU build)")
    return backend or "mininet"


def mode_specs(spec: RunSpec, graph: nx.Graph) -> list[RunSpec]:
    """One spec per run ``spec`` asks for: its mode, or with ``mode="all"`` innet, pbox and ring (the gloo backend
    too on Mininet where it applies; a training run: every scheme of innet.schemes.learn). gloo's spec is the ring's
    (its record is laid out as the ring's: the same plan and predicted bytes) on backend gloo."""
    return _mode_specs(spec, graph)[0]


def _mode_specs(spec: RunSpec, graph: nx.Graph) -> tuple[list[RunSpec], tuple[str, ...]]:
    """``mode_specs``, and a line for each baseline left out."""
    base = replace(spec, workers=None if spec.topo == "star" else spec.workers)
    if spec.train and spec.mode == "all":
        from innet.schemes.learn import scheme_specs

        return scheme_specs(base, spec.topk or 0.01, spec.staleness), ()
    if spec.backend == "gloo":
        return [replace(base, mode="ring")], ()
    if spec.mode != "all":
        return [base], ()
    specs = [replace(base, mode=mode) for mode in MODES]
    if spec.backend == "mininet" and host_link_rate(graph) <= TCLINK_MAX_MBPS:  # gloo: TCP on undilated links
        from innet.integrations.ranks.mininet import torch_available

        gloo = replace(base, mode="ring", backend="gloo")
        if gloo_applies(base) and torch_available():
            from innet.planning.memory import wont_fit

            why = wont_fit(graph, gloo, "mininet")
            if why:  # one torch rank per worker host would not fit: the run goes on without the baseline
                return specs, (f"gloo left out: {why}",)
            specs.append(gloo)
    return specs, ()


def prepare(topology: str | nx.Graph | os.PathLike[str] | None = None, default_backend: str = "", *,
            calibrate: bool = True, **options: Any) -> Prepared:
    """``run(topology, **options)`` made ready, nothing started: every rule checked (the options, the graph,
    memory), the program loaded and every job placed, once. ``run`` and every backend take what this makes.
    ``calibrate=False``: Mininet's auto dilation is left unresolved (1), as a plan needs none."""
    spec, graph = spec_of(topology, default_backend, **options)
    specs, notes = _mode_specs(spec, graph)
    if spec.shared_input and spec.jobs == 1:  # harmless, and an ensemble sweep's first point: said, not refused
        notes += ("shared_input with one job: its one stream is unicast either way, nothing is shared",)
    from innet.planning.memory import check_memory

    for s in specs:  # before anything is built: a run that cannot fit is refused, not OOM-killed halfway
        check_memory(graph, s, spec.backend, node_group=spec.node_group)
    return Prepared(spec, graph, tuple(_mode_run(graph, s, calibrate) for s in specs), _cluster(spec), notes)


def _mode_run(graph: nx.Graph, spec: RunSpec, calibrate: bool = True) -> ModeRun:
    """One mode's run, placed once (gloo's: the ring's plan, its hosts and predicted bytes; no switch of innet's)."""
    from innet.schemes.modes import installed_configs, plan_run
    from innet.switch.runtime import check_fits

    rp = plan_run(graph, spec, program_of(spec))
    sized = program_of(spec, rp.fan_in)
    if spec.backend == "gloo":
        return ModeRun(spec, rp, sized)
    for config in installed_configs(graph, spec, rp, routed=False).values():  # every switch's registers fit
        check_fits(config, sized)
    factor, bound = dilation_choice(graph, spec, rp) if calibrate else (1.0, "")
    return ModeRun(spec, rp, sized, factor, bound)


def run(topology: str | nx.Graph | os.PathLike[str] | Prepared | None = None,
        on_event: Callable[[Event], None] | None = None, **options: Any) -> Report:
    """Run all-reduce (or a workload, or training) over ``topology`` as ``options`` say, check every result
    and measure where the bytes went. With ``out`` (or ``json``) the report's files are written there too.
    ``topology`` may be what ``prepare`` made (then no options); ``on_event`` hears the run's events
    (innet.events: phases, progress, warnings, the fidelity verdict) as they happen."""
    with listening(on_event):
        if isinstance(topology, Prepared):
            if options:
                raise UserError(f"a prepared run takes no options: prepare it with {sorted(options)[0]!r} instead")
            prepared = topology
        else:
            prepared = prepare(topology, **options)
        return _run(prepared)


def _run(prepared: Prepared) -> Report:
    spec, graph = prepared.spec, prepared.graph
    for note in prepared.notes:
        emit("warning", note)
    runs: list[RunRecord] = []
    try:
        for m in prepared.runs:
            try:
                runs.append(_as_asked(m.spec, BACKENDS[m.spec.backend](prepared, m)))
            except Unfinished as e:
                if spec.mode != "all" or m.spec.backend != "gloo":
                    raise
                lossy = f" at {spec.faults.loss:.0%} loss" if spec.faults.loss else ""
                emit("warning", f"gloo left out: {e}{lossy}")  # a baseline's absence, not the run's failure
            if runs and m is not prepared.runs[-1]:  # each mode's record kept as it finishes (the last: by the report)
                _keep(prepared, runs)
    except BaseException as exc:  # nothing finished is lost: the runs done so far are written, and said
        kept = _keep(prepared, runs) if runs else []
        if kept and isinstance(exc, UserError) and not isinstance(exc, Unfinished):
            raise UserError(f"{exc.render(lambda n: '{' + n + '}')}; the finished run(s) "
                            f"{', '.join(r.mode for r in runs)} were kept in {', '.join(kept)}") from None
        if kept:
            emit("warning", f"the finished run(s) {', '.join(r.mode for r in runs)} were kept in {', '.join(kept)}")
        raise
    exact = None
    if spec.train:
        from innet.schemes.learn import exact_history

        exact = ExactTraining(tuple(exact_history(prepared.runs[0].spec, len(runs[0].jobs[0].workers))))
    table = ""
    if spec.predict:
        from innet.schemes.planreport import prediction_table

        plans = {m.spec.mode: m.plan for m in prepared.runs if m.plan is not None}
        table, runs = prediction_table(graph, prepared.runs[0].spec, runs, plans, spec.hop_latency)
    report = Report(spec, graph, tuple(runs), exact, table)
    if spec.out or spec.json or spec.timeline:
        try:
            report = replace(report, files=tuple(report.write(spec.out, spec.plots, spec.json, spec.timeline)))
        except OSError as exc:  # a full disk or a size limit after the run: one line, and what was kept
            raise UserError(f"cannot write the results: {exc.strerror or exc} ({exc.filename or spec.out}); "
                            f"what each mode's run wrote as it finished is in {spec.out or spec.json}") from None
    return report


def _as_asked(spec: RunSpec, record: RunRecord) -> RunRecord:
    """``record``, saying in one line and in its figures (``requested_placement``) where what ran is not what was
    asked: jobs that found no room in the switches and fell back to the PBox (ATP's best effort, the point of
    it), so an in-network run that the PBox summed is never reported as in-network alone."""
    if not record.fallbacks:
        return record
    reasons = sorted({j.outcome.removeprefix("fallback: ") for j in record.jobs if j.outcome.startswith("fallback")})
    emit("warning", f"{record.mode}: {record.fallbacks} of {len(record.jobs)} job(s) fell back to the PBox "
                    f"({'; '.join(reasons)}): placement {spec.placement} was asked, {record.placement} ran")
    return record.with_figures(requested_placement=spec.placement)


def _keep(prepared: Prepared, runs: list[RunRecord]) -> list[str]:
    """Write the runs finished so far where the run's results go (no plots: the last write draws them); where."""
    spec = prepared.spec
    if not (spec.out or spec.json or spec.timeline):
        return []
    try:
        files = Report(spec, prepared.graph, tuple(runs)).write(spec.out, False, spec.json, spec.timeline)
    except OSError as exc:
        emit("warning", f"the finished run(s) could not be written: {exc.strerror or exc} ({exc.filename})")
        return []
    return [spec.out] if files else [p for p in (spec.json, spec.timeline) if p]


class Backend(Protocol):
    """What runs one mode of a prepared run and measures it: ``BACKENDS[name](prepared, mode_run)``."""

    def __call__(self, prepared: Prepared, mode: ModeRun, /) -> RunRecord: ...


def _local(prepared: Prepared, m: ModeRun) -> RunRecord:
    """The in-process fabric, in virtual time (innet.backends.local)."""
    from innet.backends.local.run import LocalRun

    assert m.plan is not None and m.program is not None
    return LocalRun(prepared.graph, m.spec, m.spec.pbox_cores, dict(m.spec.crash), planned=m.plan, program=m.program).finish()


def _mininet(prepared: Prepared, m: ModeRun) -> RunRecord:
    """Python switches on veth links in network namespaces (innet.backends.mininet), on servers with a cluster."""
    from innet.backends.mininet.emulation import run_mininet

    s = m.spec

    def once(spec: RunSpec) -> RunRecord:
        return run_mininet(prepared.graph, spec, pcap_dir=s.pcap or None, cli=s.cli, pbox_cores=s.pbox_cores,
                           crash=dict(s.crash), cluster=prepared.cluster, dilation=m.dilation, node_group=s.node_group,
                           placed=m.plan, dilation_bound=m.dilation_bound)

    record = once(s)
    if not s.background.elastic:
        return record
    # the job's slowdown, as the local backend gives it: the same run on a network without the background
    from innet.hosts.background import BackgroundSpec, with_alone

    quiet, bg = once(replace(s, background=BackgroundSpec())), record.figures["background"]
    return record.with_figures(background=with_alone(bg, bg.alone_mbps, record.completion_s, quiet.completion_s))


def _gloo(prepared: Prepared, m: ModeRun) -> RunRecord:
    """torch.distributed's gloo all-reduce between the same Mininet hosts: the baseline ``--mode all`` compares."""
    from innet.integrations.ranks.mininet import run_gloo

    assert m.plan is not None
    return run_gloo(prepared.graph, m.spec, m.plan)


BACKENDS: dict[str, Backend] = {"local": _local, "mininet": _mininet, "gloo": _gloo}


def dilation_of(graph: nx.Graph, spec: RunSpec, rp: RunPlan | None = None) -> float:
    """The time dilation factor a Mininet run of ``spec`` on ``graph`` takes (``dilation_choice``'s)."""
    return dilation_choice(graph, spec, rp)[0]


def dilation_choice(graph: nx.Graph, spec: RunSpec, rp: RunPlan | None = None) -> tuple[float, str]:
    """The time dilation factor a Mininet run of ``spec`` on ``graph`` takes, and with "auto" which bound chose it
    (innet.planning.timing.dilation.auto_bounds: "bandwidth", "links busy at once", "latency"; "" for a factor given
    or of 1): ``spec.dilation``'s, or with "auto" the factor this mode needs for its links to be carried faithfully
    and its process hops to weigh little (the machine's rate and hop latency calibrated once, cached;
    innet.schemes.modes.auto_choice; ``rp``: the run's plan, else it is planned). The local backend runs in
    virtual time: 1."""
    if spec.backend in ("local", "gloo"):
        return 1.0, ""
    if spec.dilation != "auto":
        return float(spec.dilation), ""
    from innet.backends.mininet.calibration import calibration
    from innet.backends.mininet.dataplane import calibrated_plane
    from innet.planning.timing.dilation import auto_factor
    from innet.schemes.modes import auto_choice, plan_run

    rp = rp or plan_run(graph, spec, program_of(spec))
    plane = calibrated_plane(graph, spec, rp.plans)
    cal = calibration(data_plane=plane)
    wrong = shapeable(spec, auto_factor(host_link_rate(graph), cal.faithful_mbps))
    if wrong:
        raise UserError(wrong)
    servers = plane == "ebpf" and spec.mode == "pbox"  # the PBox: a Python process on the eBPF plane too
    python = calibration(data_plane="python").faithful_mbps if servers else 0.0
    return auto_choice(graph, spec, rp, cal.faithful_mbps, cal.hop_s, plane, python)


def _cluster(spec: RunSpec) -> Any:
    """The servers of ``cluster`` (None without it), checked for form here and reached only when the run starts."""
    if not spec.cluster:
        return None
    from innet.backends.cluster.servers import Cluster, parse_servers

    return Cluster(parse_servers(spec.cluster), key=spec.cluster_key, known_hosts=spec.cluster_known_hosts)


@dataclass(frozen=True)
class ModePlan:
    """One mode's plan: every job's placement and the bytes the planner predicts on each link."""

    mode: str
    jobs: tuple[JobPlan, ...]
    predicted_link_bytes: dict[str, int]
    text: str = field(repr=False)


@dataclass(frozen=True)
class Plan:
    """What a run would do, before anything starts: a ``ModePlan`` per mode."""

    spec: RunSpec
    graph: nx.Graph = field(repr=False)
    modes: tuple[ModePlan, ...]

    def text(self) -> str:
        return "\n\n".join(m.text for m in self.modes)


def plan(topology: str | nx.Graph | os.PathLike[str] | None = None, **options: Any) -> Plan:
    """The placement plan and predicted bytes per link of ``run(topology, **options)``, without running it
    (the backend defaults to local: nothing is built)."""
    from innet.schemes.planreport import plan_report

    prepared = prepare(topology, default_backend="local", calibrate=False, **options)
    spec, graph = prepared.spec, prepared.graph
    modes = []
    for m in prepared.runs:
        s, rp = m.spec, m.plan
        if rp is None:  # gloo plans nothing of innet's
            continue
        density = s.topk if s.topk and s.mode != "ring" else 1.0
        modes.append(ModePlan(s.mode, rp.plans, run_link_bytes(graph, s.mode, rp.plans, rp.per_packet, s.calls(), density,
                                                               s.root), plan_report(graph, s, rp)))
    return Plan(spec, graph, tuple(modes))
