"""What a Mininet run cost the machine: CPU time per process and the time it waited for a CPU
(``/proc/<pid>/task/*/schedstat``) and frames dropped
per interface (``tc -s qdisc``: queue overflows at the shapers; ``ip -s link``: the interfaces' own rx/tx
drops). innet.results.fidelity turns the differences over a run into its fidelity verdict."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds process ``pid`` has used (None once it is gone). A process that has
    exited but not been reaped still shows its times, so read before ``wait``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14 and 15 of stat(5)


def own_cpu_s() -> float:
    """This process's user plus system CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_times(pid: int) -> tuple[float, float] | None:
    """(CPU seconds, run-queue wait seconds) of ``pid``, or None once it is gone: its threads' ``schedstat``
    (``/proc/<pid>/task/*/schedstat``: nanoseconds on a CPU, and runnable but waiting for one), where the
    kernel keeps them; else its CPU from ``stat`` (whole clock ticks: 10 ms, all a short call's window may
    hold) and no wait. A thread's times leave with it (a process's at exit read its last thread's alone): node
    processes run one thread (innet.backends.mininet.network.NODE_ENV)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    cpu = wait = read = 0
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                ran, waited = fh.read().split()[:2]
        except FileNotFoundError:  # a thread that just ended
            continue
        except (OSError, ValueError):  # no schedstat in this kernel
            stat = process_cpu_s(pid)
            return None if stat is None else (stat, 0.0)
        cpu, wait, read = cpu + int(ran), wait + int(waited), read + 1
    return (cpu / 1e9, wait / 1e9) if read else None


def has_exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it (its /proc/<pid>/stat stays readable)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot (/proc/stat): busy includes the kernel's
    softirq work (veth delivery, the shapers), which no process's CPU time fully shows."""
    with open("/proc/stat", encoding="ascii") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle and iowait are not busy


@dataclass
class Sample:
    """One reading: when (time.monotonic()), the machine's ticks, and each process's (CPU s, wait s)."""

    at: float
    ticks: tuple[int, int]
    times: dict[str, tuple[float, float] | None]


class Samples:
    """Readings of the machine and of a run's processes, taken while the run goes on, so that their shares
    of a core are taken over the all-reduce itself (its first call's start to its last call's end) rather
    than over the whole wait, which also holds the workers' tensor generation and the writing of their
    results: at 30 M values a worker, those take twice as long as the all-reduce."""

    def __init__(self, read: Callable[[], dict[str, tuple[float, float] | None]], interval: float) -> None:
        self.read, self.interval = read, interval
        self.taken: list[Sample] = []
        self.take()

    def take(self) -> None:
        self.taken.append(Sample(time.monotonic(), machine_ticks(), self.read()))

    def due(self) -> None:
        """Take a reading if the last one is ``interval`` old."""
        if time.monotonic() - self.taken[-1].at >= self.interval:
            self.take()

    def span(self, start: float, end: float) -> tuple[Sample, Sample]:
        """The readings around [start, end]: the last taken by ``start``, the first taken at or after
        ``end`` (the first and last readings where there are none)."""
        first = max((s for s in self.taken if s.at <= start), key=lambda s: s.at, default=self.taken[0])
        last = min((s for s in self.taken if s.at >= end), key=lambda s: s.at, default=self.taken[-1])
        return first, last

    def shares(self, start: float, end: float, cores: int) -> tuple[float, dict[str, float], dict[str, float], float]:
        """Over the readings around [start, end]: (their seconds apart, each process's share of a core
        used, and waiting for one, the cores the machine kept busy)."""
        first, last = self.span(start, end)
        seconds = last.at - first.at
        cpu, wait = {}, {}
        for name, before in first.times.items():
            after = last.times.get(name)
            if before is not None and after is not None and seconds > 0:
                cpu[name], wait[name] = (after[0] - before[0]) / seconds, (after[1] - before[1]) / seconds
        busy = (last.ticks[0] - first.ticks[0]) / max(1, last.ticks[1] - first.ticks[1]) * cores
        return seconds, cpu, wait, busy


def queue_drops(qdiscs: str) -> dict[str, int]:
    """Frames each interface dropped at its root queue (the shaper's, children's overflows included), from a node's
    ``tc -s -j qdisc show`` read inside its namespace."""
    try:
        shown = json.loads(qdiscs)
    except ValueError:
        return {}
    return {q["dev"]: int(q.get("drops", 0)) for q in shown if q.get("root") and q.get("dev", "lo") != "lo"}


def interface_drops(links: str) -> dict[str, int]:
    """Frames each interface dropped itself (rx and tx ``dropped``), from a node's ``ip -s -j link show``."""
    try:
        shown = json.loads(links)
    except ValueError:
        return {}
    return {d["ifname"]: int(d["stats64"]["rx"]["dropped"]) + int(d["stats64"]["tx"]["dropped"])
            for d in shown if "stats64" in d and d["ifname"] != "lo"}


def drops_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}
