"""The worker process: one worker host, or a node group of them (innet.planning.grouping), served by one poll loop.

``python -m innet.node worker CONFIG`` runs one worker's all-reduce calls on its host's interface;
``python -m innet.node workers CONFIG`` runs every worker its config lists, each worker's raw port
opened inside its host's namespace (innet.io.netns). Either way the process says "ready", waits for
"go", and writes what every worker got back to its .npz file, with the CPU seconds spent on it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

import numpy as np

from innet.errors import UserError
from innet.hosts.endpoints import endpoint_of
from innet.hosts.job import worker_tensors
from innet.hosts.learning.learner import Learner
from innet.hosts.ring.linger import Linger
from innet.hosts.ssp import SSPWorker
from innet.hosts.worker.process import WorkerProcess
from innet.io.netns import opened_in
from innet.node.client import AllreduceClient
from innet.node.codec import say_ready
from innet.node.config import WorkerConfig, WorkerGroup
from innet.node.egress import expire, feed, readable
from innet.results.outcome import WorkerOutcome, outcome_of, training_outcome


class WorkerNode:
    """One worker host's endpoint (its all-reduce calls following the training schedule, if any, or its training
    loop against the PBox), its port, and where it is: running, lingering (a ring rank answering its
    predecessor until its DONE: innet.hosts.ring.linger.Linger), or finished."""

    def __init__(self, conf: WorkerConfig) -> None:
        self.conf = conf
        spec = conf.spec
        learner = Learner(conf.task, spec.rank, conf.topk) if conf.task is not None else None
        tensors: Sequence[np.ndarray] = learner if learner is not None else worker_tensors(
            conf.seed, spec.job, spec.rank, conf.sizes, conf.topk, conf.layers, spec.operator.rule == "bits")
        ssp = (conf.ssp, list(conf.compute)) if conf.ssp is not None else None
        endpoint = endpoint_of(spec, tensors, conf.mode, list(conf.ring), conf.training, ssp)
        if learner is None and isinstance(endpoint, WorkerProcess):
            endpoint.prepare()  # before "go": the calls' buffers in memory, as a training loop's are
            endpoint.rehearse()  # and their code warm
        self.client = AllreduceClient(spec, conf.port, conf.mode, list(conf.ring), conf.faults, conf.training,
                                      endpoint=endpoint)
        self.client.status = conf.result + ".status"  # innet.backends.mininet.collect reads it for the progress line
        self.user_error = ""  # a learner's (training diverged): the controller says it as one line, naming the flag
        self.state = "running"
        self.linger: Linger | None = None
        self.status: int | None = None  # once its result is saved

    @property
    def ok(self) -> bool:
        return self.client.proc.error is None and not self.user_error

    def fail(self, exc: UserError) -> None:
        self.user_error = str(exc.args[0]) if exc.args else ""
        self.state = "finished"
        self.status = self.save()

    def next_wake(self) -> float | None:
        due = [t for t in (self.client.proc.next_deadline(), self.client.egress.next_due()) if t is not None]
        if self.linger is not None:
            due += [self.linger.end, self.linger.due()]
        return min(due) if due else None

    def feed(self, now: float) -> None:
        client = self.client
        feed(client.port, client.proc, client.egress, now)

    def step(self, now: float) -> None:
        """Timers that are due, frames whose delay is over; then on to lingering, or finished."""
        client = self.client
        expire(client.proc, client.egress, now)
        client.report(now)
        if self.state == "running" and client.proc.done:
            self.status = self.save()
            self.state = "lingering" if self.ok else "finished"
            last = client.proc.current if isinstance(client.proc, WorkerProcess) else None
            self.linger = Linger(last, now, self.conf.linger_limit)
        if self.state == "lingering" and self.linger is not None:
            client.egress.send_all(0, self.linger.repeat(now), now)
            if self.linger.over(now):
                self.state = "finished"

    def save(self) -> int:
        """Write what came back to the worker's result file, whole or not at all (the controller reads it once
        the process has ended); the worker's exit status (0, or 3 when it failed)."""
        spec, proc = self.client.proc.spec, self.client.proc
        if self.user_error:
            outcome = WorkerOutcome(spec.job, spec.rank, [], [], [], [], 0, self.user_error)
        else:
            outcome = training_outcome(proc) if isinstance(proc, SSPWorker) else outcome_of(proc)
        partial = self.conf.result + ".part"
        with open(partial, "wb") as fh:
            np.savez(
                fh,
                ints=np.concatenate([np.zeros(0, np.int64), *outcome.ints]),  # calls differ in size
                floats=np.concatenate([np.zeros(0, np.float32), *outcome.floats]),
                sizes=np.array([len(x) for x in outcome.ints], dtype=np.int64),
                started=np.array(outcome.started, dtype=float),
                finished=np.array(outcome.finished, dtype=float),
                retransmissions=np.array(outcome.retransmissions),
                spurious=np.array(outcome.spurious),
                host_queued=np.array(outcome.host_queued),
                error=np.array(outcome.error),
                spec=np.array(json.dumps(asdict(spec))),
                compute_starts=np.array(outcome.compute_starts, dtype=float),
                staleness=np.array(outcome.staleness, dtype=np.int64),
                scale=np.array(outcome.scale),
                inputs=np.array(outcome.inputs) if outcome.inputs else np.zeros((0, 0), np.float32),
                history=np.array(outcome.history, dtype=float).reshape(-1, 2),
                user_error=np.array(self.user_error),
            )
        os.replace(partial, self.conf.result)
        return 0 if self.ok else 3


def wait_for_go() -> float | None:
    """Wait for the controller's "go AT" (AT: a time.monotonic() instant, the one clock every namespace
    shares), then until AT: every host starts at the same instant however late the scheduler woke it to
    read its line, so no start is skewed by how busy the machine is. AT (or the instant "go" came without
    one); None: the controller went away."""
    words = sys.stdin.readline().split()
    if not words or words[0] != "go":
        return None
    if len(words) > 1:
        at = float(words[1])
        time.sleep(max(0.0, at - time.monotonic()))
        return at
    return time.monotonic()


def _wait_for_go() -> float | None:
    say_ready()
    return wait_for_go()


def serve_worker(conf: WorkerConfig) -> int:
    """One worker host, in this process's namespace: on "go", its calls (a failed call ends them; its error is
    recorded in the result file), then a ring rank's linger."""
    node = WorkerNode(conf)
    go = _wait_for_go()
    if go is None:
        return 4
    try:
        node.client.run_endpoint(go)
    except UserError as exc:
        node.fail(exc)
    status = node.save()
    if node.ok:
        node.client.linger(conf.linger_limit)
    node.client.egress.drain()
    return status


def serve_workers(conf: WorkerGroup) -> int:
    """Every worker of ``conf.workers`` in this process, one poll() over their ports. Exit status: the
    worst of theirs."""
    nodes = opened_in(conf.workers, WorkerNode)
    go = _wait_for_go()
    if go is None:
        return 4
    owner = {node.client.port.fileno(): node for node in nodes}
    status = 0

    def served(node: WorkerNode, work: Callable[..., object]) -> None:
        try:
            work(time.monotonic())
        except UserError as exc:
            node.fail(exc)

    for node in nodes:  # each from the go instant, however late this process woke (one more reason in run_endpoint)
        served(node, lambda _, node=node: node.client.egress.send_all(0, node.client.proc.start(go), go))
    live = set(nodes)
    while live:
        for fd in readable([node.client.port.fileno() for node in live], *(node.next_wake() for node in live)):
            if owner[fd] in live:
                served(owner[fd], owner[fd].feed)
        for node in list(live):
            if node.state != "finished":
                served(node, node.step)
            if node.state == "finished" and node.client.egress.settle(time.monotonic()):  # what it said is sent
                live.discard(node)
                status = max(status, node.status if node.status is not None else node.save())
    return status
