"""Every rule about a run's options, alone and together, and against its topology: ``validate`` raises the
first one broken as a ``UserError`` line naming its fields in braces. The options' types, finiteness and
bounds come first (innet.planning.checks, when a ``RunSpec`` is made); these are the rules between them."""

from __future__ import annotations

import os
from collections.abc import Callable

import networkx as nx

from innet.errors import UserError
from innet.graph import host_link_rate
from innet.planning.options import options_of
from innet.planning.spec import TCLINK_MAX_MBPS, RunSpec, program_of
from innet.wire.faults import FaultSpec


def validate(s: RunSpec, graph: nx.Graph | None = None) -> RunSpec:
    """Every rule about ``s`` (and against ``graph``, the topology, when given): the first broken one as a
    ``UserError`` line naming its fields in braces. Returns the spec."""
    for rule in _RULES:
        wrong = rule(s)
        if wrong:
            raise UserError(wrong)
    if graph is not None:
        _check_graph(s, graph)
    return s


def _ranges(s: RunSpec) -> str | None:
    if s.elements < 1 or s.iterations < 1:
        name = "elements" if s.elements < 1 else "iterations"
        return f"{{{name}}} must be at least 1, got {getattr(s, name)}"
    if s.bw is not None and not 0 < s.bw:
        return f"{{bw}} must be positive, got {s.bw:g}"
    if s.switch_memory < 0 or s.timeout <= 0:
        return "{switch_memory} must not be negative and {timeout} must be positive"
    if not 0 < s.workload_scale <= 1 or s.compute_scale < 0:
        return "{workload_scale} must be in (0, 1] and {compute_scale} must not be negative"
    if s.slice_elements < 0:
        return f"{{slice_elements}} must not be negative, got {s.slice_elements}"
    if not 0 <= s.topk <= 1:
        return f"{{topk}} must be a fraction in [0, 1], got {s.topk:g}"
    if s.job_slots < 0 or s.pool_slots < 0:
        return f"{{job_slots}} and {{pool_slots}} must not be negative, got {s.job_slots} and {s.pool_slots}"
    if s.staleness < 0 or s.compute_time < 0:
        return "{staleness} and {compute_time} must not be negative"
    if s.pbox_cores < 1:
        return f"{{pbox_cores}} must be at least 1, got {s.pbox_cores}"
    return None


def _where(s: RunSpec) -> str | None:
    """Options given where they mean nothing (each ``Option``'s topos, backends and needs)."""
    given = s.given()
    for f, opt in options_of(RunSpec):
        if f.name not in given:
            continue
        if opt.topos and s.topo not in opt.topos:
            return f"{{{f.name}}} shapes {' and '.join(opt.topos)}: it means nothing with {{topo}} {s.topo}"
        if opt.needs and not getattr(s, opt.needs):
            return f"{{{f.name}}} means nothing without {{{opt.needs}}}"
        if opt.backends and s.backend and s.backend not in opt.backends:
            owners = " and ".join(b.capitalize() for b in opt.backends)
            return f"{{{f.name}}} is {owners}'s: it means nothing with {{backend}} {s.backend}"
    if "staleness" in given and s.consistency != "ssp" and not (s.train and s.mode == "all"):
        return "{staleness} is SSP's bound: it needs {consistency} ssp"
    return None


def _collective(s: RunSpec) -> str | None:
    c = s.collective_of
    if s.root < 0 or ("root" in s.given() and not c.rooted):
        return f"{{root}} is the root rank of broadcast and reduce (at least 0): it means nothing with {{collective}} {c.name}"
    if c.name != "allreduce" and (s.train or s.consistency or s.topk or s.input_elements or s.workload):
        return (f"{{collective}} {c.name} runs on seeded tensors: it does not take {{train}}, {{consistency}}, {{topk}}, "
                "{input_elements} or {workload}")
    if c.name != "allreduce" and s.backend == "gloo":
        return f"{{backend}} gloo runs torch.distributed's all-reduce: it does not run {{collective}} {c.name}"
    served = program_of(s).collectives
    if s.mode in ("innet", "all") and c.name not in served:
        return (f"{{program}} {s.program} serves {', '.join(served)} only: it has no handler for {{collective}} {c.name} "
                "(a Reduction subclass serves all six), or use {mode} pbox or ring")
    if not c.combines and s.operator.rule == "select":
        return (f"{{collective}} {c.name} replicates one rank's values with the identity elsewhere: {{program}} "
                f"{s.program} reduces with {s.operator.name}, whose identity is no float; use a sum or bit program")
    return None


def _workload(s: RunSpec) -> str | None:
    if s.overlap != "layers" and not s.workload:
        return "{overlap} says when a workload's layers are all-reduced: it needs {workload}"
    if s.pipeline != 1 and not s.workload:
        return "{pipeline} overlaps a workload's compute with its communication: it needs {workload}"
    if (s.slice_elements or s.priority != "fifo") and not s.workload:
        return "{slice_elements} and {priority} order a workload's layers: they need {workload}"
    if s.ps and (not s.workload or s.sharded or s.pipeline != 1):
        return "{ps} models a workload's data-parallel exchange: it needs {workload}, without {sharded} or {pipeline} 2"
    return _sharded(s) if s.sharded else None


def _sharded(s: RunSpec) -> str | None:
    if not s.workload:
        return "{sharded} runs a workload's layers in FSDP's schedule: it needs {workload}"
    if s.slice_elements or s.priority != "fifo" or s.pipeline != 1 or s.overlap != "layers":
        return "{sharded} runs FSDP's own schedule: it takes neither {slice_elements}, {priority}, {pipeline} nor {overlap}"
    if s.topk or s.backend == "gloo":
        return "{sharded} all-gathers and reduce-scatters dense shards: it takes neither {topk} nor {backend} gloo"
    served = program_of(s).collectives
    if s.mode in ("innet", "all") and not {"all_gather", "reduce_scatter"} <= set(served):
        return (f"{{program}} {s.program} serves {', '.join(served)} only: {{sharded}} needs all_gather and "
                "reduce_scatter (a Reduction subclass serves them), or use {mode} pbox or ring")
    return None
    return None


def _backend(s: RunSpec) -> str | None:
    if s.backend in ("local", "gloo") and s.dilation not in ("auto", 1.0):
        why = "the local backend runs in virtual time" if s.backend == "local" else "gloo's TCP runs undilated"
        return f"{{dilation}} {s.dilation:g} slows Mininet's clock; {why} and needs none: use {{dilation}} auto or off there"
    if s.backend == "gloo" and (wrong := _gloo(s)):
        return wrong
    if s.timeline and s.cluster:
        return ("{timeline} puts every node's instants on one clock, and the servers of a {cluster} each keep their "
                "own: write it from a run on one machine")
    return shapeable(s, s.dilation) if isinstance(s.dilation, float) else None


def shapeable(s: RunSpec, factor: float) -> str | None:
    """Why ``s``'s links dilated by ``factor`` are ones TCLink cannot shape, or None."""
    if s.bw is not None and s.backend == "mininet" and s.bw / factor > TCLINK_MAX_MBPS:
        return (f"{{bw}} {s.bw:g} is {s.bw / factor:g} Mbit/s on the dilated links ({{dilation}} factor "
                f"{factor:g}), above the {TCLINK_MAX_MBPS:g} TCLink can shape: dilate by at least "
                f"{s.bw / TCLINK_MAX_MBPS:g}, or use the local backend")
    return None


def _outputs(s: RunSpec) -> str | None:
    """The output paths can be written: tried before the run, which may take an hour, not after it. Nothing is
    left behind: folders made for the try are removed again (the run makes them when it writes)."""
    for name, folder in (("out", s.out), *((n, os.path.dirname(os.path.abspath(getattr(s, n))) if getattr(s, n) else "")
                                          for n in ("json", "timeline"))):
        if not folder:
            continue
        made = []
        try:
            path = os.path.abspath(folder)
            while not os.path.exists(path):
                made.append(path)
                path = os.path.dirname(path)
            for new in reversed(made):
                os.mkdir(new)
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
                return f"{{{name}}} {getattr(s, name)}: {folder} is not a writable folder"
        except OSError as exc:
            return f"{{{name}}} {getattr(s, name)}: cannot make {folder}: {exc.strerror}"
        finally:
            for new in made:
                if os.path.isdir(new):
                    os.rmdir(new)
    return None


def _dynamic(s: RunSpec) -> str | None:
    """Dynamic trees need a program written for them, and it needs their plan."""
    if (s.placement == "dynamic") != bool(getattr(program_of(s), "dynamic", False)):
        return (f"{{placement}} {s.placement} and {{program}} {s.program} do not go together: dynamic trees need a "
                "program written for them (dynamic_tree), and it needs {placement} dynamic")
    if s.placement == "dynamic" and s.collective != "allreduce":
        return f"{{placement}} dynamic builds all-reduce trees: it does not run {{collective}} {s.collective}"
    return None


def gloo_applies(s: RunSpec) -> bool:
    """Whether gloo can run what ``s`` asks: sums of plain tensors for one job, on links without injected faults
    but loss on every link (innet's processes inject faults, which gloo's TCP would not see; the same loss rate the
    kernel gives on every link direction: innet.backends.mininet.network)."""
    return s.program == "sum_allreduce" and s.collective == "allreduce" and not (
        s.train or s.workload or s.topk or s.consistency or s.input_elements or s.jobs != 1
        or s.link_faults or s.faults != FaultSpec(loss=s.faults.loss))


def _gloo(s: RunSpec) -> str | None:
    """The gloo backend runs torch's own all-reduce: innet's schemes and what only they take are not its."""
    if "mode" in s.given():
        return f"{{backend}} gloo runs torch.distributed's own all-reduce: it takes no {{mode}} (got {s.mode})"
    if s.timeline:
        return "{timeline} draws innet's calls and switch slots: {backend} gloo runs torch's own, which it cannot see"
    if not gloo_applies(s):
        return ("{backend} gloo sums plain tensors ({elements}, {iterations}) for one job: it takes no {program} and "
                "none of {train}, {workload}, {topk}, {consistency}, {input_elements}, {jobs}, nor link faults but "
                "{loss} on every link ({dup}, {reorder}, {delay}, {fault})")
    return None


def _meaningless(s: RunSpec) -> str | None:
    """Options given where they change nothing of what runs: refused, so a run is never taken to be what it is not."""
    given = s.given()
    scheme = "{backend} gloo" if s.backend == "gloo" else f"{{mode}} {s.mode}"
    if "placement" in given and (s.mode in ("pbox", "ring") or s.backend == "gloo"):
        return f"{{placement}} picks the switches that aggregate: it means nothing with {scheme}"
    if "job_slots" in given and (s.mode in ("pbox", "ring") or s.backend == "gloo"):
        return f"{{job_slots}} asks the switches' slot pools for room: it means nothing with {scheme}"
    if "pbox_cores" in given and (s.mode == "ring" or s.backend == "gloo"):
        return f"{{pbox_cores}} shards the PBox: it means nothing with {scheme}, which uses none"
    if s.pbox_layout != "central" and (s.mode not in ("pbox", "all") or s.topk or s.consistency or s.jobs > 1
                                       or s.collective != "allreduce" or s.workload or s.train):
        return (f"{{pbox_layout}} {s.pbox_layout} spreads one all-reduce job's keys over several PBoxes: it needs "
                "{mode} pbox, one job, {collective} allreduce, and none of {topk}, {consistency}, {workload}, {train}")
    if s.stragglers and not s.consistency:
        return "{stragglers} slows a worker's compute under {consistency}: it needs {consistency} bsp, ssp or asp"
    if "compute_time" in given and not (s.consistency or s.train):
        return "{compute_time} is the compute of a {consistency} or {train} run's iteration: it needs one of them"
    return None


def _aggregates(s: RunSpec) -> str | None:
    """In-network aggregation needs a program that aggregates: one that keeps no slot pool would see no gradient,
    every job quietly summed at the PBox instead. Refused rather than reported as an in-network run."""
    program = program_of(s)
    if s.mode in ("innet", "all") and s.placement != "pbox" and not program.slots:
        runs = "{mode} innet" if s.mode == "innet" else "{mode} all's in-network run"
        return (f"{{program}} {s.program} keeps no slot pool, so it cannot aggregate: {runs} would have every job "
                "summed at the PBox instead; use a program that aggregates (a Reduction, e.g. sum_allreduce), "
                "{placement} pbox to say so, or {mode} pbox or ring")
    return None


_RULES: tuple[Callable[[RunSpec], str | None], ...] = (_ranges, _where, _collective, _workload, _backend, _outputs,
                                                       _dynamic, _meaningless, _aggregates)


def _check_graph(s: RunSpec, graph: nx.Graph) -> None:
    """The rules that need the topology."""
    for host, _ in s.crash:
        if host not in graph or graph.nodes[host].get("role") != "host":
            raise UserError(f"{{crash}} names {host!r}, which is not a host of this topology")
    if s.background.link and not graph.has_edge(*s.background.link.split("--")[:2]):
        raise UserError(f"{{background}} names link {s.background.link}, which this topology does not have")
    for host, _, _ in s.stragglers:
        if host not in graph or graph.nodes[host].get("role") != "host":
            raise UserError(f"{{stragglers}} names {host!r}, which is not a host of this topology")
    for link, _ in s.link_faults:
        ends = link.split("->") if "->" in link else link.split("--")
        if not graph.has_edge(*ends):
            raise UserError(f"{{link_faults}} names link {link}, which this topology does not have")
    size = (s.workers or sum(1 for _, role in graph.nodes(data="role") if role == "host")) // max(1, s.jobs)
    if s.collective_of.rooted and s.root >= size:
        raise UserError(f"{{root}} {s.root} is not a rank of every job: ranks are 0..{size - 1}")
    if s.backend == "gloo" and host_link_rate(graph) > TCLINK_MAX_MBPS:
        raise UserError(f"{{backend}} gloo runs on undilated links, which TCLink shapes up to {TCLINK_MAX_MBPS:g} Mbit/s; "
                        f"this topology's hosts have {host_link_rate(graph):g} Mbit/s links")
