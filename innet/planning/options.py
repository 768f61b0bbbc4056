"""What an option of a run is besides its value: its flag, help, section, where it means something, and how
its text is read. ``RunSpec``'s fields carry one ``Option`` each (``option(...)``); the command line's parsers
(innet.cli) and the rules about where an option means something (``RunSpec.validate``) are made from them.

Text parsers raise ``ValueError`` with the reason; the command line shows it as one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

GROUPS = ("backend", "topology", "job", "workload", "shared input", "consistency", "training", "faults", "output")


@dataclass(frozen=True)
class Option:
    """How a ``RunSpec`` field is set from the command line, and where it means something."""

    help: str
    group: str
    flag: str = ""  # default: --field-name
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    parse: Callable[[str], Any] | None = None  # a flag's text to the field's value (default: the field's type)
    repeat: bool = False  # a flag given once per value: the field is the tuple of them
    switch: bool = False  # a flag without a value: True when given
    topos: tuple[str, ...] = ()  # means something only with these topologies
    backends: tuple[str, ...] = ()  # means something only on these backends
    needs: str = ""  # means something only when this field is set

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"option group {self.group!r} is not one of {GROUPS}")


def option(default: Any = MISSING, *, factory: Callable[[], Any] | None = None, **meta: Any) -> Any:
    """A ``RunSpec`` field with its ``Option``."""
    if factory is not None:
        return field(default_factory=factory, metadata={"option": Option(**meta)})
    return field(default=default, metadata={"option": Option(**meta)})


def options_of(cls: type) -> list[tuple[Field[Any], Option]]:
    """Every field of dataclass ``cls`` that carries an ``Option``, in declaration order."""
    return [(f, f.metadata["option"]) for f in fields(cls) if "option" in f.metadata]


def flag_of(f: Field[Any]) -> str:
    """The flag that sets field ``f``."""
    opt = f.metadata.get("option")
    return (opt.flag if opt and opt.flag else "--" + f.name.replace("_", "-"))


def default_of(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def parse_dilation(text: str) -> float | str:
    """``--dilation``: "auto", "off" (factor 1) or a factor of at least 1."""
    if text in ("auto", "off"):
        return 1.0 if text == "off" else "auto"
    try:
        factor = float(text)
    except ValueError:
        factor = float("nan")
    if not factor >= 1:
        raise ValueError(f"wants auto, off or a factor of at least 1, got {text!r}")
    return factor


def parse_node_group(text: str) -> int | None:
    """``--node-group``: "auto" (None: innet.planning.grouping decides), "off" (1: a process per node) or G >= 1."""
    if text in ("auto", "off"):
        return None if text == "auto" else 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"wants auto, off or a number of nodes per process (at least 1), got {text!r}")
    return int(text)


def parse_straggler(text: str) -> tuple[str, float, float]:
    """``--straggler HOST:FACTOR[:PROB]``."""
    host, _, rest = text.partition(":")
    try:
        factor, chance = (float(x) for x in (rest.split(":") + ["1"])[:2])
    except ValueError:
        raise ValueError(f"wants HOST:FACTOR[:PROB], got {text!r}") from None
    if not host or not 1 <= factor < float("inf") or not 0 <= chance <= 1:
        raise ValueError(f"wants a host, a factor of at least 1 and a probability in [0, 1], got {text!r}")
    return host, factor, chance


def parse_crash(text: str) -> tuple[str, float]:
    """``--crash HOST@SECONDS``."""
    host, _, at = text.partition("@")
    try:
        seconds = float(at)
    except ValueError:
        raise ValueError(f"wants HOST@SECONDS, got {text!r}") from None
    if not host or not 0 <= seconds < float("inf"):
        raise ValueError(f"wants a host and a finite number of seconds, at least 0, got {text!r}")
    return host, seconds


def parse_bands(text: str) -> tuple[int, ...]:
    """``--job-priority B[,B...]``."""
    try:
        return tuple(int(b) for b in text.split(",")) if text else ()
    except ValueError:
        raise ValueError(f"wants bands like 0,2, got {text!r}") from None
