"""One switch's forwarding and aggregation rate, next to the Linux bridge, on this machine.

A star: sender hosts h1..hW and the switch s1 (plus a sink h(W+1) when
forwarding). One ``innet.blast`` process drives every sender's interface in
lockstep with sendmmsg, for a fixed time; the middle node is either the Linux
bridge or the innet switch. Rates come from interface and switch counters.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from innet.emulation import Control, network
from innet.experiment import switch_configs
from innet.graph import node_indices
from innet.planner import plan_job
from innet.serialize import config_to_json
from topologies.star import star

PROGRAM = """from switch_programs.sum_allreduce import SumAllreduce


class Sized(SumAllreduce):
    name = "sum_allreduce_{elements}"
    elements = {elements}
"""


def _rx_tx(node: Any) -> dict[str, tuple[int, int]]:
    import json

    out = {}
    for d in json.loads(node.cmd("ip -s -j link show")):
        if "stats64" in d:
            out[d["ifname"]] = (int(d["stats64"]["rx"]["packets"]), int(d["stats64"]["tx"]["packets"]))
    return out


def measure(kind: str, workers: int, elements: int, target: str, seconds: float = 2.0) -> dict[str, float]:
    """Packets/s the sender sent, the middle node took in, and it sent out; for sum, aggregations/s."""
    hosts = workers + (1 if kind == "forward" else 0)
    graph = star(hosts, bw=100_000.0, pbox=False)  # above TCLink's range: left unshaped, veth speed
    idx = node_indices(graph)
    senders = [f"h{i + 1}" for i in range(workers)]
    with network(graph) as emu:
        s1 = emu.net.get("s1")
        if target == "bridge":
            s1.cmd("ip link add br0 type bridge && ip link set br0 up")
            for intf in s1.intfNames():
                if intf != "lo":
                    s1.cmd(f"ip link set {intf} master br0")
        else:
            program = os.path.join(emu.run_dir, f"sum_{elements}.py")
            with open(program, "w", encoding="utf-8") as fh:
                fh.write(PROGRAM.format(elements=elements))
            plans = [] if kind == "forward" else [plan_job(graph, senders, method="root", slots=128)]
            config = switch_configs(graph, plans, memory=64 << 20)["s1"]
            conf = {"program": "forward" if kind == "forward" else program,
                    "ports": {p: f"s1-eth{p}" for p in config.ports},
                    "faults": {str(p): {} for p in config.ports}, "seed": 0,
                    "control": os.path.join(emu.run_dir, "s1.sock")}
            emu._write("s1.json", conf)
            emu.spawn("s1", [sys.executable, "-m", "innet.node", "switch", os.path.join(emu.run_dir, "s1.json")])
            control = Control(os.path.join(emu.run_dir, "s1.sock"))
            emu.controls.append(control)
            reply = control.call("install", config=config_to_json(config))
            assert reply["ok"], reply
        where = ",".join(f"{emu.net.get(h).pid}:{h}-eth0" for h in senders)
        dst = idx["s1"] if kind == "sum" else idx[f"h{hosts}"]
        before = _rx_tx(s1)
        blast = emu.spawn(None, [sys.executable, "-m", "innet.blast", where, "--kind", kind, "--dst", str(dst),
                                 "--src", ",".join(str(idx[h]) for h in senders), "--elements", str(elements),
                                 "--seconds", str(seconds)], stdout=__import__("subprocess").PIPE)
        out, _ = blast.communicate(timeout=seconds + 60)
        time.sleep(0.2)  # let the switch drain what is queued
        after = _rx_tx(s1)
        sent, took = out.split()[1:3]
        elapsed = float(took)
        rx = sum(after[i][0] - before[i][0] for i in after if i in before and i != "lo")
        tx = sum(after[i][1] - before[i][1] for i in after if i in before and i != "lo")
        result = {"sender_pps": int(sent) / elapsed, "in_pps": rx / elapsed, "out_pps": tx / elapsed}
        if kind == "sum":
            first = "s1-eth0"
            result["aggregations_per_s"] = (after[first][1] - before[first][1]) / elapsed
        return result
