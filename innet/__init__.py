"""innet: in-network gradient aggregation, emulated.

``innet.run(topology, **options)`` runs and checks an all-reduce and reports where the bytes went;
``innet.plan(...)`` says what it would do; ``innet.prepare(...)`` makes a run ready, every rule checked, for
``run`` to take (innet.api). The names a switch program needs are exported
here too; see README.md for a walk-through of writing a program.
"""

from typing import Any

_HOMES = {  # each name's module
    "innet.api": ("prepare", "run", "plan", "Plan", "Prepared"),
    "innet.planning.spec": ("RunSpec",),
    "innet.results.report": ("Report",),
    "innet.switch.engine": ("Engine",),
    "innet.switch.program": ("Batch", "Context", "Drop", "Emit", "EmitMany", "JobPort", "Multicast", "Register",
                             "SwitchProgram", "ToPBox", "group_by", "on_batch", "on_packet", "on_start", "on_timer"),
    "innet.switch.reduction": ("Reduction",),
    "innet.wire.operators": ("BAND", "BOR", "MAX", "MIN", "SUM", "Operator"),
    "innet.wire.packet": ("ABORT", "ALL_RANKS", "FALLBACK", "OVERFLOW", "RESULT", "RETX", "ROUTE", "SPARSE", "VER",
                          "Packet", "make_packet"),
    "innet.wire.layer": ("InnetAgg",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    """Every name above, imported on first use: ``import innet`` loads nothing (no scapy, no planner), so the
    command line's interrupt guard (innet.commands.console) is in place before anything slow loads, and a switch
    program or a node process loads only what it names."""
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'innet' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The names above too (a notebook's completion lists them)."""
    return sorted([*globals(), *_HOME])
