"""Knowing what a run created, and removing exactly that.

Every Mininet run records what it creates (its namespace shells and processes
by pid and start time, its interfaces by name, its run directory) in a state
file under STATE_DIR before creating it. Teardown and ``run_topology.py
--clean`` remove only what such a record names: no killall, no pkill -f, no
global ``mn -c``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from innet.node.codec import from_json, to_json
from innet.results.files import make_private_folder, write_text_atomic

STATE_DIR = "/run/innet"
Process = tuple[int, int | None]  # a recorded process: its pid and its start time (innet.backends.mininet.cleanup.start_time)


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (None when it is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass
class Created:
    """What one run created, as its state file holds it: read by ``--clean`` in another process, maybe after
    the run was killed."""

    runner: Process  # the process that runs it: the run is live while it is
    parent: int
    argv: list[str]
    dir: str  # its run directory
    pids: dict[str, Process] = field(default_factory=dict)  # "label:pid" -> the process
    intfs: list[str] = field(default_factory=list)  # its interfaces in the root namespace (a veth's end is there first)
    htb_hysteresis: bool = False  # it relies on htb's hysteresis mode (innet.backends.mininet.shaper)


class RunState:
    """The record of one run; written to disk on every change."""

    def __init__(self, run_id: str, run_dir: str) -> None:
        make_private_folder(STATE_DIR)  # records carry argv: 0600 files in a 0700 folder of root's own
        self.path = os.path.join(STATE_DIR, f"{run_id}.json")
        self.data = Created((os.getpid(), start_time(os.getpid())), os.getppid(), sys.argv, run_dir)
        self.save()

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps(to_json(self.data)), mode=0o600)

    def add_pid(self, label: str, pid: int) -> None:
        self.data.pids[f"{label}:{pid}"] = (pid, start_time(pid))
        self.save()

    def add_intfs(self, names: list[str]) -> None:
        self.data.intfs.extend(names)
        self.save()

    def remove(self) -> None:
        for path in (self.path, self.data.dir):
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.unlink(path)


def _alive(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def kill_recorded(pids: dict[str, Process], grace: float = 1.0) -> int:
    """SIGTERM, then SIGKILL, every recorded process that is still the same process."""
    live = [(pid, st) for pid, st in pids.values() if _alive(pid, st)]
    for pid, _ in live:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in live):
        time.sleep(0.02)
    for pid, st in live:
        if _alive(pid, st):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0  # SIGKILL is delivered, not yet done, when kill() returns
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in live):
        time.sleep(0.01)
    return len(live)


def delete_intfs(names: list[str]) -> int:
    """Delete the named interfaces that still exist in this (the root) namespace."""
    removed = 0
    for name in names:
        if os.path.exists(f"/sys/class/net/{name}"):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
            removed += 1
    return removed


def records() -> list[tuple[str, Created, bool]]:
    """Every run's record: (path, record, whether its runner is still running). Unreadable records are removed."""
    if not os.path.isdir(STATE_DIR):
        return []
    out = []
    for entry in sorted(os.listdir(STATE_DIR)):
        if not entry.endswith(".json"):
            continue
        path = os.path.join(STATE_DIR, entry)
        try:
            with open(path, encoding="utf-8") as fh:
                data = from_json(Created, json.load(fh))
        except FileNotFoundError:  # its run ended between the listing and the read
            continue
        except (OSError, ValueError, TypeError, AttributeError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        runner, started = data.runner
        out.append((path, data, runner == os.getpid() or _alive(runner, started)))
    return out


def clean_leftovers() -> str:
    """Remove what interrupted innet runs left behind; leave running runs alone."""
    if not os.path.isdir(STATE_DIR):
        return "nothing to clean: no innet run has left a record"
    cleaned = procs = intfs = 0
    running = 0
    for path, data, live in records():
        if live and data.runner[0] != os.getpid():
            running += 1
            continue
        procs += kill_recorded(data.pids)
        intfs += delete_intfs(data.intfs)
        shutil.rmtree(data.dir, ignore_errors=True)
        os.unlink(path)
        cleaned += 1
    note = f"; left {running} run(s) that are still running" if running else ""
    return f"cleaned {cleaned} interrupted run(s): {procs} process(es), {intfs} interface(s){note}"
