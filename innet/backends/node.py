"""The processes innet runs inside Mininet's namespaces: a switch, or a worker.

``python -m innet.backends.node switch CONFIG`` serves one switch: it opens a raw port
per interface, listens on its control socket (a Unix socket in the run
directory) for ``install``, ``stats`` and ``stop``, and runs the switch
runtime on every frame, blocking in poll() when idle. ``python -m innet.backends.node
worker CONFIG`` runs one worker's all-reduce calls on the host's interface and
writes what it got back to an .npz file. Both inject the configured link
faults on the frames they send.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from innet.backends.client import AllreduceClient
from innet.backends.egress import Egress, serve_once, wait_ms
from innet.backends.rawport import RawPort
from innet.backends.serialize import config_from_json, spec_from_json
from innet.errors import UserError
from innet.hosts.ensemble import InputReceiver, InputServer, Receiver, plan_from_json
from innet.hosts.learner import Learner, bind_learner
from innet.hosts.model import Task
from innet.hosts.pbox import PBoxJob, PBoxServer
from innet.hosts.ssp import Consistency, SSPWorker
from innet.hosts.training import Training
from innet.hosts.worker import WorkerProcess
from innet.plan.spec import worker_tensors
from innet.results.check import WorkerOutcome, outcome_of, training_outcome
from innet.run.modes import worker_process
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchRuntime
from innet.wire.operators import Operator


def serve_switch(conf: dict[str, Any]) -> int:
    program = load_program(conf["program"], conf.get("pool_slots", 0), conf.get("packet_elements", 0),
                           conf.get("fan_in", 0))
    ports = {int(p): RawPort(name) for p, name in conf["ports"].items()}
    egress = Egress(ports, conf["faults"])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(conf["control"])
    listener.listen(1)
    poller = select.poll()
    by_fd = {port.fileno(): p for p, port in ports.items()}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    poller.register(listener.fileno(), select.POLLIN)
    runtime: SwitchRuntime | None = None
    control: socket.socket | None = None
    buffer = b""
    while True:
        timeout = wait_ms(runtime.next_timer() if runtime else None, egress.next_due())
        for fd, _ in poller.poll(timeout):
            if fd == listener.fileno():
                control, _ = listener.accept()
                poller.register(control.fileno(), select.POLLIN)
            elif control is not None and fd == control.fileno():
                data = control.recv(1 << 20)
                if not data:
                    return 0
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    reply, runtime, stop = _control(json.loads(line), runtime, program, ports, egress)
                    control.sendall(json.dumps(reply).encode() + b"\n")
                    if stop:
                        return 0
            else:
                port = by_fd[fd]
                frames, lengths = ports[port].recv_rows()
                if runtime is None or not len(lengths):
                    continue
                now = time.monotonic()
                for out_port, out in runtime.receive_rows(port, frames, lengths, now):
                    egress.send_all(out_port, [out], now)
        now = time.monotonic()
        if runtime is not None and (runtime.next_timer() or float("inf")) <= now:
            for out_port, out in runtime.run_timers(now):
                egress.send(out_port, out, now)
        egress.flush(now)


def _control(msg: dict[str, Any], runtime: SwitchRuntime | None, program: Any, ports: dict[int, RawPort],
             egress: Egress) -> tuple[dict[str, Any], SwitchRuntime | None, bool]:
    op = msg.get("op")
    if op == "install":
        try:
            runtime = SwitchRuntime(config_from_json(msg["config"]), program)
        except Exception as exc:  # noqa: BLE001 - reported to the controller as one line
            return {"ok": False, "error": str(exc)}, runtime, False
        for port, frame in runtime.start(time.monotonic()):
            egress.send(port, frame, time.monotonic())
        return {"ok": True, "memory_bytes": runtime.memory_bytes}, runtime, False
    if op == "stats":
        report: dict[str, Any] = runtime.report() if runtime else {}
        report.update(
            ok=True, cpu_s=_cpu_s(), lost=egress.lost(),
            socket_drops={ports[p].name: ports[p].drops() for p in ports},
            qdisc_waits={ports[p].name: ports[p].qdisc_waits for p in ports},
        )
        return report, runtime, False
    if op == "stop":
        return {"ok": True}, runtime, True
    return {"ok": False, "error": f"unknown op {op!r}"}, runtime, False


def serve_worker(conf: dict[str, Any]) -> int:
    """A worker host: wait for "go", then its all-reduce calls (following the training schedule, if any),
    or its training loop against the PBox (``ssp``); save what came back."""
    spec = spec_from_json(conf["spec"])
    t = conf["training"]
    training = Training(**{**t, **{k: tuple(t[k]) for k in ("backward", "layer", "order", "forward_layers")}}) if t else None
    learner = Learner(Task(**conf["task"]), spec.rank, conf["topk"]) if conf.get("task") else None
    tensors: Sequence[np.ndarray] = learner if learner is not None else worker_tensors(
        conf["seed"], spec.job, spec.rank, conf["sizes"], conf["topk"], conf["layers"], spec.operator.rule == "bits")
    endpoint: WorkerProcess | SSPWorker
    if conf["ssp"]:
        endpoint = SSPWorker(spec, tensors, conf["compute"], Consistency(**conf["ssp"]))
    else:
        endpoint = worker_process(conf["mode"], spec, conf["ring"], tensors, training)
    if learner is not None:
        bind_learner(endpoint, learner)
    client = AllreduceClient(spec, conf["port"], conf["mode"], conf["ring"], conf["faults"], training, endpoint=endpoint)
    print("ready", flush=True)
    if not wait_for_go():  # the controller went away before the start
        return 4
    cpu_at_go = _cpu_s()
    user_error = ""
    try:
        client.run_endpoint()  # a failed call ends the run; its error is recorded in the result file
    except UserError as exc:  # a learner's (training diverged): the controller says it as one line, naming the flag
        user_error = str(exc.args[0]) if exc.args else ""
    if client.proc.error is None and not user_error:
        client.linger(conf["linger"], conf["linger_limit"])
    if user_error:
        outcome = WorkerOutcome(spec.job, spec.rank, [], [], [], [], 0, user_error)
    else:
        outcome = training_outcome(client.proc) if isinstance(client.proc, SSPWorker) else outcome_of(client.proc)
    np.savez(
        conf["result"],
        ints=np.concatenate([np.zeros(0, np.int64), *outcome.ints]),  # calls differ in size
        floats=np.concatenate([np.zeros(0, np.float32), *outcome.floats]),
        sizes=np.array([len(x) for x in outcome.ints], dtype=np.int64),
        started=np.array(outcome.started, dtype=float),
        finished=np.array(outcome.finished, dtype=float),
        retransmissions=np.array(outcome.retransmissions),
        error=np.array(outcome.error),
        spec=np.array(json.dumps(asdict(spec))),
        cpu_s=np.array(_cpu_s() - cpu_at_go),
        compute_starts=np.array(outcome.compute_starts, dtype=float),
        staleness=np.array(outcome.staleness, dtype=np.int64),
        scale=np.array(outcome.scale),
        inputs=np.array(outcome.inputs) if outcome.inputs else np.zeros((0, 0), np.float32),
        history=np.array(outcome.history, dtype=float).reshape(-1, 2),
        user_error=np.array(user_error),
    )
    return 0 if client.proc.error is None and not user_error else 3


def wait_for_go() -> bool:
    """Wait for the controller's "go AT" (AT: a time.monotonic() instant, the one clock every namespace
    shares), then until AT: every host starts at the same instant however late the scheduler woke it to
    read its line, so no start is skewed by how busy the machine is. False: the controller went away."""
    words = sys.stdin.readline().split()
    if not words or words[0] != "go":
        return False
    if len(words) > 1:
        time.sleep(max(0.0, float(words[1]) - time.monotonic()))
    return True


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def serve_pbox(conf: dict[str, Any]) -> int:
    """One PBox shard: the keys with slot % cores == core, until stopped."""
    jobs = [PBoxJob(**{**j, "members": {int(r): n for r, n in j["members"].items()}, "operator": Operator(**j["operator"])})
            for j in conf["jobs"]]
    server = PBoxServer(conf["node"], jobs, conf["cores"], conf["core"])
    port = RawPort(conf["port"])
    if conf["cores"] > 1:
        port.keep_slots(conf["cores"], conf["core"])
    egress = Egress({0: port}, conf["faults"])
    poller = select.poll()
    poller.register(port.fileno(), select.POLLIN)
    print("ready", flush=True)
    while True:
        serve_once(poller, port, server, egress)


def _host_port(conf: dict[str, Any]) -> tuple[RawPort, Egress, select.poll]:
    port = RawPort(conf["port"])
    poller = select.poll()
    poller.register(port.fileno(), select.POLLIN)
    return port, Egress({0: port}, conf["faults"]), poller


def serve_input(conf: dict[str, Any]) -> int:
    """One worker host's input stream (innet.hosts.ensemble): on "go", take it until complete; save the outcome."""
    receiver = InputReceiver(plan_from_json(conf["plan"]), Receiver(**conf["reader"]))
    port, egress, poller = _host_port(conf)
    print("ready", flush=True)
    if not wait_for_go():
        return 4
    egress.send_all(0, receiver.start(time.monotonic()), time.monotonic())
    while not receiver.done:
        serve_once(poller, port, receiver, egress)
    with open(conf["result"], "w", encoding="utf-8") as fh:
        json.dump(receiver.outcome(), fh)
    return 0 if not receiver.error else 3


def serve_input_server(conf: dict[str, Any]) -> int:
    """The input server (innet.hosts.ensemble) on the PBox host: on "go", stream; answer NACKs until stopped,
    keeping the bytes it sent in its stats file."""
    server = InputServer(plan_from_json(conf["plan"]))
    port, egress, poller = _host_port(conf)
    print("ready", flush=True)
    if not wait_for_go():
        return 4
    egress.send_all(0, server.start(time.monotonic()), time.monotonic())
    sent = -1
    while True:
        if server.sent_bytes != sent:
            sent = server.sent_bytes
            with open(conf["stats"], "w", encoding="utf-8") as fh:
                json.dump({"sent_bytes": sent, "nacks": server.nacks, "resent": server.resent}, fh)
        serve_once(poller, port, server, egress)


def main(argv: list[str]) -> int:
    role, path = argv[1], argv[2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(path, encoding="utf-8") as fh:
        conf = json.load(fh)
    serve = {"switch": serve_switch, "worker": serve_worker, "pbox": serve_pbox, "input": serve_input,
             "input-server": serve_input_server}[role]
    profile = os.environ.get("INNET_PROFILE")  # a directory: write <role>-<pid>.prof there (cProfile)
    if not profile:
        return serve(conf)
    import cProfile

    prof = cProfile.Profile(time.process_time)  # CPU time: what a process costs, not when it was scheduled
    try:
        return prof.runcall(serve, conf)
    finally:
        prof.dump_stats(os.path.join(profile, f"{role}-{os.getpid()}.prof"))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
