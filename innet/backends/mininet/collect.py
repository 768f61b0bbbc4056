"""Waiting for a run's processes, and reading what they left: each worker's result file, the input
stream's, the switches' stats, and the run record built from them.

Every time a worker wrote is on its host's monotonic clock (on one machine, the clock every namespace
shares); a dilated run's are put back on the requested timeline (innet.planning.timing.dilation.virtual).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from dataclasses import replace

import networkx as nx
import numpy as np

from innet.backends.mininet.network import log
from innet.errors import UserError
from innet.events import Progress
from innet.hosts.ensemble import InputOutcome, InputPlan, InputSummary, input_summary
from innet.hosts.job import JobSpec
from innet.node.codec import from_json, read
from innet.node.config import InputServerStats, SwitchStats
from innet.node.usage import Samples, has_exited, process_times
from innet.planning.spec import RunSpec
from innet.planning.timing.dilation import virtual
from innet.results.check import tally_drops
from innet.results.outcome import WorkerOutcome

Procs = dict[str, subprocess.Popen[bytes]]


class Watch:
    """The run's processes' CPU times, kept for each one as it exits (before it is reaped)."""

    def __init__(self) -> None:
        self.at_exit: dict[int, tuple[float, float] | None] = {}

    def ended(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` has ended, its CPU times read before it is reaped."""
        if proc.returncode is None and has_exited(proc.pid):
            self.at_exit[proc.pid] = process_times(proc.pid)
        return proc.poll() is not None

    def times(self, proc: subprocess.Popen[bytes]) -> tuple[float, float] | None:
        """``proc``'s (CPU s, run-queue wait s) so far; a process that has exited, until it exited."""
        return self.at_exit.get(proc.pid) if proc.returncode is not None else process_times(proc.pid)

    def wait(self, procs: Procs, run: RunSpec, started: float, crash: dict[str, float], samples: Samples,
             run_dir: str = "") -> None:
        """Wait for ``procs`` to end (a ring rank ends its own linger: innet.hosts.ring.linger.Linger), crashing the
        workers ``crash`` names on time, reading ``samples`` as they fall due; the progress line also says what
        the first workers still running wait for (their ``run_dir/HOST.npz.status``)."""
        limit = started + 30 + run.timeout * (len(run.call_sizes()) + 1)
        progress = Progress("innet")
        crash = dict(crash)
        while not all(self.ended(p) for p in procs.values()):
            now = time.monotonic()
            for host, at in list(crash.items()):
                if now - started >= at:
                    log(f"crashing worker {host} (SIGKILL) {at:g}s into the run")
                    procs[host].kill()
                    del crash[host]
            if now > limit:
                raise UserError(f"workers did not finish within {limit - started:.0f}s; see {{timeout}}")
            progress.update(lambda: f"{sum(p.poll() is not None for p in procs.values())}/{len(procs)} worker processes "
                                    f"finished{statuses(run_dir, [h for h, p in procs.items() if p.poll() is None])}")
            samples.due()
            time.sleep(0.01)
        for host in procs if run_dir else ():
            with contextlib.suppress(OSError):
                os.remove(os.path.join(run_dir, f"{host}.npz.status"))


def statuses(run_dir: str, hosts: list[str], most: int = 2) -> str:
    """``"; "`` and what the first ``most`` of ``hosts`` last wrote they wait for (innet.node.client.report)."""
    said = []
    for host in hosts:
        try:
            with open(os.path.join(run_dir, f"{host}.npz.status")) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text:
            said.append(f"{host}: {text}")
    return "".join(f"; {text}" for text in said[:most]) if run_dir else ""


def calls_window(run_dir: str, hosts: list[str]) -> tuple[float, float] | None:
    """From the workers' result files: the first call's start and the last one's end, on this machine's
    monotonic clock (None where a result lacks them)."""
    starts: list[float] = []
    ends: list[float] = []
    for w in hosts:
        path = os.path.join(run_dir, f"{w}.npz")
        if not os.path.exists(path):
            return None
        data = np.load(path)
        starts.extend(t for t in data["started"].tolist() if np.isfinite(t))  # a call never started: NaN
        ends.extend(t for t in data["finished"].tolist() if np.isfinite(t))
    return (min(starts), max(ends)) if starts and ends else None


def outcome(run_dir: str, host: str, spec: JobSpec, dilation: float) -> WorkerOutcome:
    """What a worker host saved (innet.node.worker.WorkerNode.save)."""
    path = os.path.join(run_dir, f"{host}.npz")
    if not os.path.exists(path):
        return WorkerOutcome(spec.job, spec.rank, [], [], [], [], 0, f"worker {host} (rank {spec.rank}) wrote no result")
    data = np.load(path)
    cuts = np.cumsum(data["sizes"])[:-1]
    ints = np.split(data["ints"], cuts) if len(data["sizes"]) else []
    floats = np.split(data["floats"], cuts) if len(data["sizes"]) else []
    if str(data["user_error"]):  # the worker's input was bad (a diverging learning rate): one line, as locally
        raise UserError(str(data["user_error"]))
    f = dilation  # the worker's clock ran f times slow: its instants back on the requested timeline
    return WorkerOutcome(spec.job, spec.rank, ints, floats, virtual(list(data["started"]), f),
                         virtual(list(data["finished"]), f), int(data["retransmissions"]), str(data["error"]),
                         virtual(list(data["compute_starts"]), f),
                         [int(s) for s in data["staleness"]], int(data["scale"]), list(data["inputs"]),
                         [(float(a), float(loss)) for a, loss in data["history"]],
                         int(data["spurious"]) if "spurious" in data else 0,
                         int(data["host_queued"]) if "host_queued" in data else 0)


def input_record(graph: nx.Graph, run_dir: str, plan: InputPlan, stats: dict[str, SwitchStats],
                 dilation: float) -> InputSummary:
    """The ensemble's input stream: what every reader wrote, and the bytes the server and switches sent."""
    readers = []
    for r in plan.receivers:
        path = os.path.join(run_dir, f"{r.host}-input.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                reader = from_json(InputOutcome, json.load(fh))
            readers.append(replace(reader, completion_s=reader.completion_s / dilation))  # the requested timeline
    sent = read(InputServerStats, os.path.join(run_dir, "input-server.json")).sent_bytes
    switch_bytes = sum(st.counters.get("input_bytes", 0) for st in stats.values())
    return input_summary(graph, plan, readers, sent + switch_bytes)


def switch_drops(stats: dict[str, SwitchStats]) -> dict[str, int]:
    """Frames the switches dropped, by reason: their programs' and runtimes', their fault injectors' (lost on
    a link) and their sockets'."""
    return tally_drops((st.counters for st in stats.values()), {
        "link:lost": sum(st.lost for st in stats.values()),
        "socket": sum(sum(st.socket_drops.values()) for st in stats.values()),
    })
