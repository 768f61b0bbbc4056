"""``Reduction``: the switch program every in-network reduction is, given an operator.

SwitchML's protocol, hierarchical when the plan says so. Each job owns a range of the slot pool;
workers stream their tensor through it: chunk ``c`` goes to slot ``c % slots`` with version
``(c // slots) % 2``, and a worker sends the slot's next chunk only after the slot's result came
back. The engine (innet.switch.engine) combines each slot's contributions exactly once. A complete
slot is multicast down at the root, or sent up as one contribution to the parent switch elsewhere;
a repeat of a finished slot is answered from it (the shadow copy), a repeat of one waiting for its
parent sends the partial up again. A slot left incomplete for the job's ``stall_timeout`` (a crashed
worker) aborts the job: the switch frees the job's slots and floods an ABORT through the job's tree
naming the contributors that never came.

A subclass names its operator (and may set ``sparse``: chunks may travel as (index, value) pairs,
densified on the way in and sent out in the shorter form). Blocks of packets are folded with a few
numpy calls; everything else goes packet by packet, with the same registers and results.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from innet.switch.engine import ADDED, ANSWER, COMPLETE, DUPLICATE, RESEND_UP, Engine, pool_registers, run_of, words
from innet.switch.program import (
    Action,
    Batch,
    Context,
    Drop,
    Emit,
    EmitMany,
    HandlerResult,
    JobPort,
    Multicast,
    SwitchProgram,
    on_batch,
    on_packet,
    on_timer,
)
from innet.switch.routed import answer, for_rank, kept_field, kept_mark, replica_mark, replicates, result_down, results_down
from innet.wire.collectives import COLLECTIVES
from innet.wire.operators import SUM, Operator
from innet.wire.packet import ABORT, ALL_RANKS, OVERFLOW, RESULT, RETX, SPARSE, VER, Packet, make_packet
from innet.wire.sparse import densify, densify_rows, encode


class Reduction(SwitchProgram):
    """In-network all-reduce with ``operator`` (see module doc)."""

    name = "reduction"
    operator: ClassVar[Operator] = SUM
    slots = 128
    elements = 2048  # values per packet: 8250-byte frames on jumbo links (README: "Packets")
    fan_in: ClassVar[int] = 64  # contributors one slot can track (the bitmap's width)
    sparse: ClassVar[bool] = False
    collectives = tuple(COLLECTIVES)  # innet.switch.routed: where a slot's values go, and whether it combines
    registers = pool_registers(lambda p: 2 * p.slots, "elements", lambda p: words(p.fan_in))

    # -- contributions -------------------------------------------------------
    @on_packet("contribution")
    def contribution(self, ctx: Context, pkt: Packet) -> HandlerResult:
        job = ctx.jobs.get(pkt.job)
        if job is None:
            return Drop("unknown_job")
        if not job.aggregate:
            return Emit(job.parent, pkt, job.priority)  # type: ignore[arg-type]
        who = self._members(job)[2]
        rank = pkt.rank
        if rank >= len(who) or who[rank] < 0 or job.contributors[rank] != pkt.port:
            return Drop("not_member")
        dense = densify(pkt, self.elements) if self.sparse else pkt
        if dense is None:
            return Drop("bad_sparse")
        if dense.slot >= job.slots or dense.count > self.elements:
            return Drop("bad_slot")
        index = who[rank]  # densify keeps the rank
        self._heard(job)[index] = ctx.now
        key = self._key(job, dense)
        engine = self._engine(ctx)
        what = engine.contribute(key, index, len(job.contributors), dense.chunk, dense.exp, dense.values, ctx.now,
                                 replicates(job, int(dense.hdr["nworkers"])))
        if what == ADDED:
            return None
        if what in (ANSWER, RESEND_UP) and not pkt.has(RETX):  # the network's copy of a counted one: nobody asked
            return Drop(DUPLICATE)
        if what == COMPLETE:
            engine.finish(key, job.is_root)
            if job.is_root:
                return self._down(job, self._packet(ctx, job, dense, key, RESULT, ALL_RANKS))
            return self._out(Emit(job.parent, self._packet(ctx, job, dense, key, 0, job.rank), job.priority))  # type: ignore[arg-type]
        if what == ANSWER:
            result = answer(job, self._packet(ctx, job, dense, key, RESULT, dense.rank), pkt.port)
            return self._out(Emit(pkt.port, result, job.priority))
        if what == RESEND_UP:
            return self._out(Emit(job.parent, self._packet(ctx, job, dense, key, RETX, job.rank), job.priority))  # type: ignore[arg-type]
        return Drop(what)

    @on_batch("contribution")
    def contributions(self, ctx: Context, batch: Batch) -> tuple[list[Action], np.ndarray]:
        """``contribution`` for a block: per aggregating job, the engine folds what it can at once."""
        batch, left = self._dense(batch)
        hdr, jobs = batch.hdr, batch.hdr["job"]
        actions: list[Action] = []
        rest = [left, np.zeros(0, np.int64)]
        ids = [int(jobs[0])] if (jobs == jobs[0]).all() else np.unique(jobs).tolist()
        for job_id in ids:
            rows = np.arange(len(jobs)) if len(ids) == 1 else np.flatnonzero(jobs == job_id)
            job = ctx.jobs.get(job_id)
            if job is None or not job.aggregate or batch.values.shape[1] > self.elements:
                rest.append(batch.rows[rows])
                continue
            who, port_of, _ = self._members(job)
            rank = hdr["rank"][rows].astype(np.int64)
            known = rank < len(who)
            rank = np.where(known, rank, 0)
            slot = hdr["slot"][rows].astype(np.int64)
            member = (known & (who[rank] >= 0) & (port_of[rank] == batch.port) & (slot < job.slots)
                      & (hdr["nworkers"][rows] != replica_mark(job.nworkers)))  # a replicating slot: packet by packet
            mine = rows[member]
            if len(mine) == len(jobs):  # every row is a member's: read the batch through views, not copies
                sel: np.ndarray | slice = slice(None)
            else:
                sel, rank, slot = mine, rank[member], slot[member]
            self._heard(job)[who[rank]] = ctx.now
            flags = hdr["flags"][sel].astype(np.int64)
            keys = np.where(flags & VER, self.slots, 0) + job.slot_base + slot
            folded = self._engine(ctx).contribute_many(keys, who[rank], len(job.contributors),
                                                       hdr["chunk"][sel].astype(np.int64), hdr["exp"][sel],
                                                       batch.values[sel], flags & ~VER == 0, ctx.now)
            taken = np.zeros(len(jobs), bool)
            taken[mine[folded.taken]] = True
            rest.append(batch.rows[rows[~taken[rows]]])
            if len(folded.completed):
                self._engine(ctx).finish(folded.completed, job.is_root)
                self._send_slots(ctx, job, hdr[mine[folded.last_rows]], folded.completed, job.is_root, actions)
        return self._out_list(actions), np.sort(np.concatenate(rest))

    # -- results coming down a hierarchy ------------------------------------------
    @on_packet("result")
    def result(self, ctx: Context, pkt: Packet) -> HandlerResult:
        job = ctx.jobs.get(pkt.job)
        if job is None or pkt.port != job.parent:
            return Drop("unknown_job" if job is None else "result_from_child")
        if not job.aggregate:
            port = job.rank_ports.get(pkt.rank)
            return result_down(job, pkt) if port is None else Emit(port, for_rank(job, pkt, pkt.rank), job.priority)
        dense = densify(pkt, self.elements) if self.sparse else pkt
        if dense is None:
            return Drop("bad_sparse")
        if dense.slot >= job.slots or dense.count > self.elements:
            return Drop("bad_slot")
        key = self._key(job, dense)
        if not self._engine(ctx).take_result(key, dense.chunk, dense.exp, dense.has(OVERFLOW), dense.values):
            return Drop("stale")
        return self._down(job, self._packet(ctx, job, dense, key, RESULT, ALL_RANKS))

    @on_batch("result")
    def results(self, ctx: Context, batch: Batch) -> tuple[list[Action], np.ndarray]:
        """``result`` for a block: an aggregating job's results from its parent are stored and multicast
        down at once (a slot's first fresh one; a repeat finds the slot answered: stale)."""
        batch, left = self._dense(batch)
        if batch.values.shape[1] > self.elements:
            return [], np.sort(np.concatenate([left, batch.rows]))
        hdr, jobs = batch.hdr, batch.hdr["job"]
        actions: list[Action] = []
        rest = [left, np.zeros(0, np.int64)]
        for job_id in np.unique(jobs).tolist():
            rows = np.flatnonzero(jobs == job_id)
            job = ctx.jobs.get(job_id)
            if job is None or not job.aggregate or batch.port != job.parent:
                rest.append(batch.rows[rows])
                continue
            slot = hdr["slot"][rows].astype(np.int64)
            rest.append(batch.rows[rows[slot >= job.slots]])
            rows, slot = rows[slot < job.slots], slot[slot < job.slots]
            flags = hdr["flags"][rows]
            keys = np.where(flags & VER, self.slots, 0) + job.slot_base + slot
            take = self._engine(ctx).take_results(keys, hdr["chunk"][rows].astype(np.int64), hdr["exp"][rows],
                                                  flags & OVERFLOW != 0, batch.values[rows])
            if len(rows) - len(take):
                ctx.count("drop:stale", len(rows) - len(take))
            if len(take):
                self._send_slots(ctx, job, hdr[rows[take]], keys[take], True, actions)
        return self._out_list(actions), np.sort(np.concatenate(rest))

    # -- stalls and aborts ---------------------------------------------------
    @on_timer(0.05)
    def watch_stalls(self, ctx: Context) -> list[Action]:
        """Abort every job with a slot that has waited too long for a contribution."""
        actions: list[Action] = []
        for job in ctx.jobs.values():
            if not job.aggregate or job.stall_timeout <= 0:
                continue
            engine = self._engine(ctx)
            key = engine.stuck(self._part(job), ctx.now, job.stall_timeout, self._heard(job))
            if key is None:
                continue
            ranks = sorted(job.contributors)
            missing = [ranks[i] for i in engine.missing(key, len(ranks))]
            ctx.count("aborted_jobs")
            self._free(ctx, job)
            note = make_packet(np.array([ctx.node, *missing]), job=job.job, rank=ALL_RANKS, flags=ABORT)
            actions.append(Multicast((*job.children, *(() if job.parent is None else (job.parent,))), note))
        return actions

    @on_packet("abort")
    def abort(self, ctx: Context, pkt: Packet) -> HandlerResult:
        """Another switch aborted the job: free its slots here and pass the news along the tree."""
        job = ctx.jobs.get(pkt.job)
        if job is None:
            return Drop("unknown_job")
        ports = (*job.children, *(() if job.parent is None else (job.parent,)))
        if pkt.port not in ports:
            return Drop("not_member")
        self._free(ctx, job)
        return Multicast(tuple(p for p in ports if p != pkt.port), pkt)

    # -- helpers ---------------------------------------------------------------
    def _engine(self, ctx: Context) -> Engine:
        cached: Any = self.__dict__.get("_engine_of")
        if cached is None or cached[0] is not ctx.regs:
            cached = self.__dict__["_engine_of"] = (ctx.regs, Engine(ctx.regs, self.operator))
        return cached[1]

    def _members(self, job: JobPort) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Lookup tables rank -> contributor index (-1: not a contributor) and rank -> its ingress port, and
        the first as a list (one packet's lookup, without numpy)."""
        cache = self.__dict__.setdefault("_member_tables", {})
        hit = cache.get(job.job)
        if hit is None or hit[0] is not job:
            size = max(job.contributors, default=-1) + 1
            who, ports = np.full(size, -1, np.int64), np.full(size, -1, np.int64)
            for i, rank in enumerate(sorted(job.contributors)):
                who[rank], ports[rank] = i, job.contributors[rank]
            if len(job.contributors) > self.fan_in:
                raise ValueError(f"{self.name}: job {job.job} has {len(job.contributors)} contributors at one switch, "
                                 f"more than the program's fan_in ({self.fan_in})")
            hit = cache[job.job] = (job, who, ports, who.tolist())
        return hit[1], hit[2], hit[3]

    def _heard(self, job: JobPort) -> np.ndarray:
        """When each contributor of ``job`` last sent anything here (-inf: never)."""
        cache = self.__dict__.setdefault("_heard_of", {})
        if job.job not in cache or len(cache[job.job]) != len(job.contributors):
            cache[job.job] = np.full(len(job.contributors), -np.inf)
        return cache[job.job]

    def _key(self, job: JobPort, pkt: Packet) -> int:
        return (self.slots if pkt.flags & VER else 0) + job.slot_base + pkt.slot

    def _part(self, job: JobPort) -> np.ndarray:
        """The keys of ``job``'s slots, both versions."""
        base = np.arange(job.slot_base, job.slot_base + job.slots)
        return np.concatenate([base, base + self.slots])

    def _free(self, ctx: Context, job: JobPort) -> None:
        if job.aggregate:
            self._engine(ctx).free(self._part(job))

    def _packet(self, ctx: Context, job: JobPort, pkt: Packet, key: int, flags: int, rank: int) -> Packet:
        """Slot ``key``'s current values as a packet (a result, or a partial going up)."""
        r = ctx.regs
        flags |= (VER if key >= self.slots else 0) | (OVERFLOW if r.overflow[key] else 0)
        values = self._engine(ctx).values(key).copy()
        nworkers = kept_field(job, int(pkt.hdr["nworkers"]))  # a collective's mark (innet.switch.routed), else the size
        return pkt.replace(values, rank=rank, flags=flags, exp=int(r.exp[key]), nworkers=nworkers)

    def _send_slots(self, ctx: Context, job: JobPort, hdr: np.ndarray, keys: np.ndarray, down: bool,
                    actions: list[Action]) -> None:
        """The values of slots ``keys`` with headers from ``hdr`` (a row per slot): with ``down``, results
        multicast to the children, else one contribution each up to the parent."""
        r, out = ctx.regs, hdr.copy()
        count = int(r.count[keys[0]])
        flags = np.where(keys >= self.slots, VER, 0) | np.where(r.overflow[keys], OVERFLOW, 0)
        out["count"], out["exp"] = count, r.exp[keys]
        out["nworkers"] = kept_mark(job, out["nworkers"])
        values = r.pool[run_of(keys), :count]  # a view where the keys are consecutive (written out at once)
        if down:
            out["flags"], out["rank"] = flags | RESULT, ALL_RANKS
            actions.extend(results_down(job, out, values))
        else:
            out["flags"], out["rank"] = flags, job.rank
            actions.append(EmitMany(job.parent, out, values, job.priority))  # type: ignore[arg-type]

    # -- the sparse form ---------------------------------------------------------
    def _dense(self, batch: Batch) -> tuple[Batch, np.ndarray]:
        """A SPARSE batch densified (its ``rows`` say where each row came from), and the rows that did not
        decode; any other batch as it is."""
        if not self.sparse or not batch.hdr["flags"][0] & SPARSE:
            return batch, np.zeros(0, np.int64)
        dense, good = densify_rows(batch.hdr["count"], batch.values, self.elements)
        rows = np.flatnonzero(good)
        hdr = batch.hdr[rows]
        hdr["flags"] &= 0xFF ^ SPARSE
        hdr["count"] = dense.shape[1]
        return (Batch(batch.port, hdr, dense[rows], batch.src[rows], batch.dst[rows], batch.band[rows], rows),
                np.flatnonzero(~good))

    def _down(self, job: JobPort, result: Packet) -> HandlerResult:
        """A slot's result to the children: to all, or routed (innet.switch.routed)."""
        actions = result_down(job, result)
        return self._out(actions[0]) if len(actions) == 1 else actions  # type: ignore[arg-type]

    def _out(self, action: Emit | Multicast) -> Action:
        """An action with its packet in the shorter form (sparse programs)."""
        if not self.sparse or action.packet.has(SPARSE) or action.packet.has(ABORT):
            return action
        payload = encode(action.packet.values)
        if payload is None:
            return action
        return replace(action, packet=action.packet.replace(payload, flags=int(action.packet.hdr["flags"]) | SPARSE))

    def _out_list(self, actions: list[Action]) -> list[Action]:
        """Every EmitMany's rows that are shorter sparse sent one by one, the rest still as a block."""
        if not self.sparse:
            return actions
        out: list[Action] = []
        for action in actions:
            if not isinstance(action, EmitMany):
                out.append(action)
                continue
            payloads = [encode(row) for row in action.values]
            keep = np.array([p is None for p in payloads])
            if keep.any():
                out.append(replace(action, hdr=action.hdr[keep], values=action.values[keep]))
            for k in np.flatnonzero(~keep):
                hdr = action.hdr[k].copy()
                hdr["flags"] |= SPARSE
                hdr["count"] = len(payloads[k])  # type: ignore[arg-type]
                out.append(Emit(action.port, Packet(hdr, payloads[k]), action.priority))  # type: ignore[arg-type]
        return out
