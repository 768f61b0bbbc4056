"""The processes innet runs inside Mininet's namespaces: ``python -m innet.node ROLE CONFIG``.

Roles: ``switch`` and ``switches`` (one switch, or a node group of them: innet.node.switch),
``worker`` and ``workers`` (likewise: innet.node.worker), ``pbox`` (one PBox shard), ``input`` and
``input-server`` (an ensemble's shared input stream). Every one injects the configured link faults on the
frames it sends.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from innet.hosts.ensemble import InputReceiver, InputServer
from innet.hosts.pbox import PBoxServer
from innet.io.rawport import RawPort
from innet.io.sched import prioritized
from innet.node.codec import read, say_ready, to_json, write
from innet.node.config import (
    InputConfig,
    InputServerConfig,
    InputServerStats,
    PBoxConfig,
    SwitchGroup,
    SwitchNodeConfig,
    WorkerConfig,
    WorkerGroup,
)
from innet.node.egress import Egress, serve_once
from innet.node.switch import serve_switch, serve_switches
from innet.node.worker import serve_worker, serve_workers, wait_for_go


def serve_pbox(conf: PBoxConfig) -> int:
    """One PBox shard: the keys with slot % cores == core, until stopped."""
    server = PBoxServer(conf.node, list(conf.jobs), conf.cores, conf.core)
    port = RawPort(conf.port)
    if conf.cores > 1:
        port.keep_slots(conf.cores, conf.core)
    egress = Egress({0: port}, conf.faults)
    say_ready()
    while True:
        serve_once(port, server, egress)


def _host_port(conf: InputConfig | InputServerConfig) -> tuple[RawPort, Egress]:
    port = RawPort(conf.port)
    return port, Egress({0: port}, conf.faults)


def serve_input(conf: InputConfig) -> int:
    """One worker host's input stream (innet.hosts.ensemble): on "go", take it until complete; save the outcome."""
    receiver = InputReceiver(conf.plan, conf.reader)
    port, egress = _host_port(conf)
    say_ready()
    if wait_for_go() is None:
        return 4
    egress.send_all(0, receiver.start(time.monotonic()), time.monotonic())
    while not receiver.done:
        serve_once(port, receiver, egress)
    with open(conf.result, "w", encoding="utf-8") as fh:
        json.dump(to_json(receiver.outcome()), fh)
    return 0 if not receiver.error else 3


def serve_input_server(conf: InputServerConfig) -> int:
    """The input server (innet.hosts.ensemble) on the PBox host: on "go", stream; answer NACKs until stopped,
    keeping the bytes it sent in its stats file."""
    server = InputServer(conf.plan)
    port, egress = _host_port(conf)
    say_ready()
    if wait_for_go() is None:
        return 4
    egress.send_all(0, server.start(time.monotonic()), time.monotonic())
    sent = -1
    while True:
        if server.sent_bytes != sent:
            sent = server.sent_bytes
            write(conf.stats, InputServerStats(sent, server.nacks, server.resent))
        serve_once(port, server, egress)


ROLES: dict[str, tuple[type, Callable[[Any], int]]] = {  # role -> its configuration's class, and what serves it
    "switch": (SwitchNodeConfig, serve_switch), "switches": (SwitchGroup, serve_switches),
    "worker": (WorkerConfig, serve_worker), "workers": (WorkerGroup, serve_workers), "pbox": (PBoxConfig, serve_pbox),
    "input": (InputConfig, serve_input), "input-server": (InputServerConfig, serve_input_server),
}


def main(argv: list[str]) -> int:
    role, path = argv[1], argv[2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    kind, serve = ROLES[role]
    conf: object = read(kind, path)
    with prioritized():  # its teardown at everyone's priority, once its part (or a SIGTERM) has ended it
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
