"""An IP network on the emulated links, beside innet's own frames: for programs that speak TCP (torch.distributed).

Every link gets a /30 of 10.78.0.0/16, every host's address is the one on its first interface, and every node
routes each host's address (a /32) to its next hop on a shortest path through the switches; the switches'
kernels forward (``ip_forward``), so IP traffic takes the same shaped links as innet's frames, at the kernel's
speed. innet's frames are not affected: they carry MAC addresses no kernel interface has, and its switch and
worker processes read them from packet sockets.
"""

from __future__ import annotations

import networkx as nx

from innet.graph import hosts, is_switch, natural_key, port_to


def link_addresses(graph: nx.Graph) -> dict[tuple[str, str], str]:
    """(node, neighbour) -> the node's address on that link (10.78.x.y, each link a /30)."""
    out = {}
    for i, (u, v) in enumerate(sorted((tuple(sorted(e, key=natural_key)) for e in graph.edges), key=lambda e: (
            natural_key(e[0]), natural_key(e[1])))):
        base = 4 * i
        third, fourth = (base >> 8) & 0xFF, base & 0xFF
        out[(u, v)] = f"10.78.{third}.{fourth + 1}"
        out[(v, u)] = f"10.78.{third}.{fourth + 2}"
    return out


def host_address(graph: nx.Graph, host: str) -> str:
    """The address a host is reached at: the one on its first interface."""
    neighbour = sorted(graph[host], key=natural_key)[0]
    return link_addresses(graph)[(host, neighbour)]


def ip_commands(graph: nx.Graph) -> dict[str, list[str]]:
    """The commands that set up the IP network, per node (each run inside that node's namespace)."""
    addresses = link_addresses(graph)
    targets = {h: host_address(graph, h) for h in hosts(graph)}
    switches = {n for n in graph if is_switch(graph, n)}
    commands: dict[str, list[str]] = {}
    for node in sorted(graph, key=natural_key):
        cmds = [f"sysctl -qw net.ipv4.ip_forward={1 if node in switches else 0}"]
        for peer in sorted(graph[node], key=natural_key):
            cmds.append(f"ip addr add {addresses[(node, peer)]}/30 dev {node}-eth{port_to(graph, node, peer)}")
        for host, address in targets.items():
            if host == node:
                continue
            path = nx.shortest_path(graph.subgraph(switches | {node, host}), node, host)
            hop = path[1]
            cmds.append(f"ip route add {address}/32 via {addresses[(hop, node)]} dev {node}-eth{port_to(graph, node, hop)}")
        commands[node] = cmds
    return commands
