"""The processes of ``innet launch``'s ranks, on this machine or in Mininet hosts: their environment, waiting for
them (the first to fail ends the run with its last words), stopping them, and the counts their groups wrote."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from innet.errors import UserError
from innet.integrations.launch.watch import WATCH_EVERY_S
from innet.integrations.torch.fabric import Tally
from innet.node import codec

SITE = "import innet.torch  # noqa: F401  (innet launch: the default backend of CPU tensors is innet)\n"
GRACE_S = 5.0  # for a rank to leave after SIGTERM before SIGKILL
Watch = Callable[[], "tuple[int, str] | None"]  # a rank that hangs, and how (innet.integrations.launch.watch)
_OUT = threading.Lock()  # one rank's line at a time onto the launcher's standard output


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_env(folder: str, rank: int, world: int, port: int, master: str = "127.0.0.1") -> dict[str, str]:
    """Rank ``rank``'s environment: torchrun's variables and innet's files; innet and ``folder`` (its
    sitecustomize) first on the path."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    path = os.pathsep.join(filter(None, [folder, root, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                GROUP_RANK=str(rank), MASTER_ADDR=master, MASTER_PORT=str(port), PYTHONPATH=path,
                INNET_RUN=os.path.join(folder, "run.json"), INNET_GRAPH=os.path.join(folder, "graph.json"),
                INNET_STATS=os.path.join(folder, "stats.jsonl"), OMP_NUM_THREADS="1")


def wait_ranks(procs: list[subprocess.Popen[bytes]], folder: str, watch: Watch | None = None) -> None:
    """Until every rank has exited, their output relayed (``relay``); the first to fail ends the run with its last
    words: the first to exit, not a rank that failed because it did (its peer's "Connection closed"). With
    ``watch`` (``watch.Store.hung``), a rank that hangs ends it too, named with its last words."""
    relays = [relay(p, r) for r, p in enumerate(procs) if p.stdout is not None]
    exits: list[int] = []  # the ranks in the order they exited (list.append is atomic)

    def reap(rank: int) -> None:
        procs[rank].wait()
        exits.append(rank)

    for r in range(len(procs)):
        threading.Thread(target=reap, args=(r,), name=f"innet-rank{r}-wait", daemon=True).start()
    looked = time.monotonic()
    while True:
        failed = [r for r in list(exits) if procs[r].returncode]
        if failed:
            rank = failed[0]
            raise UserError(f"rank {rank} failed (exit {procs[rank].returncode}): {last_words(folder, rank)}")
        if len(exits) == len(procs):
            break
        if watch is not None and time.monotonic() - looked > WATCH_EVERY_S:
            looked = time.monotonic()
            hung = watch()
            if hung:
                raise UserError(f"rank {hung[0]} {hung[1]}: {last_words(folder, hung[0])}")
        time.sleep(0.05)
    for thread in relays:  # the rest of their output (a child of a rank's may hold the pipe: not for long)
        thread.join(GRACE_S)


def relay(proc: subprocess.Popen[bytes], rank: int) -> threading.Thread:
    """A thread copying ``proc``'s standard output onto ours a whole line at a time, each prefixed "[rankR]: " (as
    torchrun's ``--tee`` does), so that no two ranks' lines interleave."""

    def copy() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            with _OUT:
                sys.stdout.flush()
                sys.stdout.buffer.write(f"[rank{rank}]: ".encode() + line + (b"" if line.endswith(b"\n") else b"\n"))
                sys.stdout.buffer.flush()

    thread = threading.Thread(target=copy, name=f"innet-rank{rank}-out", daemon=True)
    thread.start()
    return thread


def last_words(folder: str, rank: int) -> str:
    """The last line rank ``rank`` wrote to stderr that says something (not a traceback's frame)."""
    return last_line(os.path.join(folder, f"rank{rank}.err"))


def last_line(path: str) -> str:
    """The last line of the standard error kept in ``path`` that says something (not a traceback's frame)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip() and not ln.startswith((" ", "Traceback"))]
    except OSError:
        lines = []
    return lines[-1] if lines else "no message"


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """End every rank still running, and all it started: SIGTERM to its session, SIGKILL after a grace."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in alive:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL)
            p.wait()
    for p in procs:  # a rank's own children (torch's workers) go with its session
        _signal(p, signal.SIGKILL)


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def read_tally(path: str) -> Tally:
    """The sum of the tallies the groups' rank 0s wrote (none: nothing ran through innet)."""
    tally = Tally()
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                tally.add(codec.from_json(Tally, json.loads(line)))
    return tally
