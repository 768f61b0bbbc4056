"""Opening a node's sockets inside its network namespace, from a process that serves several nodes.

A socket keeps the namespace it was created in: a process that moves into node A's namespace, opens A's
raw ports, moves into node B's, opens B's, then polls them all, serves both nodes' interfaces exactly as a
process started inside each would (innet.planning.grouping says when a run groups its nodes so). Unix sockets
bound to a path are the filesystem's, not a namespace's: a node's control socket works from anywhere.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

CLONE_NEWNET = 0x40000000  # <sched.h>
T = TypeVar("T")


class InNamespace(Protocol):
    @property
    def netns(self) -> str: ...  # the namespace's path; "": this process's own


C = TypeVar("C", bound=InNamespace)


def _setns(fd: int, what: str) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12 has it
    if setns is not None:
        setns(fd, CLONE_NEWNET)
    elif ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot enter the network namespace {what}: {os.strerror(err)}")


def enter_netns(path: str) -> None:
    """Move this thread into the network namespace at ``path`` (``/proc/<pid>/ns/net`` of a node's shell)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _setns(fd, path)
    finally:
        os.close(fd)


def opened_in(confs: Sequence[C], make: Callable[[C], T]) -> list[T]:
    """``make(conf)`` for every conf, each inside the namespace its ``netns`` names (where it names one);
    this thread back in its own namespace afterwards."""
    if not any(c.netns for c in confs):
        return [make(c) for c in confs]
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        made = []
        for conf in confs:
            if conf.netns:
                enter_netns(conf.netns)
            made.append(make(conf))
        return made
    finally:
        _setns(home, "of this process")
        os.close(home)

