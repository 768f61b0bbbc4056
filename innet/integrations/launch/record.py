"""What ``innet launch --out DIR`` writes to DIR/results.json: the launch's counts (``LaunchRecord``), one codec
(innet.node.codec), as a run's record is its own."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import networkx as nx

from innet.errors import UserError
from innet.integrations.torch.fabric import Tally
from innet.node import codec
from innet.planning.spec import RunSpec
from innet.results.metrics import tier_bytes


@dataclass(frozen=True)
class LaunchRecord:
    """A launch: where it ran, the calls through the network (``calls``) and over the side plane, bytes per link,
    per link direction (up: host to ToR, ToR to spine; innet.graph.uplink) and per tier; of those, the
    point-to-point messages' (send/recv, all-to-all, gather, scatter: ``messages`` of them, on the fabric measured
    apart) beside the planner's prediction of them; the fabric's virtual seconds (local)."""

    backend: str
    mode: str
    topology: str
    ranks: int
    wall_s: float
    virtual_s: float | None
    calls: dict[str, int]
    side_plane: list[str]
    link_bytes: dict[str, int]
    link_bytes_up: dict[str, int]
    link_bytes_down: dict[str, int]
    tier_bytes: dict[str, int]
    messages: int
    message_link_bytes: dict[str, int]
    predicted_message_link_bytes: dict[str, int]
    fused: int
    fusions: int


def launch_record(graph: nx.Graph, run: RunSpec, tally: Tally, ranks: int, wall: float) -> LaunchRecord:
    links = {name: int(b) for name, b in sorted(tally.link_bytes.items())}
    return LaunchRecord(run.backend, run.mode, run.topo, ranks, round(wall, 3),
                        tally.virtual_s if run.backend == "local" else None, dict(sorted(tally.calls.items())),
                        sorted(tally.side_plane), links, dict(sorted(tally.link_bytes_up.items())),
                        dict(sorted(tally.link_bytes_down.items())), tier_bytes(graph, links), tally.messages,
                        dict(sorted(tally.message_link_bytes.items())),
                        dict(sorted(tally.predicted_message_link_bytes.items())), tally.fused, tally.fusions)


def write_record(folder: str, record: LaunchRecord) -> str:
    """``record`` as ``folder``/results.json (the folder made if need be): its path."""
    path = os.path.join(folder, "results.json")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(codec.to_json(record), fh, indent=2)
            fh.write("\n")
    except OSError as exc:
        raise UserError(f"innet launch cannot write {path}: {exc.strerror or exc}") from None
    return path
