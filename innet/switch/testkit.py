"""A test kit for switch-program authors: one program on one switch, hand-built frames, no network.

``Harness`` puts a program on a switch that aggregates one job for ``workers`` workers, worker
``rank`` behind port ``rank + 1`` (the switch is the job's root, as a rack's ToR is for a job inside
the rack). Frames go through the real runtime, per packet or as a block, and what the switch sends
comes back as packets that remember their port::

    from innet.switch.testkit import Harness

    def test_max():
        sw = Harness("max_allreduce", workers=3)
        sw.contribute(0, [1, 5])
        sw.contribute(1, [4, 2])
        out = sw.contribute(2, [3, 3])
        assert sw.ports(out) == [1, 2, 3] and out[0].values.tolist() == [4, 5]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from innet.switch.loader import load_program
from innet.switch.program import JobPort, SwitchProgram
from innet.switch.runtime import SwitchConfig, SwitchRuntime
from innet.wire.packet import RETX, ROUTE, VER, Packet, make_packet, parse_frame

SWITCH_NODE = 100  # the switch's node index; worker ``rank`` is node ``rank``


class Harness:
    """One ``program`` (a name in switch_programs/, a path, or a SwitchProgram class) on one switch."""

    def __init__(self, program: str | type[SwitchProgram], workers: int = 3, job: int = 1, slots: int | None = None,
                 now: float = 0.0) -> None:
        self.program = load_program(program, fan_in=workers) if isinstance(program, str) else program
        self.job, self.workers, self.now = job, workers, now
        self.slots = slots if slots is not None else min(8, self.program.slots) if self.program.slots else 0
        ports = {rank + 1: f"s-eth{rank + 1}" for rank in range(workers)}
        jobs = {job: JobPort(job=job, nworkers=workers, children=tuple(ports), parent=None, aggregate=True,
                             contributors={r: r + 1 for r in range(workers)}, rank=0,
                             rank_ports={r: r + 1 for r in range(workers)}, slots=self.slots)} if self.slots else {}
        self.config = SwitchConfig(name="s", node=SWITCH_NODE, tier="tor", ports=ports,
                                   neighbors={rank + 1: rank for rank in range(workers)},
                                   routes={rank: rank + 1 for rank in range(workers)}, jobs=jobs)
        self.runtime = SwitchRuntime(self.config, self.program)

    @property
    def regs(self) -> Any:
        """The switch's registers (numpy arrays, as the program declared them)."""
        return self.runtime.ctx.regs

    @property
    def counters(self) -> dict[str, int]:
        """Drops (``drop:<reason>``) and whatever else the program counted."""
        return self.runtime.ctx.counters

    def packet(self, rank: int, values: Sequence[int] | np.ndarray, chunk: int = 0, exp: int = 0, retx: bool = False,
               **fields: int) -> bytes:
        """The frame worker ``rank`` sends for ``chunk`` (slot and version follow from it)."""
        slots = max(self.slots, 1)
        flags = (VER if (chunk // slots) % 2 else 0) | (RETX if retx else 0) | fields.pop("flags", 0)
        pkt = make_packet(np.asarray(values, np.int32), **{"job": self.job, "rank": rank, "nworkers": self.workers,
                                                           "slot": chunk % slots, "chunk": chunk, "exp": exp,
                                                           "flags": flags, **fields})
        return pkt.to_frame(rank, SWITCH_NODE)

    def contribute(self, rank: int, values: Sequence[int] | np.ndarray, chunk: int = 0, exp: int = 0,
                   retx: bool = False, **fields: int) -> list[Packet]:
        """Worker ``rank``'s contribution through the per-packet path; the packets the switch sent."""
        return self.receive(rank + 1, self.packet(rank, values, chunk, exp, retx, **fields))

    def routed(self, src: int, dst: int, values: Sequence[int] | np.ndarray, **fields: int) -> list[Packet]:
        """A packet routed by address (PBox and ring traffic) from worker ``src`` to worker ``dst``."""
        pkt = make_packet(np.asarray(values, np.int32), **{"job": self.job, "rank": src, "flags": ROUTE, **fields})
        return self.receive(src + 1, pkt.to_frame(src, dst))

    def receive(self, port: int, frame: bytes) -> list[Packet]:
        """Any frame, arriving on ``port`` (1-based: the port of worker ``port - 1``)."""
        return self._parsed(self.runtime.receive(port, frame, self.now))

    def receive_block(self, port: int, frames: list[bytes]) -> list[Packet]:
        """Frames that arrived together on ``port``: the program's batch handlers see them at once."""
        return self._parsed(self.runtime.receive_frames(port, frames, self.now))

    def tick(self, seconds: float) -> list[Packet]:
        """Let ``seconds`` pass: the program's timers run."""
        self.now += seconds
        return self._parsed(self.runtime.run_timers(self.now))

    @staticmethod
    def ports(packets: list[Packet]) -> list[int]:
        return [p.port for p in packets]

    @staticmethod
    def _parsed(frames: list[tuple[int, bytes]]) -> list[Packet]:
        out = []
        for port, frame in frames:
            pkt = parse_frame(frame, port)
            assert pkt is not None, f"the switch sent a frame innet cannot parse on port {port}"
            out.append(pkt)
        return out

