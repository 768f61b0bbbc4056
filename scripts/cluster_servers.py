"""Test "servers" for ``run_topology.py --cluster`` on one machine: network namespaces, each running its own sshd.

    python3 scripts/cluster_servers.py up 2    # prints the --cluster flags that reach them
    python3 scripts/cluster_servers.py down

Server i is the namespace innet-srv<i>, at 10.213.57.<i> on the private bridge innet-cbr0 (10.213.57.254 on this
side). Each runs an sshd of its own from /run/innet-cluster: its own config, host key and pid file, listening only
on its own address, root login only with the client key made there for the test. The servers share this kernel
and filesystem, which is all Mininet's remote nodes need (a shell started over ssh, mnexec there). ``down`` removes
exactly what ``up`` made, by name and pid: the sshds and any session of theirs (the processes in each namespace),
the namespaces, the bridge, the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

DIR = "/run/innet-cluster"
BRIDGE = "innet-cbr0"
NET = "10.213.57"
PREFIX = "innet-srv"
MTU = 9000  # room for a VXLAN tunnel's 50 bytes around any frame innet sends, jumbo ones included
SSHD = "/usr/sbin/sshd"
PRIVSEP = "/run/sshd"  # Debian's sshd refuses to start without it
STATE = os.path.join(DIR, "state.json")


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"error: ip {' '.join(args)}: {out.stderr.strip()}")


def flags(servers: list[str]) -> str:
    """The run_topology.py flags that reach ``servers`` with the test's key and host keys."""
    return (f"--cluster {','.join(servers)} --cluster-key {DIR}/id_ed25519 "
            f"--cluster-known-hosts {DIR}/known_hosts")


def _keygen(path: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "innet-cluster", "-f", path], check=True)
    with open(path + ".pub", encoding="ascii") as fh:
        return fh.read().strip()


def _ensure_sshd() -> None:
    if os.path.exists(SSHD):
        return
    print("installing openssh-server (sshd) ...", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "openssh-server"]):
        if subprocess.run(argv, env=env, capture_output=True, check=False).returncode:
            raise SystemExit("error: cannot install openssh-server (apt-get install openssh-server)")


SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {dir}/host_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {top}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
"""


def up(n: int) -> list[str]:
    """Start ``n`` servers; return their addresses."""
    if not 1 <= n <= 50:
        raise SystemExit(f"error: up wants 1 to 50 servers, got {n}")
    if os.path.exists(STATE):
        raise SystemExit(f"error: servers are already up ({STATE}); run `{sys.argv[0]} down` first")
    if os.path.exists(DIR):
        raise SystemExit(f"error: {DIR} exists but records no servers; remove it (rm -r {DIR}) and run up again")
    _ensure_sshd()
    os.makedirs(DIR, mode=0o700)
    state: dict[str, object] = {"servers": [], "pids": {}, "privsep": not os.path.isdir(PRIVSEP)}
    _save(state)
    if state["privsep"]:
        os.makedirs(PRIVSEP, mode=0o755)
    with open(os.path.join(DIR, "authorized_keys"), "w", encoding="ascii") as fh:
        fh.write(_keygen(os.path.join(DIR, "id_ed25519")) + "\n")
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{NET}.254/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "mtu", str(MTU), "up")
    known = []
    servers: list[str] = []
    for i in range(1, n + 1):
        ns, address, sdir = f"{PREFIX}{i}", f"{NET}.{i}", os.path.join(DIR, f"srv{i}")
        _ip("netns", "add", ns)
        servers.append(address)
        state["servers"] = servers
        _save(state)
        _ip("link", "add", f"innet-csv{i}", "mtu", str(MTU), "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", f"innet-csv{i}", "master", BRIDGE, "up")
        _ip("-n", ns, "link", "set", "eth0", "mtu", str(MTU), "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        os.makedirs(sdir, mode=0o700)
        known.append(f"{address} {' '.join(_keygen(os.path.join(sdir, 'host_key')).split()[:2])}")
        conf = os.path.join(sdir, "sshd_config")
        with open(conf, "w", encoding="ascii") as fh:
            fh.write(SSHD_CONFIG.format(address=address, dir=sdir, top=DIR))
        out = subprocess.run(["ip", "netns", "exec", ns, SSHD, "-f", conf, "-E", os.path.join(sdir, "sshd.log")],
                             capture_output=True, text=True, check=False)
        if out.returncode:
            raise SystemExit(f"error: sshd did not start in {ns}: {out.stderr.strip()}")
        state["pids"][ns] = _pid_of(os.path.join(sdir, "sshd.pid"))  # type: ignore[index]
        _save(state)
    with open(os.path.join(DIR, "known_hosts"), "w", encoding="ascii") as fh:
        fh.write("\n".join(known) + "\n")
    for address in servers:
        _wait_for_ssh(address)
    return servers


def _pid_of(path: str) -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="ascii") as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            time.sleep(0.02)
    raise SystemExit(f"error: sshd wrote no pid file {path}")


def _wait_for_ssh(address: str) -> None:
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", "-o", "IdentitiesOnly=yes",
            "-i", f"{DIR}/id_ed25519", "-o", f"UserKnownHostsFile={DIR}/known_hosts", "-o", "StrictHostKeyChecking=yes",
            f"root@{address}", "true"]
    deadline = time.monotonic() + 10
    while True:
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
        if out.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"error: cannot log in to {address} over ssh: {out.stderr.strip()}")
        time.sleep(0.1)


def _save(state: dict[str, object]) -> None:
    with open(STATE, "w", encoding="ascii") as fh:
        json.dump(state, fh)


def _is_our_sshd(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return any(a.startswith(DIR.encode()) for a in argv)


def down() -> str:
    """Remove every server ``up`` recorded (nothing when none is up)."""
    if not os.path.exists(STATE):
        return "no test servers are up"
    with open(STATE, encoding="ascii") as fh:
        state = json.load(fh)
    killed = 0
    for i, _ in enumerate(state["servers"], 1):
        ns = f"{PREFIX}{i}"
        pid = state["pids"].get(ns)
        if pid and _is_our_sshd(pid):  # the listener first: no new sessions while the old ones go
            os.kill(pid, signal.SIGTERM)
            killed += 1
        # every process still in the namespace is this server's: its sessions and what they started there
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
        for p in map(int, out.stdout.split()):
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        # the server's end of its veth goes with the namespace, but the kernel removes the pair later
        # (in a work queue): delete our end by name, so that nothing of the server is left when down returns
        if os.path.exists(f"/sys/class/net/innet-csv{i}"):
            subprocess.run(["ip", "link", "del", f"innet-csv{i}"], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    if os.path.exists(f"/sys/class/net/{BRIDGE}"):
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
    if state.get("privsep") and os.path.isdir(PRIVSEP) and not os.listdir(PRIVSEP):
        os.rmdir(PRIVSEP)
    shutil.rmtree(DIR, ignore_errors=True)
    return f"removed {len(state['servers'])} test server(s), {killed} process(es), bridge {BRIDGE}"


def main(argv: list[str]) -> int:
    if os.geteuid() != 0:
        print("error: the test servers need root (namespaces, a bridge, sshd)", file=sys.stderr)
        return 2
    if len(argv) == 3 and argv[1] == "up" and argv[2].isdigit():
        try:
            servers = up(int(argv[2]))
        except BaseException:
            if os.path.exists(STATE):
                down()
            raise
        print(f"{len(servers)} test server(s) up; run with: {flags(servers)}")
        return 0
    if len(argv) == 2 and argv[1] == "down":
        print(down())
        return 0
    print(f"usage: {argv[0]} up N | down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
