"""Find a switch program by name (a file in switch_programs/) or by path."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import traceback

from innet.errors import UserError
from innet.shipped import PROGRAMS as PROGRAM_DIR
from innet.switch.program import SwitchProgram
from innet.wire.operators import Operator
from innet.wire.packet import JUMBO_MTU, MAX_PACKET_ELEMENTS


def available() -> list[str]:
    return sorted(f[:-3] for f in os.listdir(PROGRAM_DIR) if f.endswith(".py") and not f.startswith("_"))


def load_program(name: str, pool_slots: int = 0, packet_elements: int = 0, fan_in: int = 0) -> type[SwitchProgram]:
    """The SwitchProgram subclass defined in ``switch_programs/<name>.py`` or in file ``name``;
    with ``pool_slots``, ``packet_elements`` or ``fan_in``, a subclass of it whose slot pool has that many
    slots (per version), whose packets carry that many values, or whose slots track that many contributors."""
    path = name if name.endswith(".py") else os.path.join(PROGRAM_DIR, name.replace("-", "_") + ".py")
    if not os.path.isfile(path):
        raise UserError(f"unknown program {name!r}; available: {', '.join(available())} (or a path to a .py file)")
    return _sized(os.path.abspath(path), _stamp(path), pool_slots, packet_elements, fan_in)


def _stamp(path: str) -> tuple[int, int]:
    """What says a program file changed: its modification time and size."""
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=64)
def _loaded(path: str, stamp: tuple[int, int]) -> type[SwitchProgram]:
    """The program class file ``path`` defines, its file executed once per process while unchanged (``stamp``):
    a run asks for its program many times (the plan, the switches, the check), a user's file runs once."""
    spec = importlib.util.spec_from_file_location(f"innet_program_{os.path.basename(path)[:-3]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        where = "" if os.path.abspath(exc.filename or path) == os.path.abspath(path) else f" (in {exc.filename})"
        raise UserError(f"program file {path} has a syntax error at line {exc.lineno}{where}: {exc.msg}") from None
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - user code failing at import is a user error
        raise UserError(f"program file {path} failed to load: {failure(exc, path)}") from None
    found = [obj for obj in vars(module).values()
             if inspect.isclass(obj) and issubclass(obj, SwitchProgram) and obj is not SwitchProgram
             and obj.__module__ == module.__name__]
    if len(found) != 1:
        raise UserError(f"program file {path} must define exactly one SwitchProgram subclass, found {len(found)}")
    program = found[0]
    program.source = path
    _check_handlers(path, program)
    operator = getattr(program, "operator", None)
    if hasattr(program, "operator") and not isinstance(operator, Operator):
        raise UserError(f"program file {path}: {program.__name__}.operator is {operator!r}, not an Operator; give "
                        "SUM, MAX, MIN, BOR, BAND or Operator(name, ufunc, identity=..., rule=...) (from innet)")
    if program.memory_bytes() < 0 or program.slots < 0 or program.elements < 1:
        raise UserError(f"program {program.name}: slots and elements must be positive")
    return program


@functools.lru_cache(maxsize=256)
def _sized(path: str, stamp: tuple[int, int], pool_slots: int, packet_elements: int, fan_in: int) -> type[SwitchProgram]:
    """File ``path``'s program, or a subclass of it with the pool, packet size or fan-in a run asks for (the
    same class each time it is asked for)."""
    program = _loaded(path, stamp)
    sized: dict[str, int] = {}
    if pool_slots:
        if not program.slots:
            raise UserError(f"program {program.name} keeps no slot pool: {{pool_slots}} does not apply to it")
        sized["slots"] = pool_slots
    if packet_elements:
        if not 1 <= packet_elements <= MAX_PACKET_ELEMENTS:
            raise UserError(f"{{packet_elements}} must be 1..{MAX_PACKET_ELEMENTS} (a frame must fit a {JUMBO_MTU}-byte "
                            f"jumbo MTU), got {packet_elements}")
        sized["elements"] = packet_elements
    if fan_in > getattr(program, "fan_in", fan_in):
        sized["fan_in"] = fan_in
    if sized:
        program = type(program.__name__, (program,), {**sized, "__module__": program.__module__})
    return program


def _check_handlers(path: str, program: type[SwitchProgram]) -> None:
    """One clear line for a program that cannot run: no handler, a batch handler without its per-packet
    one, or a handler of the wrong shape."""
    packet, timers, starts = program.handlers()
    batch = program.batch_handlers()  # one line for a batch handler without its per-packet one
    if not packet and not timers and not starts:
        raise UserError(f"program file {path}: {program.__name__} has no handler; tag a method with "
                        "@on_packet(\"contribution\"), or subclass Reduction and set its operator")
    wants = {**{m: 3 for m in packet.values()}, **{m: 2 for m in [*timers, *starts]},
             **{m: 3 for m in batch.values()}}
    for method, args in wants.items():
        params = inspect.signature(getattr(program, method)).parameters
        if len(params) != args:
            shape = "(self, ctx, pkt)" if args == 3 else "(self, ctx)"
            raise UserError(f"program file {path}: handler {program.__name__}.{method} must take {shape}, "
                            f"it takes ({', '.join(params)})")


def failure(exc: BaseException, path: str) -> str:
    """``exc``, raised by program code of file ``path``, in a line: what it was and the line of ``path`` it
    came from (the innermost; with no frame of ``path``, the innermost frame's file and line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)]
    at = f"line {mine[-1].lineno}" if mine else f"{frames[-1].filename} line {frames[-1].lineno}" if frames else ""
    what = "" if isinstance(exc, UserError) else type(exc).__name__
    head = " at ".join(x for x in (what, at) if x)
    if isinstance(exc, SystemExit):
        text = f"a program must not exit (its code: {exc.code!r})"
    else:
        text = next(iter(str(exc).strip().splitlines()), "")
    return ": ".join(x for x in (head, text) if x)
