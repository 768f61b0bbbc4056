"""A host's side of a raw port: frames out through the link's fault injector, frames in held for the hop an eBPF
switch in front of it does not hold, and one wake-up of a host endpoint (a worker, a ring member, a PBox shard) at
a time."""

from __future__ import annotations

import heapq
import select
import time
from collections.abc import Sequence

import numpy as np

from innet.hosts.endpoint import Endpoint
from innet.io.rawport import RawPort
from innet.node.config import Faults
from innet.wire.faults import FaultInjector, Hold
from innet.wire.packet import ETH_LEN, ip_to_node


def source(frame: bytes) -> int:
    """The node index a frame's IPv4 source names (-1: none of innet's)."""
    return ip_to_node(int.from_bytes(frame[ETH_LEN + 12:ETH_LEN + 16], "big"))  # IPv4's source address


class Egress:
    """Sends frames out of raw ports through each port's fault injector (delays kept in a heap)."""

    def __init__(self, ports: dict[int, RawPort], faults: Faults) -> None:
        """``faults``: each port's, for the link behind it (innet.wire.faults.fault_seed gives the seeds)."""
        self.ports = ports
        self.injectors = {p: FaultInjector(faults[p].spec, faults[p].seed) for p in ports}
        self.rates = {p: faults[p].rate for p in ports}
        self.hold_out = {p: faults[p].hold_out for p in ports}
        self.last = dict.fromkeys(ports, 0.0)  # each port's latest due time of a frame's delay and serialization
        self.wire = dict.fromkeys(ports, 0.0)  # a pacing port's: when the link will have sent its frames so far
        self.held: list[tuple[float, int, int, bytes | np.ndarray]] = []  # a frame, or a block's rows (``send_block``)
        self.seq = 0
        # frames received, each held for its hop's latency and serialization where the switch in front did not
        # hold them (PortFaults.hold_in: an eBPF switch forwards at once, its port's htb paces; this ends the hop)
        self.hold_in = {p: faults[p] for p in ports if faults[p].hold_in and faults[p].rate}
        self.inbound: list[tuple[float, int, bytes]] = []
        self.ended: dict[tuple[int, Hold], float] = {}  # per port and hold: the hop end of its latest frame received
        for p in self.hold_in:  # its holds start at the kernel's receive stamps: asked now, before a frame can come
            ports[p].stamp_receive()

    def send(self, port: int, frame: bytes, now: float) -> None:
        """``frame`` out of ``port`` after its faults' delay and, where the port has a ``rate``, its serialization:
        not before the port's frame before it (a link sends in order), reordering's extra delay on top. The
        shaper under the port then holds the link to its rate (delay, then pace: a store-and-forward hop).

        Where the link also reorders, the port paces its frames itself: each is held until its own serialization
        behind the port's earlier frames (and a duplicate one more) is over, so that a frame held back lets only the
        frames of those few milliseconds overtake it, as on the fabric's links. Handed to the shaper with the rest
        of a window already queued there, it fell behind the whole window (star of 4, 10 Mbit/s, 1% loss and 1%
        reordering: 14-40 spurious retransmissions a run, seeds 1-3, where the fabric has 1-4)."""
        rate, fixed = self.rates[port], self.injectors[port].spec.delay
        copies = self.injectors[port].apply(frame)
        if not rate:
            for delay, copy in copies:
                if delay <= 0:
                    self.ports[port].send(copy)
                else:
                    self._hold(now + delay, port, copy)
            return
        if self.injectors[port].spec.reorder:
            for delay, copy in copies:
                self.wire[port] = max(now, self.wire[port]) + len(copy) / rate
                self._hold(self.wire[port] + delay, port, copy)
            return
        due = self.last[port] = self._hop_end(port, len(frame), now)
        for delay, copy in copies:
            self._hold(due + delay - fixed, port, copy)

    def _hop_end(self, port: int, size: int, now: float) -> float:
        """When a frame of ``size`` bytes given to a pacing ``port`` at ``now`` ends its hop: its delay, the hops
        between switches it is held for beside (PortFaults.hold_out) and its serialization, not before the port's
        frame before it."""
        out, fixed = self.hold_out[port], self.injectors[port].spec.delay
        return max(now + fixed + out[0] + size * out[1] + size / self.rates[port], self.last[port])

    def _hold(self, due: float, port: int, frame: bytes | np.ndarray) -> None:
        self.seq += 1
        heapq.heappush(self.held, (due, self.seq, port, frame))

    def send_block(self, port: int, block: np.ndarray, now: float) -> None:
        """Send a block of equal-length frames: one sendmmsg per batch where the link has no faults. Where the port
        holds frames for their serialization (a dilated run) on a link that neither loses, duplicates nor reorders,
        every row's hop ends at the same instant (``send``'s, the shaper then paces them): the first row goes out
        alone then and the rest, one sendmmsg, half a frame's serialization later, while the first is still on the
        wire, so the shaper has them before their turn. Sent row by row at that instant (0.18-0.26 ms for a window of
        32 frames under load), a worker held a core from the other workers whose hops ended with it (four on two
        cores, all answered at once by the exponent's multicast): the calibration's eBPF star at 80 Mbit/s took
        1.022 of its links' time (medians of 3, twice, load 12), 1.015 with the rest sent apart."""
        spec, rate = self.injectors[port].spec, self.rates[port]
        if rate and len(block) > 1 and not (spec.loss or spec.dup or spec.reorder):
            size = block.shape[1]
            due = self._hop_end(port, size, now)
            self._hold(due, port, block[0].tobytes())
            self.last[port] = due + size / rate / 2  # nothing overtakes the rest: the link sends in order
            self._hold(self.last[port], port, np.array(block[1:]))  # a copy: the caller's buffer may be reused
        elif spec.active or rate:
            for row in block:
                self.send(port, row.tobytes(), now)
        else:
            self.ports[port].send_block(block)

    def send_all(self, port: int, frames: Sequence[bytes | np.ndarray], now: float) -> None:
        """Send what an endpoint gave: frames, and blocks of frames."""
        for out in frames:
            if isinstance(out, bytes):
                self.send(port, out, now)
            else:
                self.send_block(port, out, now)

    def receive(self, port: int, frames: Sequence[tuple[float, bytes]]) -> None:
        """Hold each frame received on ``port`` until its hop is over: the link's latency and the frame's own
        serialization after the shaper in front let it through (a store-and-forward hop's end), and the hops
        between switches it crossed unheld before (``PortFaults.hold_path``), and not before the frame ahead of it
        is through as well (a link sends one frame at a time): htb's burst lets frames through together, 2 ms of the
        rate at once above 36 Mbit/s, which held from their arrival alone reached the host as early (the
        calibration's eBPF star at 80 Mbit/s in 0.98 of its links' time). A frame from a source in
        ``PortFaults.hold_from`` (a ring's acknowledgements, from the other side) is held for its own route's hops,
        behind the frames held alike: a frame held longer is not yet through when it comes."""
        link = self.hold_in[port]
        for came, frame in frames:
            hold = link.hold_from.get(source(frame), link.hold_path) if link.hold_from else link.hold_path
            serialization = len(frame) / link.rate
            due = max(came + link.spec.delay + hold[0] + len(frame) * hold[1] + serialization,
                      self.ended.get((port, hold), 0.0) + serialization)
            self.ended[port, hold] = due
            self.seq += 1
            heapq.heappush(self.inbound, (due, self.seq, frame))

    def arrived(self, now: float) -> list[tuple[float, bytes]]:
        """The frames received whose hop is over by ``now``, each with the instant it was over, in that order."""
        out = []
        while self.inbound and self.inbound[0][0] <= now:
            due, _, frame = heapq.heappop(self.inbound)
            out.append((due, frame))
        return out

    def flush(self, now: float) -> None:
        """Send what is due by ``now``, in order: frames, and the rest of a block at once (``send_block``)."""
        while self.held and self.held[0][0] <= now:
            _, _, port, frame = heapq.heappop(self.held)
            if isinstance(frame, bytes):
                self.ports[port].send(frame)
            else:
                self.ports[port].send_block(frame)

    def settle(self, now: float) -> bool:
        """A host that has finished: send what is due by ``now`` and forget what it received (a predecessor's DONE
        repeats coming after it finished: a worker alone in its process has exited by then, its socket unread);
        True once it has nothing left to send. Held, those frames' past hop ends kept a node group's finished
        worker live with its poll's timeout 0: a k=8 ring's worker processes spun for minutes after their calls."""
        self.flush(now)
        self.inbound.clear()
        return not self.held

    def next_due(self) -> float | None:
        due = [q[0][0] for q in (self.held, self.inbound) if q]
        return min(due) if due else None

    def drain(self) -> None:
        """Send every frame still held for its link's delay, each when it is due: a host sends what it said
        before it leaves (a ring rank's last ACKs and its DONE among them)."""
        while self.held:
            time.sleep(max(0.0, self.held[0][0] - time.monotonic()))
            self.flush(time.monotonic())

    def lost(self) -> int:
        return sum(i.lost for i in self.injectors.values())


def wait_ms(*deadlines: float | None) -> int:
    due = [d for d in deadlines if d is not None]
    if not due:
        return 1000
    return max(0, min(1000, int((min(due) - time.monotonic()) * 1000) + 1))


def readable(fds: Sequence[int], *deadlines: float | None) -> list[int]:
    """Wait until one of ``fds`` is readable or the earliest of ``deadlines`` (1 s at most): the ones readable.
    select()'s timeout is to the microsecond where poll()'s is whole milliseconds (``wait_ms`` rounds up and adds
    one): a host's holds end hops of a frame's time or less (0.4 ms at 160 Mbit/s with jumbo frames), and every
    millisecond a hold overslept went on the run's time (each eBPF hop ends at a host)."""
    due = [d for d in deadlines if d is not None]
    wait = max(0.0, min(1.0, min(due) - time.monotonic())) if due else 1.0
    return select.select(fds, [], [], wait)[0]


def feed(port: RawPort, endpoint: Endpoint, egress: Egress, now: float) -> None:
    """Hand a host endpoint what its port has received, and send what it says (what its link holds first,
    frame by frame, when its hop is over: ``expire``)."""
    if 0 in egress.hold_in:
        egress.receive(0, port.recv_stamped())
    elif hasattr(endpoint, "receive_block"):
        block = port.recv_block()
        if block is not None:
            egress.send_all(0, endpoint.receive_block(block, now), now)
    else:
        for frame in port.recv_batch():
            egress.send_all(0, endpoint.receive(frame, now), now)


def expire(endpoint: Endpoint, egress: Egress, now: float) -> None:
    """The frames received whose hop is over, then a host endpoint's deadline if it has passed; then the frames
    whose delay is over go out. A held frame reaches the endpoint at the instant its hop ended, as a receive
    timestamp would say, not when this process woke: what it answers is held from then, so a late wake-up is
    absorbed by the next hop's hold where it is shorter (and shows where it is not)."""
    for due, frame in egress.arrived(now):
        egress.send_all(0, endpoint.receive(frame, due), due)
    deadline = endpoint.next_deadline()
    if deadline is not None and deadline <= now:
        egress.send_all(0, endpoint.on_timeout(now), now)
    egress.flush(now)


def serve_once(port: RawPort, endpoint: Endpoint, egress: Egress, wake: float | None = None) -> bool:
    """One wake-up of a host endpoint: wait for frames or its deadline, feed it, send what it says.
    Whether frames came."""
    woken = bool(readable([port.fileno()], endpoint.next_deadline(), egress.next_due(), wake))
    if woken:
        hold = endpoint.holdoff() if hasattr(endpoint, "holdoff") else 0.0
        due = egress.next_due()
        if due is not None:  # frames held for a link's delay go out on time: hold no longer than until then
            hold = min(hold, due - time.monotonic())
        if hold > 0:
            time.sleep(hold)
        feed(port, endpoint, egress, time.monotonic())
    expire(endpoint, egress, time.monotonic())
    return woken
