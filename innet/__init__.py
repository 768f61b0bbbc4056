"""innet: in-network gradient aggregation, emulated.

The names a switch program needs are exported here; see README.md for the
architecture and a walk-through of writing a program.
"""

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
    "ABORT", "ALL_RANKS", "FALLBACK", "OVERFLOW", "RESULT", "RETX", "ROUTE", "SPARSE", "VER",
    "InnetAgg", "Packet", "make_packet",
    "Batch", "Context", "Drop", "Emit", "EmitMany", "JobPort", "Multicast", "Register", "SwitchProgram", "ToPBox",
    "group_by", "on_batch", "on_packet", "on_start", "on_timer",
    "Engine", "Reduction", "Operator", "SUM", "MAX", "MIN", "BOR", "BAND",
]
