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

Packets arriving together are summed with a few numpy calls per batch
(``contributions``), and results coming down a hierarchy are stored and
multicast a batch at a time (``results``); slots where arrival order matters go through the
per-packet handler, so both paths give the same registers and results.

A slot left incomplete for the job's ``stall_timeout`` (a crashed worker)
aborts the job: the switch frees the job's slots and floods an ABORT through
the job's tree naming the contributors that never came, so every worker fails
at once with that name, and the next job finds the slots clean.
"""

from __future__ import annotations

from types import SimpleNamespace

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
    EmitMany,
    Multicast,
    Register,
    SwitchProgram,
    group_by,
    make_packet,
    on_batch,
    on_packet,
    on_timer,
)

COLLECTING, WAITING, DONE = 0, 1, 2
INT32_LIMIT = 1 << 31


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
            return Emit(job.parent, pkt, job.priority)
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
                return Emit(pkt.port, self._packet(ctx, job, pkt, v, i, RESULT, rank=pkt.rank), job.priority)
            if r.state[v, i] == WAITING:
                return Emit(job.parent, self._packet(ctx, job, pkt, v, i, RETX, rank=job.rank), job.priority)
            return Drop("duplicate")
        else:
            self._add(r, v, i, pkt.values)
            r.exp[v, i] = max(int(r.exp[v, i]), pkt.exp)
        r.seen[v, i] = int(r.seen[v, i]) | bit
        if int(r.seen[v, i]) != job.full:
            return None
        if job.is_root:
            r.state[v, i] = DONE
            return Multicast(job.children, self._packet(ctx, job, pkt, v, i, RESULT, rank=ALL_RANKS), job.priority)
        r.state[v, i] = WAITING
        return Emit(job.parent, self._packet(ctx, job, pkt, v, i, 0, rank=job.rank), job.priority)

    @on_batch("contribution")
    def contributions(self, ctx, batch):
        """``contribution`` for a whole batch. A slot's packets in the batch are summed
        at once when they are plain new contributions of one round that cannot
        overflow; any other slot (a duplicate, a retransmission, a stale or mixed
        round, a possible overflow) is left to the per-packet handler."""
        jobs = batch.hdr["job"]
        actions, rest = [], []
        one_job = len(jobs) and (jobs == jobs[0]).all()
        for job_id in ([jobs[0]] if one_job else np.unique(jobs)):
            rows = np.arange(len(jobs)) if one_job else np.flatnonzero(jobs == job_id)
            job = ctx.jobs.get(int(job_id))
            if job is None or not job.aggregate or batch.values.shape[1] > self.elements:
                rest.append(rows)
                continue
            left = self._sum_batch(ctx, job, batch, rows, actions)
            rest.append(rows[left])
        return actions, np.sort(np.concatenate(rest))

    def _sum_batch(self, ctx, job, batch, rows, actions):
        """Fold the plain contributions of ``rows`` (one job's) into the pool; return the positions left."""
        whole = len(rows) == len(batch)
        hdr = batch.hdr if whole else batch.hdr[rows]
        values = batch.values if whole else batch.values[rows]
        count = values.shape[1]
        bits_of, port_of = self._members(job)
        rank = hdr["rank"].astype(np.int64)
        known = rank < len(bits_of)
        rank = np.where(known, rank, 0)
        bits = np.where(known, bits_of[rank], np.uint64(0))
        flags = hdr["flags"].astype(np.int64)
        slot = hdr["slot"].astype(np.int64)
        touches = (bits != 0) & (port_of[rank] == batch.port) & (slot < job.slots)  # packets that reach a slot
        key = np.where(flags & VER, self.slots, 0) + job.slot_base + np.where(touches, slot, 0)
        chunk = hdr["chunk"].astype(np.int64)

        # group by slot (key = version * slots + slot) every packet that reaches one
        order = np.flatnonzero(touches)
        if len(order) == 0:
            return np.arange(len(rows))
        if np.bincount(key[order]).max() == 1:  # each slot once (a worker's stream): every packet its own group
            starts, sizes, slots = np.arange(len(order)), np.ones(len(order), np.int64), key[order]
            first = last = chunk[order]
            plain = flags[order] & ~VER == 0
            group_bits, exps, distinct = bits[order], hdr["exp"][order], True
        else:
            by_slot, starts, sizes = group_by(key[order])
            order = order[by_slot]
            slots = key[order][starts]
            first = np.minimum.reduceat(chunk[order], starts)
            plain = np.logical_and.reduceat(flags[order] & ~VER == 0, starts)  # no retransmission in the group
            last = np.maximum.reduceat(chunk[order], starts)
            group_bits = np.bitwise_or.reduceat(bits[order], starts)
            exps = np.maximum.reduceat(hdr["exp"][order], starts)
            distinct = group_bits == np.add.reduceat(bits[order], starts)
        same_round = first == last
        r = self._flat(ctx.regs)
        cur, seen = r.chunk[slots], r.seen[slots]
        new = first > cur
        joins = (first == cur) & (r.state[slots] == COLLECTING) & (seen & group_bits == 0)
        peak = max(int(values.max()), -int(values.min())) if values.size else 0
        held = r.pool[slots[~new], :count]
        held_peak = max(int(held.max()), -int(held.min())) if held.size else 0
        fits = peak * sizes + np.where(new, 0, held_peak) < INT32_LIMIT  # no partial sum can overflow
        ok = plain & same_round & distinct & (new | joins) & fits
        stale = last < cur  # every packet of the group is stale: dropped
        if stale.any():
            ctx.count("drop:stale", int(sizes[stale].sum()))

        left = [np.flatnonzero(~touches)]
        for g in np.flatnonzero(~ok & ~stale):
            left.append(order[starts[g]:starts[g] + sizes[g]])
        g_ok = np.flatnonzero(ok)
        if len(g_ok):
            self._fold(ctx, job, hdr, values, order, starts[g_ok], sizes[g_ok], slots[g_ok], new[g_ok],
                       group_bits[g_ok], first[g_ok], exps[g_ok], actions)
        return np.sort(np.concatenate(left))

    def _fold(self, ctx, job, hdr, values, order, starts, sizes, slots, new, group_bits, first, exps, actions):
        r = self._flat(ctx.regs)
        count = values.shape[1]
        # int32 throughout: _sum_batch admitted only groups whose partial sums cannot overflow
        firsts = values[order[starts]]
        if new.all():
            acc = firsts
        else:
            acc = r.pool[slots, :count]
            if new.any():
                acc[new] = 0
            acc += firsts
        for j in range(1, int(sizes.max())):  # the groups' later members, in arrival order
            g = np.flatnonzero(sizes > j)
            acc[g] += values[order[starts[g] + j]]
        r.pool[slots, :count] = acc
        r.overflow[slots] &= ~new
        r.exp[slots] = np.where(new, exps, np.maximum(r.exp[slots], exps))
        r.seen[slots] = np.where(new, np.uint64(0), r.seen[slots]) | group_bits
        r.chunk[slots], r.state[slots] = first, COLLECTING
        r.since[slots] = np.where(new, ctx.now, r.since[slots])
        done = slots[r.seen[slots] == job.full]
        if len(done) == 0:
            return
        self._send_slots(r, job, hdr[order[starts[r.seen[slots] == job.full]]], done, count, job.is_root, actions)

    def _send_slots(self, r, job, hdr, done, count, down, actions):
        """The sums of slots ``done`` as packets with headers from ``hdr`` (one row per slot): with ``down``,
        results multicast to the children (the slots answered), else one contribution up to the parent."""
        out = hdr.copy()
        flags = np.where(done >= self.slots, VER, 0) | np.where(r.overflow[done], OVERFLOW, 0)
        out["count"], out["nworkers"], out["exp"] = count, job.nworkers, r.exp[done]
        sums = r.pool[done, :count]
        if down:
            r.state[done] = DONE
            out["flags"], out["rank"] = flags | RESULT, ALL_RANKS
            actions.extend(EmitMany(port, out, sums, job.priority) for port in job.children)
        else:
            r.state[done] = WAITING
            out["flags"], out["rank"] = flags, job.rank
            actions.append(EmitMany(job.parent, out, sums, job.priority))

    def _flat(self, regs):
        """The registers with (version, slot) flattened to one index: version * slots + slot (views)."""
        cached = getattr(self, "_flat_regs", None)
        if cached is None or cached[0] is not regs:
            flat = {name: getattr(regs, name).reshape(self.versions * self.slots, *getattr(regs, name).shape[2:])
                    for name in ("pool", "seen", "chunk", "state", "exp", "overflow", "since")}
            cached = self._flat_regs = (regs, SimpleNamespace(**flat))
        return cached[1]

    def _members(self, job):
        """Lookup tables rank -> contributor bit (0: not a contributor) and rank -> its ingress port."""
        cache = self.__dict__.setdefault("_member_tables", {})
        hit = cache.get(job.job)
        if hit is None or hit[0] is not job:
            size = max(job.contributors, default=-1) + 1
            bits = np.zeros(size, np.uint64)
            ports = np.full(size, -1, np.int64)
            for rank, bit in job.bits.items():
                bits[rank], ports[rank] = bit, job.contributors[rank]
            hit = cache[job.job] = (job, bits, ports)
        return hit[1], hit[2]

    @on_packet("result")
    def result(self, ctx, pkt):
        job = ctx.jobs.get(pkt.job)
        if job is None or pkt.port != job.parent:
            return Drop("unknown_job" if job is None else "result_from_child")
        if not job.aggregate:
            port = job.rank_ports.get(pkt.rank)
            return Multicast(job.children, pkt, job.priority) if port is None else Emit(port, pkt, job.priority)
        if pkt.slot >= job.slots or pkt.count > self.elements:
            return Drop("bad_slot")
        r, v, i = ctx.regs, pkt.version, job.slot_base + pkt.slot
        if pkt.chunk != r.chunk[v, i] or r.state[v, i] != WAITING:
            return Drop("stale")
        r.pool[v, i, : pkt.count] = pkt.values
        r.exp[v, i], r.overflow[v, i], r.state[v, i] = pkt.exp, pkt.has(OVERFLOW), DONE
        return Multicast(job.children, self._packet(ctx, job, pkt, v, i, RESULT, rank=ALL_RANKS), job.priority)

    @on_batch("result")
    def results(self, ctx, batch):
        """``result`` for a batch: per aggregating job, results from its parent are taken at once (a slot's
        first fresh one is stored and multicast down, one block per child port; a repeat finds the slot
        answered: stale); other jobs' and anything unusual go to the per-packet handler."""
        if batch.values.shape[1] > self.elements:
            return [], np.arange(len(batch))
        jobs = batch.hdr["job"]
        actions, rest = [], [np.zeros(0, np.int64)]
        for job_id in np.unique(jobs):
            rows = np.flatnonzero(jobs == job_id)
            job = ctx.jobs.get(int(job_id))
            if job is None or not job.aggregate or batch.port != job.parent:
                rest.append(rows)
                continue
            slot = batch.hdr["slot"][rows].astype(np.int64)
            inside = slot < job.slots
            rest.append(rows[~inside])
            self._take_results(ctx, job, batch, rows[inside], slot[inside], actions)
        return actions, np.sort(np.concatenate(rest))

    def _take_results(self, ctx, job, batch, rows, slot, actions):
        hdr, count = batch.hdr[rows], batch.values.shape[1]
        key = np.where(hdr["flags"] & VER, self.slots, 0) + job.slot_base + slot
        r = self._flat(ctx.regs)
        fresh = (hdr["chunk"] == r.chunk[key]) & (r.state[key] == WAITING)
        _, first = np.unique(np.where(fresh, key, -1), return_index=True)
        take = np.sort(first[fresh[first]])  # a slot's first fresh result; a repeat finds it DONE: stale
        if len(rows) - len(take):
            ctx.count("drop:stale", len(rows) - len(take))
        if not len(take):
            return
        done = key[take]
        r.pool[done, :count] = batch.values[rows[take]]
        r.exp[done], r.overflow[done] = hdr["exp"][take], hdr["flags"][take] & OVERFLOW != 0
        self._send_slots(r, job, hdr[take], done, count, True, actions)

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
