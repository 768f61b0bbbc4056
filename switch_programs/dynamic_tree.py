"""Dynamic aggregation trees (Canary): each switch picks, chunk by chunk, the least congested way up.

Run with ``--placement dynamic`` (innet.planning.dynamic says what each switch knows: its uplinks,
the port towards the job's root, the ranks that may pass it). A partial aggregate carries the
set of ranks it holds as a bitmap after its values (``rank`` = PARTIAL). A switch folds whatever
arrives for a chunk; the first arrival picks the chunk's way on: down the route once the root is
below, else up an uplink — the one the rotation names (so partials meet when nothing is
congested), unless another carries clearly less (a decayed byte count per port, kept in registers,
fed by every frame the switch sends, background traffic included). The partial goes on as soon as
every rank that may pass this switch is in it, or ``window`` seconds (the job's, if longer) after its first arrival (an
incomplete partial goes on, as Canary's timeout sends it); anything later for that chunk follows on
its own, and the switch waits that long for the job's chunks from then on (``_learn``). The root
folds partials whose ranks it lacks (never one that overlaps what it has: the ranks missing from it
retransmit), and floods the result: up one uplink per switch, down to every worker. Retransmissions
skip aggregation on the way up (the partial their first copy joined may be lost after a switch
counted it) and a finished chunk's root answers them with its result.
"""

from __future__ import annotations

import math

import numpy as np

from innet import (
    ALL_RANKS,
    OVERFLOW,
    RESULT,
    RETX,
    VER,
    Drop,
    Emit,
    Multicast,
    Register,
    SwitchProgram,
    on_batch,
    on_packet,
    on_timer,
)
from innet.wire.packet import make_packet

PARTIAL = 0xFFFE  # the rank field of a partial aggregate
FRAME_OVERHEAD = 58  # bytes of headers before a frame's values


def _bits_of(words):
    return int.from_bytes(np.ascontiguousarray(words, np.int32).tobytes(), "little")


class DynamicTree(SwitchProgram):
    name = "dynamic_tree"
    dynamic = True  # needs --placement dynamic's plan (innet.planning.dynamic)
    slots = 128
    elements = 2048  # a partial is 8 values longer (its bitmap): 8282 bytes still fit a jumbo frame (MAX_PACKET_ELEMENTS)
    fan_in = 256  # ranks a bitmap holds
    extra_values = 8  # a partial's bitmap after its values: links carry frames this much longer than a chunk's
    window = 4e-4  # seconds a partial waits for more contributions before it goes on (6 frames at 1 Gbit/s: at 200 µs
    # Mininet's jitter split most chunks, and dynamic trees there gained nothing on the leaf-spine)
    tick = 100e-6  # seconds between the timer's looks for partials that waited ``window``
    late_cap = 3.0  # a switch widens its window for latecomers (``_learn``) to this many windows at most
    hold = window + tick  # the most a switch holds a chunk's partial: results come back out of order by this much
    tau = 200e-6  # seconds over which a port's byte count decays (its congestion estimate): 3 jumbo frames at 1 Gbit/s,
    # as many of a job's frames where its links are slower (``_tau``)
    margin = 1.5  # leave the rotation's uplink when its cross traffic is this much more than the least's
    slack = 6000  # ... and this many bytes more (a few frames: light traffic moves nothing)
    registers = (
        Register("pool", (lambda p: 2 * p.slots, "elements"), np.int32),
        Register("bits", (lambda p: 2 * p.slots, lambda p: -(-p.fan_in // 32)), np.int32),  # folded, not yet sent
        Register("sent", (lambda p: 2 * p.slots, lambda p: -(-p.fan_in // 32)), np.int32),  # ranks already sent on
        Register("chunk", (lambda p: 2 * p.slots,), np.int64, fill=-1),
        Register("count", (lambda p: 2 * p.slots,), np.int32),
        Register("exp", (lambda p: 2 * p.slots,), np.int8),
        Register("overflow", (lambda p: 2 * p.slots,), np.bool_),
        Register("since", (lambda p: 2 * p.slots,), np.float64, fill=-1),  # first arrival of the waiting partial
        Register("first", (lambda p: 2 * p.slots,), np.float64, fill=-1),  # first arrival of the chunk here
        Register("late", (64,), np.float64),  # per job: how far behind its first a chunk's latecomer came (``_learn``)
        Register("way", (lambda p: 2 * p.slots,), np.int16, fill=-1),  # the port the chunk's partials take
        Register("owner", (lambda p: 2 * p.slots,), np.int32),  # the job of the slot's chunk
        Register("load", (64,), np.float64),  # decayed bytes of cross traffic (routed frames) sent per port
        Register("stamp", (64,), np.float64),  # when ``load`` was last decayed
    )

    # -- contributions ---------------------------------------------------------
    @on_packet("contribution")
    def contribution(self, ctx, pkt):
        job = ctx.jobs.get(pkt.job)
        if job is None:
            return Drop("unknown_job")
        got = self._take(job, pkt)
        if isinstance(got, Drop):
            return got
        bits, values = got
        if job.is_root:
            return self._at_root(ctx, job, pkt, bits, values)
        if pkt.flags & RETX:  # straight on to the root, unaggregated
            return self._emit(ctx, job.parent, self._partial(job, pkt, bits, values, pkt.flags), job)
        key = self._current(ctx, job, pkt)
        if key is None:
            return Drop("stale")
        r = ctx.regs
        have, sent = self._get(r.bits[key]), self._get(r.sent[key])
        if bits & ~(have | sent) != bits:  # some of it was here already
            if bits & (have | sent) == bits:
                return Drop("duplicate")
            return self._emit(ctx, int(r.way[key]), self._partial(job, pkt, bits, values, pkt.flags), job)
        if r.since[key] < 0 and sent:  # this chunk's partial went on: a latecomer follows alone
            self._learn(ctx, job, key)
            self._put(r.sent[key], sent | bits)
            return self._emit(ctx, int(r.way[key]), self._partial(job, pkt, bits, values, pkt.flags), job)
        if len(values) != r.count[key] and have:
            return Drop("bad_count")
        self._fold(r, key, pkt, bits, have, values)
        if r.since[key] < 0:  # the partial's first arrival: it waits ``window`` at most
            r.since[key] = ctx.now
            if r.first[key] < 0:
                r.first[key] = ctx.now
        if (have | bits | sent) == self._cone(job):
            return self._flush(ctx, job, key)
        return None

    def _current(self, ctx, job, pkt):
        """The packet's chunk's register row, opened afresh for a newer chunk; None for a stale packet."""
        key = self._key(job, pkt)
        held = int(ctx.regs.chunk[key])
        if pkt.chunk < held:
            return None
        if pkt.chunk > held:
            self._open(ctx, job, key, pkt)
        return key

    def _at_root(self, ctx, job, pkt, bits, values):
        key = self._current(ctx, job, pkt)
        if key is None:
            return Drop("stale")
        r = ctx.regs
        have, everyone = self._get(r.bits[key]), self._cone(job)
        if have == everyone:  # done: a repeat is answered with the result, back the way it came, to its ranks alone
            return self._answers(ctx, job, key, bits, pkt.port) if bits & have == bits and pkt.flags & RETX else Drop("duplicate")
        if bits & have:
            return Drop("overlap")  # the ranks it has that the root lacks retransmit
        if len(values) != r.count[key] and have:
            return Drop("bad_count")
        self._fold(r, key, pkt, bits, have, values)
        return self._result(ctx, job, key) if have | bits == everyone else None

    @on_timer(tick)
    def timeouts(self, ctx):
        """Send on every partial that has waited ``window``: incomplete, as Canary does."""
        r, out = ctx.regs, []
        waiting = np.flatnonzero(r.since >= 0)
        if not len(waiting):
            return out
        waits = np.array([self._wait(ctx, ctx.jobs[o]) for o in r.owner[waiting].tolist()])
        for key in waiting[r.since[waiting] + waits <= ctx.now].tolist():
            ctx.count("partial_on_timeout")
            out += self._flush(ctx, ctx.jobs[int(r.owner[key])], key)
        return out

    # -- results ---------------------------------------------------------------
    @on_packet("result")
    def result(self, ctx, pkt):
        job = ctx.jobs.get(pkt.job)
        if job is None:
            return Drop("unknown_job")
        if pkt.rank < job.nworkers and pkt.rank in job.rank_ports:  # an answer to that rank's retransmission
            return [Emit(job.rank_ports[pkt.rank], pkt, job.priority)]
        from_above = pkt.port in job.uplinks
        down = tuple(p for p in job.children if p != pkt.port)
        out = [Multicast(down, pkt, job.priority)] if down else []
        if not from_above and job.uplinks:
            out.append(self._emit(ctx, self._choose(ctx, job, pkt.chunk), pkt, job))
        return out

    # -- background and other routed traffic: forwarded, and counted per port ---------------------
    @on_packet("routed")
    def routed(self, ctx, pkt):
        action = ctx.route(pkt)
        if isinstance(action, Emit):
            self._add(ctx, action.port, FRAME_OVERHEAD + 4 * len(pkt.values))
        return action

    @on_batch("routed")
    def routed_block(self, ctx, batch):
        actions = ctx.route_many(batch)
        for a in actions:
            self._add(ctx, a.port, len(a.hdr) * FRAME_OVERHEAD + 4 * a.values.size)
        return actions, np.zeros(0, np.int64)

    # -- helpers -----------------------------------------------------------------
    def _take(self, job, pkt):
        """(rank bitmap as an int, values) of a worker's contribution or a partial, or a Drop."""
        if pkt.rank == PARTIAL:
            w = self._words(job)
            if pkt.count < w:
                return Drop("bad_partial")
            bits = _bits_of(pkt.values[-w:])
            if not bits or bits & ~self._cone(job):
                return Drop("not_member")
            return bits, pkt.values[:-w]
        if job.contributors.get(pkt.rank, -2) != pkt.port:
            return Drop("not_member")
        return 1 << pkt.rank, pkt.values

    def _open(self, ctx, job, key, pkt):
        """A new chunk in slot ``key``: nothing folded or sent; its way on chosen now."""
        r = ctx.regs
        r.chunk[key], r.bits[key], r.sent[key], r.count[key], r.since[key], r.first[key] = pkt.chunk, 0, 0, 0, -1, -1
        r.exp[key], r.overflow[key], r.owner[key] = pkt.exp, False, job.job
        r.way[key] = -1 if job.is_root else self._choose(ctx, job, pkt.chunk) if job.parent in job.uplinks else job.parent

    def _fold(self, r, key, pkt, bits, have, values):
        n = len(values)
        if not have:
            r.pool[key, :n], r.count[key], r.exp[key], r.overflow[key] = values, n, pkt.exp, bool(pkt.flags & OVERFLOW)
        else:
            acc = r.pool[key, :n]
            total = acc + values  # int32: wraps
            if n and ((acc ^ total) & (values ^ total)).min() < 0:
                r.overflow[key] = True
            acc[:] = total
            r.exp[key] = max(int(r.exp[key]), pkt.exp)
            r.overflow[key] |= bool(pkt.flags & OVERFLOW)
        self._put(r.bits[key], have | bits)

    def _flush(self, ctx, job, key):
        """Send slot ``key``'s partial on its way; its ranks are sent."""
        r = ctx.regs
        have = self._get(r.bits[key])
        r.since[key] = -1
        if not have:
            return []
        self._put(r.sent[key], have | self._get(r.sent[key]))
        self._put(r.bits[key], 0)
        n = int(r.count[key])
        flags = (VER if key >= self.slots else 0) | (OVERFLOW if r.overflow[key] else 0)
        out = self._packet(job, key, r, flags, PARTIAL, np.concatenate([r.pool[key, :n], self._bitmap(job, have)]))
        return [self._emit(ctx, int(r.way[key]), out, job)]

    def _result(self, ctx, job, key):
        r = ctx.regs
        res = self._result_packet(job, key, r, ALL_RANKS)
        out = [Multicast(job.children, res, job.priority)]
        if job.uplinks:
            out.append(self._emit(ctx, self._choose(ctx, job, int(r.chunk[key])), res, job))
        return out

    def _answers(self, ctx, job, key, bits, port):
        """The result, once for each rank of ``bits``, addressed to it and sent out on ``port`` (where its retransmission
        came in: every switch on the way passes it on towards that rank alone, JobPort.rank_ports)."""
        return [Emit(port, self._result_packet(job, key, ctx.regs, rank), job.priority)
                for rank in range(job.nworkers) if bits >> rank & 1]

    def _result_packet(self, job, key, r, rank):
        """Slot ``key``'s result, addressed to ``rank`` (ALL_RANKS: every worker)."""
        flags = RESULT | (VER if key >= self.slots else 0) | (OVERFLOW if r.overflow[key] else 0)
        return self._packet(job, key, r, flags, rank, r.pool[key, :int(r.count[key])].copy())

    def _packet(self, job, key, r, flags, rank, values):
        return make_packet(values, job=job.job, rank=rank, nworkers=job.nworkers, slot=key % self.slots - job.slot_base,
                           chunk=int(r.chunk[key]), flags=flags, exp=int(r.exp[key]))

    def _partial(self, job, pkt, bits, values, flags):
        return pkt.replace(np.concatenate([values, self._bitmap(job, bits)]), rank=PARTIAL, flags=int(flags))

    def _choose(self, ctx, job, chunk):
        """The uplink for ``chunk``: the rotation's, unless its cross traffic is more than ``margin`` times the
        least's (and ``slack`` bytes)."""
        ups = job.uplinks
        turn = ups[(chunk // job.stride) % len(ups)]
        loads = [self._load(ctx, p) for p in ups]
        least = ups[int(np.argmin(loads))]
        if self._load(ctx, turn) > self.margin * self._load(ctx, least) + self.slack:
            ctx.count("moved_off_loaded_uplink")
            return least
        return turn

    def _wait(self, ctx, job):
        """Seconds a partial of ``job`` waits for more contributions: the program's window, or the job's where longer
        (a frame and a half of its slowest link: innet.planning.dynamic.partial_window), or what this switch learnt
        its latecomers need (``_learn``), on the switch's clock."""
        return max(self.window, job.window, float(ctx.regs.late[job.job % 64])) * ctx.clock

    def _learn(self, ctx, job, key):
        """A latecomer to slot ``key``'s chunk, whose partial went on without it: wait that long from now on (and a
        tenth and a tick more), up to ``late_cap`` windows. One child's stream a fixed way behind the others' (a
        background frame queued ahead of its first chunk: 1.6 frames at t1 on Mininet, fat-tree k=4 beside 50%
        permutation) split every chunk's partial at that switch for the rest of the run and doubled its uplink's
        frames: 0.34-0.46 s against 0.24."""
        r, base = ctx.regs, max(self.window, job.window)
        lag = (ctx.now - r.first[key]) / ctx.clock
        if r.first[key] >= 0 and lag > self._wait(ctx, job) / ctx.clock:
            r.late[job.job % 64] = min(1.1 * lag + self.tick, self.late_cap * base)
            ctx.count("window_widened")

    def _emit(self, ctx, port, pkt, job):
        return Emit(port, pkt, job.priority)

    def _add(self, ctx, port, nbytes):
        self._load(ctx, port)
        ctx.regs.load[port] += nbytes

    def _load(self, ctx, port):
        """Port ``port``'s decayed byte count, decayed to now."""
        r = ctx.regs
        r.load[port] *= math.exp(-(ctx.now - r.stamp[port]) / (self._tau(ctx) * ctx.clock))
        r.stamp[port] = ctx.now
        return float(r.load[port])

    def _tau(self, ctx):
        """Seconds over which the ports' byte counts decay: ``tau``, or twice the longest job's partial window where
        longer (JobPort.window: 1.5 frames of its slowest link). At 10 Mbit/s the 200 µs count forgot each frame
        before the next came and saw no background: fat-tree k=4 beside 50% permutation, seeds 1-3, 0.34, 0.26,
        0.55 s and 67 retransmissions in one (static 0.25); with 20 ms 0.24 s each."""
        cached = self.__dict__.get("_taus")
        if cached is None or cached[0] is not ctx.jobs:
            cached = self.__dict__["_taus"] = (ctx.jobs, max([self.tau, *(2 * j.window for j in ctx.jobs.values())]))
        return cached[1]

    def _key(self, job, pkt):
        return (self.slots if pkt.flags & VER else 0) + job.slot_base + pkt.slot

    def _words(self, job):
        return -(-job.nworkers // 32)

    def _cone(self, job):
        cached = self.__dict__.setdefault("_cones", {})
        if job.job not in cached or cached[job.job][0] is not job:
            cached[job.job] = (job, sum(1 << r for r in job.contributors))
        return cached[job.job][1]

    def _bitmap(self, job, bits):
        return np.frombuffer(bits.to_bytes(4 * self._words(job), "little"), np.int32)

    @staticmethod
    def _get(words):
        return _bits_of(words)

    @staticmethod
    def _put(words, bits):
        words[:] = np.frombuffer(bits.to_bytes(4 * len(words), "little"), np.int32)
