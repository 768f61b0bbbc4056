"""``innet launch`` that cannot hang: the launcher holds the ranks' store, the ranks report to it, the launcher
names a rank that does not keep up.

The launcher makes torch's rendezvous store itself (``Store``): a ``TCPStore`` server on a socket it bound to
127.0.0.1 and keeps (the port is held from choice to use, and only this machine can reach it), and the ranks
reach it as torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE), as clients. Each rank says there when it has
joined its process group (``init_process_group`` returned) and, in the innet backend's world group, how many
collective calls it has entered and left (counted in the rank, published by a thread every ``PUBLISH_EVERY_S``
when they changed: a rank making thousands of small calls pays no store round trip for each). ``Store.hung``
reads that: a rank that has not joined within the start timeout,
or has not entered a call others entered (or, all in it, the call has not finished) within the collective
timeout, is named.

On Mininet the ranks live in the hosts' namespaces, which the launcher's loopback cannot reach, and no traffic may
leave the run's namespaces: the same ``Store`` is held by a small process of its own (``serve``, this module run
with ``python -m``) in rank 0's host, on that host's address, which watches as the launcher does here and writes
its verdict into the run's folder; the launcher reads it there
(innet.integrations.launch.mininet.Served).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from innet.node import codec

WATCH = "INNET_WATCH"  # set by the launcher in every rank's environment: report to its store
START_TIMEOUT_S = 120.0
COLLECTIVE_TIMEOUT_S = 300.0
PUBLISH_EVERY_S = 0.1
WATCH_EVERY_S = 0.5  # how often the launcher (or, on Mininet, ``serve``) looks for a rank that hangs
VERDICT = "watch.json"  # on Mininet: ``serve``'s verdict, in the run's folder
_client: list[Any] = []  # this rank's store client, once made
_counts = {"entered": 0, "left": 0}  # this rank's calls in the world's group (one rank per process)
_published: dict[str, int] = {}
_publisher: list[threading.Thread] = []
_lock = threading.Lock()


def _key(what: str, rank: int) -> str:
    return f"innet-watch/{what}/{rank}"


# -- in each rank ---------------------------------------------------------------------------------------------
def _store() -> Any:
    if not _client:
        import torch.distributed as dist

        _client.append(dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                     timeout=timedelta(seconds=30)))
    return _client[0]


def watched(size: int) -> bool:
    """Whether a group of ``size`` ranks reports its calls: under the launcher, the world's groups only (every
    rank takes part in them, in the same order)."""
    return bool(os.environ.get(WATCH)) and str(size) == os.environ.get("WORLD_SIZE")


def entered(rank: int) -> None:
    _count("entered", rank)


def left(rank: int) -> None:
    _count("left", rank)


def _count(what: str, rank: int) -> None:
    with _lock:
        _counts[what] += 1
        if not _publisher:
            _publisher.append(threading.Thread(target=_publish, args=(rank,), name="innet-watch", daemon=True))
            _publisher[0].start()


def _publish(rank: int) -> None:
    """Say this rank's counts in the store whenever they changed (until the process ends)."""
    while True:
        with _lock:
            now = dict(_counts)
        for what, n in now.items():
            if _published.get(what) != n:
                _store().set(_key(what, rank), str(n))
                _published[what] = n
        time.sleep(PUBLISH_EVERY_S)


def install() -> None:
    """Under the launcher: ``init_process_group`` says in the store when this rank has called it and when it has
    joined (returned; any backend)."""
    import torch.distributed as dist

    init: Callable[..., Any] = dist.init_process_group
    if getattr(init, "innet_watched", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        _store().set(_key("arrived", int(os.environ["RANK"])), "1")
        result = init(*args, **kwargs)
        _store().set(_key("joined", dist.get_rank()), "1")
        return result

    init_process_group.innet_watched = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


# -- in the launcher --------------------------------------------------------------------------------------------
def store_env(host: str, port: int) -> dict[str, str]:
    """What each rank's environment needs to use the store at ``host``:``port`` and report to it."""
    return {"MASTER_ADDR": host, "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True", WATCH: "1"}


class Store:
    """The ranks' rendezvous store, held by the launcher on 127.0.0.1 (``port`` for MASTER_PORT; on Mininet by
    ``serve``, on its host's address), and the watch over what the ranks report to it."""

    def __init__(self, world: int, start_timeout: float = START_TIMEOUT_S,
                 collective_timeout: float = COLLECTIVE_TIMEOUT_S, host: str = "127.0.0.1", port: int = 0) -> None:
        import torch.distributed as dist

        self.world, self.start_timeout, self.collective_timeout = world, start_timeout, collective_timeout
        self.host = host
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, port))
            sock.listen(max(64, 4 * world))
            self.port = int(sock.getsockname()[1])
            self.store = dist.TCPStore(host, self.port, None, True, timedelta(seconds=30),
                                       wait_for_workers=False, master_listen_fd=sock.detach())  # the store's now
        self.started = time.monotonic()
        self._lagging: dict[int, tuple[int, float]] = {}  # rank: (the call it has not entered, since when)
        self._unfinished: tuple[int, float] | None = None  # (the call every rank is in, since when)

    def env(self) -> dict[str, str]:
        """What each rank's environment needs to use this store."""
        return store_env(self.host, self.port)

    def close(self) -> None:
        """The server stops, its socket closed."""
        del self.store

    def _count(self, what: str, rank: int) -> int:
        key = _key(what, rank)
        return int(self.store.get(key)) if self.store.check([key]) else 0

    def hung(self, now: float | None = None) -> tuple[int, str] | None:
        """A rank that does not keep up, and how (None: all do)."""
        now = time.monotonic() if now is None else now
        ranks = range(self.world)
        joined = [self.store.check([_key("joined", r)]) for r in ranks]
        if not all(joined):
            if now - self.started <= self.start_timeout:
                return None
            arrived = [self.store.check([_key("arrived", r)]) for r in ranks]  # the others wait for one that has not
            late = arrived.index(False) if not all(arrived) else joined.index(False)
            return late, f"did not join the process group within {self.start_timeout:g} s (--start-timeout)"
        into = [self._count("entered", r) for r in ranks]
        out = [self._count("left", r) for r in ranks]
        top = max(into)
        for r in ranks:
            call, since = self._lagging.get(r, (top, now))
            if into[r] >= call:
                self._lagging.pop(r, None)
                continue
            self._lagging[r] = (call, since)
            if now - since > self.collective_timeout:
                return r, (f"did not enter collective call {call} within {self.collective_timeout:g} s of the "
                           "others (--collective-timeout)")
        if top and min(into) == top and min(out) < top:
            call, since = self._unfinished if self._unfinished and self._unfinished[0] == top else (top, now)
            self._unfinished = (call, since)
            if now - since > self.collective_timeout:
                return out.index(min(out)), (f"did not finish collective call {call} within "
                                             f"{self.collective_timeout:g} s (--collective-timeout)")
        return None


# -- on Mininet: the store and its watch in rank 0's host, the verdict in the run's folder ------------------------
@dataclass(frozen=True)
class WatchConf:
    """What ``serve`` holds and watches: a store for ``world`` ranks on ``host``:``port``, and the timeouts."""

    world: int
    start_timeout: float
    collective_timeout: float
    host: str
    port: int


@dataclass(frozen=True)
class Hang:
    """``serve``'s verdict: a rank that does not keep up, and how (``Store.hung``)."""

    rank: int
    how: str


def serve(conf_path: str) -> None:
    """Hold the store ``conf_path`` (a ``WatchConf``) describes, say "ready", and watch it: the first rank that does
    not keep up is written to ``VERDICT`` beside ``conf_path`` (whole: a temporary file renamed). The store then
    stays up, as the ranks still use it, until the launcher ends this process with the run."""
    conf = codec.read(WatchConf, conf_path)
    store = Store(conf.world, conf.start_timeout, conf.collective_timeout, conf.host, conf.port)
    codec.say_ready()
    while (hung := store.hung()) is None:
        time.sleep(WATCH_EVERY_S)
    path = os.path.join(os.path.dirname(conf_path), VERDICT)
    codec.write(path + ".part", Hang(*hung))
    os.replace(path + ".part", path)
    while True:
        signal.pause()


if __name__ == "__main__":
    serve(sys.argv[1])
