"""innet: in-network gradient aggregation, emulated.

The names a switch program needs are exported here; see README.md for the
architecture and a walk-through of writing a program.
"""

from innet.packet import (
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
from innet.program import (
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

__all__ = [
    "ABORT", "ALL_RANKS", "FALLBACK", "OVERFLOW", "RESULT", "RETX", "ROUTE", "SPARSE", "VER",
    "InnetAgg", "Packet", "make_packet",
    "Batch", "Context", "Drop", "Emit", "EmitMany", "JobPort", "Multicast", "Register", "SwitchProgram", "ToPBox",
    "group_by", "on_batch", "on_packet", "on_start", "on_timer",
]
