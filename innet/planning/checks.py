"""The first rule of every run: each option has the type its field declares, a number is finite, a choice is
one of its choices. ``RunSpec`` checks it before anything reads a value, so a wrong type given to ``innet.run``
is one ``UserError`` line naming the option, as a wrong flag is, never a traceback from deep inside."""

from __future__ import annotations

import math
import numbers
import types
import typing
from dataclasses import Field
from typing import Any

from innet.errors import UserError
from innet.planning.options import Option

_NAMES = {bool: "True or False", int: "a whole number", float: "a finite number", str: "text"}
# sane bounds, checked before anything is sized or built from them (a fat-tree k=200 or 1e20 iterations would
# hang or overflow long before memory is checked); times only loosely (a dilated run multiplies them by its
# factor), finite and not negative; the finer rules (innet.planning.rules) come after these
BOUNDS: dict[str, tuple[float, float]] = {
    "elements": (1, 2**31 - 1), "iterations": (1, 10**6), "workers": (1, 65536), "jobs": (1, 65536),
    "k": (2, 64), "racks": (1, 4096), "hosts_per_rack": (1, 4096), "spines": (1, 1024), "oversubscription": (1, 1024),
    "bw": (1e-3, 1e7), "switch_memory": (0, 2**40), "pool_slots": (0, 2**20), "job_slots": (0, 2**20),
    "packet_elements": (0, 2**16), "pbox_cores": (1, 256), "input_elements": (0, 2**31 - 1), "timeout": (1e-6, 1e9),
    "min_rto": (0, 1e9), "initial_rto": (0, 1e9), "hop_latency": (0, 1e9), "compute_time": (0, 1e9),
    "compute_scale": (0, 1e9), "workload_scale": (1e-6, 1), "staleness": (0, 10**6), "slice_elements": (0, 2**31 - 1),
    "root": (0, 65535), "epochs": (-math.inf, 10**4), "batch": (-math.inf, 10**6),
    "hidden": (-math.inf, 2**20),
}


def check_value(f: Field[Any], opt: Option, hint: Any, value: Any) -> None:
    """Refuse ``value`` for field ``f`` (declared ``hint``) unless it is of that type (a flag's text where the
    option reads text), finite where a number, and among the option's choices."""
    if opt.repeat:
        if isinstance(value, str) or not isinstance(value, tuple | list):
            raise UserError(f"{{{f.name}}} takes a list of values (each as its flag reads it), got {value!r}")
        return
    allowed = typing.get_args(hint) if _is_union(hint) else (hint,)
    if value is None and type(None) in allowed:
        return
    if opt.parse is not None and isinstance(value, str):  # read as the flag reads it (RunSpec._read_texts)
        return
    if not any(_is(value, t) for t in allowed if t is not type(None)):
        kinds = " or ".join(_NAMES.get(t, getattr(t, "__name__", str(t))) for t in allowed if t is not type(None))
        raise UserError(f"{{{f.name}}} must be {kinds}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{{{f.name}}} must be a finite number, got {value!r}")
    if f.name in BOUNDS and _is(value, float) and not BOUNDS[f.name][0] <= value <= BOUNDS[f.name][1]:
        lo, hi = BOUNDS[f.name]
        if lo == -math.inf:  # its own rule says the least it takes (a training run's): here only the most
            raise UserError(f"{{{f.name}}} must be at most {hi:g}, got {value!r}")
        raise UserError(f"{{{f.name}}} must be between {lo:g} and {hi:g}, got {value!r}")
    if opt.choices is not None and value not in opt.choices and not (value == "" and f.default == ""):
        raise UserError(f"{{{f.name}}} must be one of {', '.join(map(str, opt.choices))}, got {value!r}")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _is(value: Any, t: Any) -> bool:
    """Whether ``value`` is of the declared type ``t`` (an int is a float; a bool is neither)."""
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    origin = typing.get_origin(t) or t
    return isinstance(value, origin) if isinstance(origin, type) else True
