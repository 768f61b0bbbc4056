"""Small builders shared by tests."""

import numpy as np

from innet.plan.configs import switch_configs
from innet.plan.planner import plan_job
from innet.plan.spec import RunSpec
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchRuntime
from topologies import build


def star_runtime(workers=3, program="sum_allreduce", slots=None):
    graph = build("star", workers=workers)
    prog = load_program(program)
    hosts = [f"h{i + 1}" for i in range(workers)]
    plan = plan_job(graph, hosts, method="root", slots=slots or prog.slots)
    cfg = switch_configs(graph, [plan])["s1"]
    return graph, plan, SwitchRuntime(cfg, prog)


def run(**kw):
    return RunSpec(**kw)


def ints(n, seed=0):
    return np.random.default_rng(seed).integers(-1000, 1000, n).astype(np.int32)
