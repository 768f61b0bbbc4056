"""How a node process asks the scheduler to wake it on time: a real-time policy and a one-nanosecond timer slack.

On Mininet every frame on a call's critical path waits for some process to be woken (docs/performance.md,
"Where the faithful rate is lost"): 1-3.5 ms a wake-up on a quiet machine, whatever the rate. A process under
``SCHED_FIFO`` runs as soon as it is runnable, ahead of every ordinary process; innet's node processes block in
poll() nearly all the time (the switch uses at most a seventh of a core), so that costs the machine's other
work little. Two guards keep it from costing more: ``RLIMIT_RTTIME`` sends SIGXCPU to a process that runs
``RT_BUDGET_US`` of CPU without blocking once, and the handler puts it back under the ordinary policy (a host
training a model, or a loop that spins, goes on at everyone's priority; SIGKILL comes only 5 s of CPU later), and
the kernel's RT throttling (``sched_rt_runtime_us``) stays as it is. Without the privilege (not root), or where
the kernel refuses, the process keeps the ordinary policy: nothing else changes.

A process whose part is over goes back under the ordinary policy before it ends (``prioritized``): the
interpreter's teardown costs 100-130 ms of CPU here, and three workers tearing down at the real-time priority of a
worker still in its call held both cores from it. A reduce's root, or a reduce-scatter's last rank, gets its last
results a frame after the others end: it saw them ~90 ms late (star of 4 at 10 Mbit/s, dilation 2: 0.449 s where
its links allow 0.395).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager

PRIORITY = 10  # SCHED_FIFO's 1-99: above every ordinary process, below the kernel's own real-time threads (50+)
RT_BUDGET_US = 500_000  # CPU time a node process may run at real-time priority without blocking
PR_SET_TIMERSLACK = 29  # prctl(2)


def ordinary(*_: object) -> None:
    """Back to the ordinary policy (a signal handler too: the process ran its real-time budget without blocking)."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


def asked() -> str:
    """The policy node processes ask for: $INNET_SCHED, else "fifo"."""
    return os.environ.get("INNET_SCHED") or "fifo"


def prioritize(policy: str | None = None) -> str:
    """Ask for ``SCHED_FIFO`` at ``PRIORITY`` (guarded as the module says) and a 1 ns timer slack; ``policy``
    (default: $INNET_SCHED, else "fifo") may be "fifo", "rr", "slack" (the timer slack alone) or "off". What
    was granted: the policy's name, "slack" or "off"."""
    policy = policy or asked()
    if policy == "off":
        return "off"
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if policy == "slack":
        return "slack"
    try:
        signal.signal(signal.SIGXCPU, ordinary)
        resource.setrlimit(resource.RLIMIT_RTTIME, (RT_BUDGET_US, RT_BUDGET_US + 5_000_000))
        os.sched_setscheduler(0, os.SCHED_RR if policy == "rr" else os.SCHED_FIFO, os.sched_param(PRIORITY))
    except (OSError, ValueError):
        return "slack"
    return policy


POLICIES = {os.SCHED_OTHER: "other", os.SCHED_FIFO: "fifo", os.SCHED_RR: "rr", os.SCHED_BATCH: "batch",
            os.SCHED_IDLE: "idle"}


def granted(pid: int) -> str | None:
    """What process ``pid`` runs under now, in ``prioritize``'s words: "fifo" or "rr", "slack" (the ordinary policy
    with the 1 ns timer slack), "other" (neither: refused, ``INNET_SCHED=off``, or put back by SIGXCPU after its
    real-time budget; the slack stays then) or None once it is gone."""
    try:
        policy = POLICIES.get(os.sched_getscheduler(pid), "other")
    except OSError:
        return None
    if policy != "other":
        return policy
    try:
        with open(f"/proc/{pid}/timerslack_ns", encoding="ascii") as fh:
            return "slack" if int(fh.read()) == 1 else "other"
    except (OSError, ValueError):
        return "other"


@contextmanager
def prioritized(policy: str | None = None) -> Iterator[str]:
    """``prioritize(policy)`` for the block (what was granted), and the ordinary policy again as it ends, however
    it ends: what the process does after its part (its teardown) never runs ahead of a node still in its own."""
    try:
        yield prioritize(policy)
    finally:
        ordinary()
