"""Mininet nodes and links on servers (innet.backends.cluster.servers): a host whose shell runs there, a link that tunnels.

The Mininet side of ``--cluster``, apart so that innet.backends.cluster.servers (the servers, the placement, the figures)
imports no Mininet.
"""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
from typing import Any

from mininet.link import Link, TCLink
from mininet.node import Host

from innet.backends.cluster.servers import Cluster
from innet.errors import UserError

VXLAN_PORT = 4789
_PASSED_ENV = ("PYTHONPATH",)  # besides INNET_*: what a node's process needs from the controller's environment


class RemoteHost(Host):
    """A Mininet host whose namespace is on ``server``: its shell and every process started in it run there, over
    ssh with a terminal, and end when that ssh ends."""

    def __init__(self, name: str, server: str = "", cluster: Cluster | None = None, **params: Any) -> None:
        assert cluster is not None
        self.server, self.cluster = server, cluster
        super().__init__(name, **params)

    def startShell(self, mnopts: str | None = None) -> None:  # noqa: N802 - Mininet's name
        super().startShell(mnopts="-c")  # not -d: the shell keeps ssh's terminal and goes with it
        self.pid = int(self.cmd("echo $$"))  # the namespace's process, on the server

    def _popen(self, cmd: list[str], **params: Any) -> subprocess.Popen[bytes]:
        params.setdefault("start_new_session", True)  # the local ssh: apart from the controller's Ctrl-C
        return super()._popen(self.cluster.ssh(self.server, tty=True) + [shlex.join(cmd)], **params)

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        env = kwargs.get("env") or {}
        passed = [f"{k}={v}" for k, v in sorted(env.items()) if k in _PASSED_ENV or k.startswith("INNET_")]
        kwargs.setdefault("mncmd", ["mnexec", "-a", str(self.pid)] + (["env", *passed] if passed else []))
        return super().popen(*args, **kwargs)


class VxlanLink(TCLink):
    """A TCLink whose ends may be on different servers: then each end is a VXLAN device made on its server and moved
    into its node under the link's interface name (a VNI of its own per link)."""

    vnis = itertools.count((os.getpid() % 4000) * 4000 + 1)

    def makeIntfPair(self, intfname1: str, intfname2: str, addr1: Any = None, addr2: Any = None,  # noqa: N802
                     node1: Any = None, node2: Any = None, deleteIntfs: bool = True) -> Any:  # noqa: N803
        if node1.server == node2.server:
            return Link.makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2, deleteIntfs=deleteIntfs)
        vni = next(self.vnis)
        temp = f"innet-vx{vni:x}"  # at most 15 characters
        for node, intf, here, there in ((node1, intfname1, node1.server, node2.server),
                                        (node2, intfname2, node2.server, node1.server)):
            cluster: Cluster = node.cluster
            make = (f"ip link add {temp} type vxlan id {vni} local {cluster.address(here)} remote {cluster.address(there)} "
                    f"dstport {VXLAN_PORT} && ip link set {temp} netns {node.pid} || {{ ip link del {temp}; exit 1; }}")
            out = cluster.run(here, make + " 2>&1")
            if out.returncode:
                raise UserError(f"cannot make the VXLAN tunnel for {intf} on server {here}: {out.stdout.strip() or out.stderr.strip()}")
            said = node.cmd(f"ip link set {temp} name {intf}")
            if said.strip():
                raise UserError(f"cannot name the VXLAN tunnel {intf} on server {here}: {said.strip()}")
        return None
