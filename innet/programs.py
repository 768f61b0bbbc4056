"""Find a switch program by name (a file in switch_programs/) or by path."""

from __future__ import annotations

import importlib.util
import inspect
import os
from typing import TYPE_CHECKING

from innet.errors import UserError
from innet.packet import JUMBO_MTU, MAX_PACKET_ELEMENTS
from innet.program import SwitchProgram

if TYPE_CHECKING:
    from innet.experiment import RunSpec

PROGRAM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "switch_programs")


def available() -> list[str]:
    return sorted(f[:-3] for f in os.listdir(PROGRAM_DIR) if f.endswith(".py") and not f.startswith("_"))


def load_program(name: str, pool_slots: int = 0, packet_elements: int = 0) -> type[SwitchProgram]:
    """The SwitchProgram subclass defined in ``switch_programs/<name>.py`` or in file ``name``;
    with ``pool_slots`` or ``packet_elements``, a subclass of it whose slot pool has that many slots
    (per version), or whose packets carry that many values."""
    path = name if name.endswith(".py") else os.path.join(PROGRAM_DIR, name.replace("-", "_") + ".py")
    if not os.path.isfile(path):
        raise UserError(f"unknown program {name!r}; available: {', '.join(available())} (or a path to a .py file)")
    spec = importlib.util.spec_from_file_location(f"innet_program_{os.path.basename(path)[:-3]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UserError(f"program file {path} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - any import-time failure of user code is a user error
        raise UserError(f"program file {path} failed to load: {type(exc).__name__}: {exc}") from None
    found = [obj for obj in vars(module).values()
             if inspect.isclass(obj) and issubclass(obj, SwitchProgram) and obj is not SwitchProgram
             and obj.__module__ == module.__name__]
    if len(found) != 1:
        raise UserError(f"program file {path} must define exactly one SwitchProgram subclass, found {len(found)}")
    program = found[0]
    if program.memory_bytes() < 0 or program.slots < 0 or program.elements < 1:
        raise UserError(f"program {program.name}: slots and elements must be positive")
    sized: dict[str, int] = {}
    if pool_slots:
        if not program.slots:
            raise UserError(f"program {program.name} keeps no slot pool: --pool-slots does not apply to it")
        sized["slots"] = pool_slots
    if packet_elements:
        if not 1 <= packet_elements <= MAX_PACKET_ELEMENTS:
            raise UserError(f"--packet-elements must be 1..{MAX_PACKET_ELEMENTS} (a frame must fit a {JUMBO_MTU}-byte "
                            f"jumbo MTU), got {packet_elements}")
        sized["elements"] = packet_elements
    if sized:
        program = type(program.__name__, (program,), {**sized, "__module__": program.__module__})
    return program


def program_of(run: RunSpec) -> type[SwitchProgram]:
    """The switch program ``run`` names, with its pool and packet size."""
    return load_program(run.program, run.pool_slots, run.packet_elements)
