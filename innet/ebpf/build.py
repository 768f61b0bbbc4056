"""What ``--data-plane ebpf`` can run, and its program built once per run: clang, cached by digest.

The tc program (switch.c) is Reduction's protocol for the built-in SUM operator on innet's fixed-point
int32 wire, dense, for every collective (``COLLECTIVES``), and the runtime's default forwarding of routed
frames (ring, PBox) by the route table: with ``--mode pbox`` or ``ring`` it forwards them for any program
that leaves them to that default. Anything else — another operator or a program of one's own aggregating
in the switches, sparse or dynamic trees, a run whose ports inject faults (the Python switch's ports do
that), node groups, clusters — runs on the Python switch: ``unsupported`` says why in a few words, for the
one line the run logs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources

from innet.errors import UserError
from innet.switch.program import SwitchProgram
from innet.switch.reduction import Reduction
from innet.wire.operators import SUM
from innet.wire.packet import GROUP_BASE

SOURCE = "switch.c"
MAX_PORTS = 64  # switch.c's MAX_PORTS: port numbers and children per job
MAX_NODES = GROUP_BASE  # switch.c's MAX_NODES: the route table's destinations (groups start there)
FAN_IN = 64  # one 64-bit bitmap word per slot
# the collectives switch.c aggregates, all six: every rank's values combined (none: a barrier's headers), the result to
# every rank or (its values; the others a header: innet.switch.routed) to one; or one rank's values replicated
# (all-gather, broadcast: the others send headers alone) to every rank
COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier")
CLANG = ("clang", "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-I/usr/include/x86_64-linux-gnu")


def source() -> bytes:
    return resources.files("innet.ebpf").joinpath(SOURCE).read_bytes()


def unsupported_routing(program: type[SwitchProgram]) -> str:
    """Why the eBPF switch cannot forward ``program``'s routed frames ("" when it can: it leaves them to the
    runtime's default, ``Context.route``)."""
    if "routed" in program.handlers()[0]:
        return f"program {program.name} handles routed frames itself"
    return ""


def unsupported_program(program: type[SwitchProgram]) -> str:
    """Why ``program`` has no eBPF translation ("" when it has one): a Reduction with SUM, dense, unchanged handlers,
    routed frames left to the default."""
    if not (isinstance(program, type) and issubclass(program, Reduction)) or program.operator is not SUM:
        return f"program {program.name} is not the built-in sum reduction"
    if program.sparse or program.fan_in > FAN_IN:
        return f"program {program.name} is sparse or tracks more than {FAN_IN} contributors a slot"
    below = program.__mro__[:program.__mro__.index(Reduction)]
    mine = {name for cls in below for name, value in vars(cls).items() if callable(value)}
    if mine & {name for name, value in vars(Reduction).items() if callable(value)}:
        return f"program {program.name} overrides Reduction's handlers"
    return unsupported_routing(program)


def object_path(elements: int, keys: int, cache: str) -> str:
    """The built program for ``elements`` values a packet and ``keys`` slots (both versions): from ``cache``
    when built before (by the digest of its source and build), else built there now."""
    defines = (f"-DELEMS={elements}", f"-DKEYS={keys}")
    text = source()
    digest = hashlib.sha256(text + repr((CLANG, defines)).encode()).hexdigest()[:16]
    path = os.path.join(cache, "ebpf", f"switch-{digest}.o")
    if os.path.exists(path):
        return path
    if shutil.which(CLANG[0]) is None:
        raise UserError("{data_plane} ebpf needs clang and libbpf-dev (make deps installs them)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, SOURCE)
        with open(src, "wb") as f:
            f.write(text)
        built = os.path.join(tmp, "switch.o")
        done = subprocess.run([*CLANG, *defines, "-c", src, "-o", built], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            line = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise UserError(f"{{data_plane}} ebpf: clang could not build {SOURCE}: {line}")
        os.replace(built, path + ".tmp")
        os.replace(path + ".tmp", path)
    return path
