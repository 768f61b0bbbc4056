"""Wide-area graphs from the Internet Topology Zoo (topology-zoo.org; S. Knight et al., "The Internet Topology Zoo",
IEEE JSAC 2011): the PoPs, their coordinates and links as the zoo's GraphML gives them (Abilene.graphml, 2005;
Aarnet.graphml, 2010), as innet topologies: a switch per PoP, every link 1000 Mbit/s with a latency from its
great-circle length, scaled so the longest is 5 ms (none below 1 ms); a worker host at four far-apart PoPs and the
PBox at a central one. ``python -m topologies.zoo`` writes topologies/examples/{abilene,aarnet}.graphml.
"""

from __future__ import annotations

import math
import os

import networkx as nx

ZOO = {  # name: (PoPs: id -> (name, latitude, longitude), links, worker PoPs, PBox PoP)
    "abilene": ({0: ("nyc", 40.71427, -74.00597), 1: ("chi", 41.85003, -87.65005), 2: ("wdc", 38.89511, -77.03637),
                 3: ("sea", 47.60621, -122.33207), 4: ("snv", 37.36883, -122.03635), 5: ("lax", 34.05223, -118.24368),
                 6: ("den", 39.73915, -104.9847), 7: ("kc", 39.11417, -94.62746), 8: ("hou", 29.76328, -95.36327),
                 9: ("atl", 33.749, -84.38798), 10: ("ind", 39.76838, -86.15804)},
                [(0, 1), (0, 2), (1, 10), (2, 9), (3, 4), (3, 6), (4, 5), (4, 6), (5, 8), (6, 7), (7, 8), (7, 10),
                 (8, 9), (9, 10)], (0, 3, 5, 9), 7),
    "aarnet": ({0: ("syd1", -33.86785, 151.20732), 1: ("bne2", -27.46794, 153.02809), 2: ("cbr1", -35.28346, 149.12807),
                3: ("syd2", -33.86785, 151.20732), 4: ("tsv", -19.25, 146.8), 5: ("cns", -16.91667, 145.76667),
                6: ("bne1", -27.46794, 153.02809), 7: ("rok", -23.38333, 150.5), 8: ("arm", -30.51667, 151.65),
                9: ("hba", -42.87936, 147.32941), 10: ("cbr2", -35.28346, 149.12807), 11: ("per1", -31.93333, 115.83333),
                12: ("per2", -31.93333, 115.83333), 13: ("adl1", -34.93333, 138.6), 14: ("adl2", -34.93333, 138.6),
                15: ("mel1", -37.814, 144.96332), 16: ("mel2", -37.814, 144.96332), 17: ("asp", -23.7, 133.88333),
                18: ("drw", -12.46113, 130.84185)},
               [(0, 10), (0, 3), (0, 6), (1, 3), (1, 6), (2, 10), (2, 15), (3, 8), (3, 16), (4, 5), (4, 7), (6, 7),
                (9, 16), (9, 15), (11, 12), (11, 13), (12, 14), (13, 18), (13, 14), (13, 15), (14, 16), (14, 17),
                (15, 16), (17, 18)], (5, 9, 11, 18), 15),
}
LONGEST_S, SHORTEST_S = 0.005, 0.001


def _km(a: tuple[str, float, float], b: tuple[str, float, float]) -> float:
    (_, la1, lo1), (_, la2, lo2) = a, b
    p1, p2 = math.radians(la1), math.radians(la2)
    cos = math.sin(p1) * math.sin(p2) + math.cos(p1) * math.cos(p2) * math.cos(math.radians(lo2 - lo1))
    return 6371.0 * math.acos(max(-1.0, min(1.0, cos)))


def zoo_graph(name: str) -> nx.Graph:
    """The zoo graph ``name`` as an innet topology (see the module's docstring)."""
    pops, links, workers, pbox = ZOO[name]
    lengths = {(a, b): _km(pops[a], pops[b]) for a, b in links}
    longest = max(lengths.values())
    graph = nx.Graph(name=name)
    for i, (pop, _, _) in pops.items():
        graph.add_node(f"s{pop}", role="tor" if i in workers else "spine")
    for (a, b), km in lengths.items():
        graph.add_edge(f"s{pops[a][0]}", f"s{pops[b][0]}", bw=1000.0,
                       latency=round(max(SHORTEST_S, LONGEST_S * km / longest), 6))
    for n, i in enumerate(workers, 1):
        graph.add_edge(f"h{n}", f"s{pops[i][0]}", bw=1000.0, latency=0.0)
        graph.nodes[f"h{n}"]["role"] = "host"
    graph.add_edge("p1", f"s{pops[pbox][0]}", bw=1000.0, latency=0.0)
    graph.nodes["p1"]["role"] = "pbox"
    return graph


if __name__ == "__main__":
    for zoo in ZOO:
        nx.write_graphml(zoo_graph(zoo), os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples", f"{zoo}.graphml"))
