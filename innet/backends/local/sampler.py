"""Samples every link direction's bytes in virtual time, for link utilisation over time."""

from __future__ import annotations

from innet.backends.local.fabric import Fabric, LinkDirection
from innet.results.utilisation import Utilisation

MAX_SAMPLES = 256


class LinkSampler:
    """A daemon endpoint that snapshots the fabric's link counters every ``interval`` (virtual) seconds; past
    ``MAX_SAMPLES`` it keeps every other snapshot and samples half as often, so a long run stays bounded."""

    daemon = True
    done = False

    def __init__(self, fabric: Fabric, interval: float = 1e-5) -> None:
        self.fabric, self.interval = fabric, interval
        self.keys = sorted(fabric.links)
        self.times: list[float] = []
        self.job: list[tuple[int, ...]] = []
        self.bg: list[tuple[int, ...]] = []
        self.carried: list[tuple[int, ...]] = []
        self._next = 0.0

    def snapshot(self, now: float) -> None:
        links = [self.fabric.links[k] for k in self.keys]
        self.times.append(now)
        self.job.append(tuple(link.bytes - link.background_bytes for link in links))
        self.bg.append(tuple(link.background_bytes for link in links))
        self.carried.append(tuple(link.bytes - _queued(link, now) for link in links))
        if len(self.times) > MAX_SAMPLES:
            self.times, self.job, self.bg, self.carried = self.times[::2], self.job[::2], self.bg[::2], self.carried[::2]
            self.interval *= 2

    def start(self, now: float) -> list[bytes]:
        return self.on_timeout(now)

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        return []

    def next_deadline(self) -> float | None:
        return self._next

    def on_timeout(self, now: float) -> list[bytes]:
        self.snapshot(now)
        self._next = now + self.interval
        return []

    def utilisation(self) -> Utilisation:
        """The samples taken while the jobs ran (none after: the fabric drains the wires once they are done)."""
        return Utilisation(tuple(f"{a}->{b}" for a, b in self.keys),
                           tuple(self.fabric.links[k].bps for k in self.keys), tuple(self.times),
                           tuple(self.job), tuple(self.bg), tuple(self.carried))


def _queued(link: LinkDirection, now: float) -> int:
    """Bytes counted on ``link`` that have not left it by ``now``: waiting in its queues or being serialised."""
    return int(max(0.0, link.free_at - now) * link.bps / 8) + sum(len(f) for q in link.queues for f in q)
