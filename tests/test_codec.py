"""innet.node.codec: every record that crosses a process boundary goes to JSON and comes back the same value."""

import json

from innet.hosts.ensemble import InputPlan, Receiver
from innet.hosts.job import JobSpec
from innet.hosts.learning.model import Task
from innet.hosts.pbox import PBoxJob
from innet.hosts.ssp import Consistency
from innet.hosts.training import Training
from innet.node.admission import AdmissionReport
from innet.node.codec import from_json, to_json
from innet.node.config import (
    InputConfig,
    Install,
    PBoxConfig,
    PortFaults,
    SwitchGroup,
    SwitchNodeConfig,
    SwitchStats,
    WorkerConfig,
    WorkerGroup,
)
from innet.switch.program import JobPort
from innet.switch.runtime import JobSlots, PortStats, SwitchConfig, SwitchReport
from innet.wire.faults import FaultSpec
from innet.wire.operators import OPERATORS

SPEC = JobSpec(job=2, rank=1, nworkers=4, slots=8, elements=64, node=11, first_hop=20, pbox=30, operator=OPERATORS["max"])
FAULTS = {0: PortFaults(FaultSpec(loss=0.1, delay=0.002), 77), 3: PortFaults()}


def round_trip(value):
    """``value`` through JSON text, as a node process reads it."""
    return from_json(type(value), json.loads(json.dumps(to_json(value))))


def test_configs_come_back_equal_with_int_keys_tuples_and_nested_records():
    worker = WorkerConfig(SPEC, 5, (100, 7), 0.1, 2, Consistency("ssp", 2, 3, 107), (0.5, 0.25), Task(workers=4),
                          Training(0.1, (0.2, 0.3), 2, (1, 0), (1, 0), (0.05, 0.05)), "h2-eth0", FAULTS, "run/x.npz",
                          "ring", (10, 11, 12, 13), 10.0)
    switch = SwitchNodeConfig("sum_allreduce", {0: "s1-eth0", 1: "s1-eth1"}, FAULTS, "run/s1.sock", 64, 256, 3)
    pbox = PBoxConfig(30, 2, 1, "p1-eth0", FAULTS, (PBoxJob(2, {0: 10, 1: 11}, 8, 64, operator=OPERATORS["max"]),))
    plan = InputPlan("p1", 30, True, 100, 64, 2, 5, (Receiver("h1", 10, 2, 0),))
    for value in (worker, switch, pbox, WorkerGroup((worker, worker)), SwitchGroup((switch,)),
                  InputConfig(plan, "h1-eth0", FAULTS, plan.receivers[0], "run/r.json")):
        assert round_trip(value) == value
    assert round_trip(worker).faults[0].spec.loss == 0.1 and round_trip(worker).spec.operator is not None


def test_what_a_switch_is_told_and_says_comes_back_equal():
    config = SwitchConfig("s1", 4, "tor", {0: "s1-eth0", 1: "s1-eth1"}, {0: 10, 1: 11}, {10: 0, 11: 1},
                          {2: JobPort(2, 2, (0, 1), None, True, {0: 1, 1: 1}, 0, {0: 0, 1: 1}, 0, 8)},
                          groups={0x7F00: (0, 1)})
    assert round_trip(Install(config)) == Install(config)
    stats = SwitchStats(0.25, 3, {"s1-eth0": 1}, {"s1-eth0": 0}, AdmissionReport(16, 0, 0, 16),
                        SwitchReport("s1", 100, 4096, {2: JobSlots(True, 0, 8)}, {"s1-eth0": PortStats(1, 2, 3, 4)},
                                     {"drop:stale": 1}))
    assert round_trip(stats) == stats and round_trip(stats).counters == {"drop:stale": 1}


def test_a_launch_tally_with_counters_and_a_set_comes_back_equal_and_adds_up():
    from collections import Counter

    from innet.integrations.torch.fabric import Tally

    tally = Tally(link_bytes=Counter({"h1-s1": 5, "h2-s1": 7}), link_bytes_up=Counter({"h1-s1": 4, "h2-s1": 7}),
                  link_bytes_down=Counter({"h1-s1": 1}), virtual_s=0.25, calls=Counter({"allreduce": 2}),
                  side_plane={"send", "all_to_all"})
    back = round_trip(tally)
    assert back == tally and isinstance(back.link_bytes, Counter) and isinstance(back.side_plane, set)
    back.add(tally)
    assert (back.link_bytes["h2-s1"], back.calls["allreduce"], back.virtual_s) == (14, 4, 0.5)
    assert (back.link_bytes_up["h1-s1"], back.link_bytes_down["h1-s1"]) == (8, 2)
