"""What a Mininet run cost the machine: CPU time per process (``/proc/<pid>/stat``), the time it waited
for a CPU (``/proc/<pid>/schedstat``) and frames dropped
per interface (``tc -s qdisc``: queue overflows at the shapers; ``ip -s link``: the interfaces' own rx/tx
drops). innet.results.fidelity turns the differences over a run into its fidelity verdict."""

from __future__ import annotations

import json
import os
import resource
from typing import Any

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


def process_wait_s(pid: int) -> float | None:
    """Seconds process ``pid`` has spent runnable but waiting for a CPU (``/proc/<pid>/schedstat``'s run
    queue delay; None once it is gone): what it would have run, had a core been free."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def process_times(pid: int) -> tuple[float, float] | None:
    """(CPU seconds, run-queue wait seconds) of ``pid``, or None once it is gone."""
    cpu, wait = process_cpu_s(pid), process_wait_s(pid)
    return None if cpu is None else (cpu, wait or 0.0)


def has_exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it (its /proc/<pid>/stat stays readable)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def queue_drops(node: Any) -> dict[str, int]:
    """Frames each interface of Mininet node ``node`` dropped at its root queue (the shaper's, children's
    overflows included), read inside its namespace."""
    try:
        qdiscs = json.loads(node.cmd("tc -s -j qdisc show"))
    except ValueError:
        return {}
    return {q["dev"]: int(q.get("drops", 0)) for q in qdiscs if q.get("root") and q.get("dev", "lo") != "lo"}


def interface_drops(node: Any) -> dict[str, int]:
    """Frames each interface of ``node`` dropped itself (rx and tx ``dropped``)."""
    try:
        links = json.loads(node.cmd("ip -s -j link show"))
    except ValueError:
        return {}
    return {d["ifname"]: int(d["stats64"]["rx"]["dropped"]) + int(d["stats64"]["tx"]["dropped"])
            for d in links if "stats64" in d and d["ifname"] != "lo"}


def drops_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}
