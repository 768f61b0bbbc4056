"""A host's background traffic inside its namespace: ``python -m innet.node.background CONFIG``.

The same ``BackgroundHost`` the fabric drives, on a raw port and the real clock, from the controller's "go" (the
workers' start instant, innet.node.worker.wait_for_go): its flows' frames paced at their rates, the background
frames addressed to it counted. It runs until SIGTERM, then writes what it did (``BackgroundStats``) to the
configured path.
"""

from __future__ import annotations

import select
import signal
import sys
import time
from dataclasses import dataclass

from innet.hosts.background import BackgroundHost, BackgroundStats, stats_of
from innet.io.rawport import RawPort
from innet.io.sched import prioritized
from innet.node.codec import read, say_ready, write
from innet.node.worker import wait_for_go


@dataclass(frozen=True)
class BackgroundConfig:
    """One host's background endpoint: its node index, its flows (destination node index, bits per second),
    its interface and where its stats go."""

    node: int
    flows: tuple[tuple[int, float], ...]
    ifname: str
    stats_path: str
    seed: int = 0


def serve_background(conf: BackgroundConfig) -> int:
    end = BackgroundHost(conf.node, list(conf.flows), conf.seed)
    port = RawPort(conf.ifname)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    poller = select.poll()
    poller.register(port.fileno(), select.POLLIN)
    say_ready()
    if wait_for_go() is None:  # with the workers, as the fabric starts it: not seconds early, its queues already full
        return 0
    start = time.monotonic()
    try:
        while not stop:
            now = time.monotonic() - start
            for frame in end.on_timeout(now):
                port.send(frame)
            due = end.next_deadline()
            wait = 50 if due is None else max(0, min(50, int((due - (time.monotonic() - start)) * 1000)))
            if poller.poll(wait):
                for frame in port.recv_batch():
                    end.receive(frame, time.monotonic() - start)
    finally:
        write(conf.stats_path, stats_of(end, time.monotonic() - start))
        port.close()
    return 0


def main(argv: list[str]) -> int:
    conf = read(BackgroundConfig, argv[0])
    with prioritized():  # as the switches that forward its frames: under the ordinary policy it starved beside them
        return serve_background(conf)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["BackgroundConfig", "BackgroundStats", "serve_background"]
