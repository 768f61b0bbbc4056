"""SwitchML-style in-network all-reduce, hierarchical when the plan says so.

Each job owns a range of the slot pool. Workers stream their tensor through it:
chunk ``c`` goes to slot ``c % slots`` with version ``(c // slots) % 2``, and a
worker sends the slot's next chunk only after the slot's result came back. Per
slot and version the switch keeps a contributor bitmap (exactly-once), the
chunk number (stale packets are dropped), the running int32 sum, the max
exponent, and whether the sum overflowed. A complete slot is multicast down at
the root, or sent up as one contribution to the parent switch elsewhere. The
other version is the shadow copy: it keeps the previous result so a worker who
lost it gets it again when it retransmits.

A slot left incomplete for the job's ``stall_timeout`` (a crashed worker)
aborts the job: the switch frees the job's slots and floods an ABORT through
the job's tree naming the contributors that never came, so every worker fails
at once with that name, and the next job finds the slots clean.
"""

from __future__ import annotations

import numpy as np

from innet import (
    ABORT,
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
    make_packet,
    on_packet,
    on_timer,
)

COLLECTING, WAITING, DONE = 0, 1, 2


class SumAllreduce(SwitchProgram):
    name = "sum_allreduce"
    slots = 128
    elements = 256
    versions = 2
    registers = (
        Register("pool", ("versions", "slots", "elements"), np.int32),
        Register("seen", ("versions", "slots"), np.uint64),
        Register("chunk", ("versions", "slots"), np.int64, fill=-1),
        Register("state", ("versions", "slots"), np.uint8),
        Register("exp", ("versions", "slots"), np.int8),
        Register("overflow", ("versions", "slots"), np.bool_),
        Register("since", ("versions", "slots"), np.float64),
    )

    @on_packet("contribution")
    def contribution(self, ctx, pkt):
        job = ctx.jobs.get(pkt.job)
        if job is None:
            return Drop("unknown_job")
        if not job.aggregate:
            return Emit(job.parent, pkt)
        bit = job.bits.get(pkt.rank)
        if bit is None or job.contributors[pkt.rank] != pkt.port:
            return Drop("not_member")
        if pkt.slot >= job.slots or pkt.count > self.elements:
            return Drop("bad_slot")
        r, v, i = ctx.regs, pkt.version, job.slot_base + pkt.slot
        if pkt.chunk < r.chunk[v, i]:
            return Drop("stale")
        if pkt.chunk > r.chunk[v, i]:  # first packet of a new round in this slot
            r.chunk[v, i], r.seen[v, i], r.state[v, i] = pkt.chunk, 0, COLLECTING
            r.exp[v, i], r.overflow[v, i], r.since[v, i] = pkt.exp, False, ctx.now
            r.pool[v, i, : pkt.count] = pkt.values
        elif int(r.seen[v, i]) & bit:  # a retransmission: answer from what we have
            if r.state[v, i] == DONE:
                return Emit(pkt.port, self._packet(ctx, job, pkt, v, i, RESULT, rank=pkt.rank))
            if r.state[v, i] == WAITING:
                return Emit(job.parent, self._packet(ctx, job, pkt, v, i, RETX, rank=job.rank))
            return Drop("duplicate")
        else:
            self._add(r, v, i, pkt.values)
            r.exp[v, i] = max(int(r.exp[v, i]), pkt.exp)
        r.seen[v, i] = int(r.seen[v, i]) | bit
        if int(r.seen[v, i]) != job.full:
            return None
        if job.is_root:
            r.state[v, i] = DONE
            return Multicast(job.children, self._packet(ctx, job, pkt, v, i, RESULT, rank=ALL_RANKS))
        r.state[v, i] = WAITING
        return Emit(job.parent, self._packet(ctx, job, pkt, v, i, 0, rank=job.rank))

    @on_packet("result")
    def result(self, ctx, pkt):
        job = ctx.jobs.get(pkt.job)
        if job is None or pkt.port != job.parent:
            return Drop("unknown_job" if job is None else "result_from_child")
        if not job.aggregate:
            port = job.rank_ports.get(pkt.rank)
            return Multicast(job.children, pkt) if port is None else Emit(port, pkt)
        if pkt.slot >= job.slots or pkt.count > self.elements:
            return Drop("bad_slot")
        r, v, i = ctx.regs, pkt.version, job.slot_base + pkt.slot
        if pkt.chunk != r.chunk[v, i] or r.state[v, i] != WAITING:
            return Drop("stale")
        r.pool[v, i, : pkt.count] = pkt.values
        r.exp[v, i], r.overflow[v, i], r.state[v, i] = pkt.exp, pkt.has(OVERFLOW), DONE
        return Multicast(job.children, self._packet(ctx, job, pkt, v, i, RESULT, rank=ALL_RANKS))

    @on_timer(0.05)
    def watch_stalls(self, ctx):
        """Abort every job with a slot that has waited too long for a contribution."""
        actions = []
        for job in ctx.jobs.values():
            if not job.aggregate or job.stall_timeout <= 0:
                continue
            r, part = ctx.regs, slice(job.slot_base, job.slot_base + job.slots)
            stuck = (r.state[:, part] == COLLECTING) & (r.chunk[:, part] >= 0) & (ctx.now - r.since[:, part] > job.stall_timeout)
            if stuck.any():
                v, i = (int(x[0]) for x in np.nonzero(stuck))
                seen = int(r.seen[v, job.slot_base + i])
                missing = [rank for rank, bit in job.bits.items() if not seen & bit]
                ctx.count("aborted_jobs")
                self._free(ctx, job)
                note = make_packet(np.array([ctx.node, *missing]), job=job.job, rank=ALL_RANKS, flags=ABORT)
                ports = (*job.children, *(() if job.parent is None else (job.parent,)))
                actions.append(Multicast(ports, note))
        return actions

    @on_packet("abort")
    def abort(self, ctx, pkt):
        """Another switch aborted the job: free its slots here and pass the news along the tree."""
        job = ctx.jobs.get(pkt.job)
        if job is None:
            return Drop("unknown_job")
        ports = (*job.children, *(() if job.parent is None else (job.parent,)))
        if pkt.port not in ports:
            return Drop("not_member")
        self._free(ctx, job)
        return Multicast(tuple(p for p in ports if p != pkt.port), pkt)

    @staticmethod
    def _free(ctx, job):
        if job.aggregate:
            part = slice(job.slot_base, job.slot_base + job.slots)
            ctx.regs.chunk[:, part], ctx.regs.seen[:, part], ctx.regs.state[:, part] = -1, 0, COLLECTING

    @staticmethod
    def _add(r, v, i, values):
        acc = r.pool[v, i, : len(values)]
        total = acc + values  # int32 arithmetic wraps, like the switch's ALU
        if np.any((acc ^ total) & (values ^ total) < 0):
            r.overflow[v, i] = True
        acc[:] = total

    @staticmethod
    def _packet(ctx, job, pkt, v, i, flags, rank):
        """The slot's current sum as a packet (a result, or a partial going up)."""
        flags |= (VER if v else 0) | (OVERFLOW if ctx.regs.overflow[v, i] else 0)
        values = ctx.regs.pool[v, i, : pkt.count].copy()
        return pkt.replace(values, rank=rank, flags=flags, exp=int(ctx.regs.exp[v, i]), nworkers=job.nworkers)
