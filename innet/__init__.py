"""innet: in-network gradient aggregation, emulated.

``innet.run(topology, **options)`` runs and checks an all-reduce and reports where the bytes went;
``innet.plan(...)`` says what it would do; ``innet.prepare(...)`` makes a run ready, every rule checked, for
``run`` to take (innet.api). The names a switch program needs are exported
here too; see README.md for a walk-through of writing a program.
"""

from typing import Any

from innet.switch.engine import Engine
from innet.switch.program import (
    Batch,
    Context,
    Drop,
    Emit,
    EmitMany,
    JobPort,
    Multicast,
    Register,
    SwitchProgram,
    ToPBox,
    group_by,
    on_batch,
    on_packet,
    on_start,
    on_timer,
)
from innet.switch.reduction import Reduction
from innet.wire.operators import BAND, BOR, MAX, MIN, SUM, Operator
from innet.wire.packet import (
    ABORT,
    ALL_RANKS,
    FALLBACK,
    OVERFLOW,
    RESULT,
    RETX,
    ROUTE,
    SPARSE,
    VER,
    InnetAgg,
    Packet,
    make_packet,
)

__all__ = [
    "prepare", "run", "plan", "Prepared", "RunSpec", "Report", "Plan",
    "ABORT", "ALL_RANKS", "FALLBACK", "OVERFLOW", "RESULT", "RETX", "ROUTE", "SPARSE", "VER",
    "InnetAgg", "Packet", "make_packet",
    "Batch", "Context", "Drop", "Emit", "EmitMany", "JobPort", "Multicast", "Register", "SwitchProgram", "ToPBox",
    "group_by", "on_batch", "on_packet", "on_start", "on_timer",
    "Engine", "Reduction", "Operator", "SUM", "MAX", "MIN", "BOR", "BAND",
]

_API = {"prepare": "innet.api", "run": "innet.api", "plan": "innet.api", "Plan": "innet.api", "Prepared": "innet.api",
        "RunSpec": "innet.planning.spec",
        "Report": "innet.results.report"}


def __getattr__(name: str) -> Any:
    """``innet.run`` and friends, imported on first use: a switch program or a node process that imports
    ``innet`` does not load the planner, the backends and the results."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'innet' has no attribute {name!r}")
