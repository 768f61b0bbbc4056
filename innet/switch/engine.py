"""The aggregation engine: a pool of slots that combine contributions exactly once, with any operator.

Everything that aggregates uses it: the switch programs built on ``Reduction`` and the PBox server.
A slot is addressed by its key ``version * slots + slot`` (the version bit is SwitchML's shadow copy:
the other version keeps the previous result, so a worker who lost it gets it again when it
retransmits). Per key the engine keeps the round's chunk number (an older chunk is stale), a
contributor bitmap of any width (contributor ``i`` is bit ``i % 64`` of word ``i // 64``) with a
count beside it, the combined values, the max exponent, the value count, an overflow flag, the time
the round began and its state: collecting, waiting for the parent's result, or done.

``contribute`` takes one packet; ``contribute_many`` folds a batch with a few numpy calls ("store,
then combine", PERFORMANCE-NOTES.md) and leaves to ``contribute`` every packet whose slot needs
arrival order (a retransmission, a duplicate, a mixed round, a possible overflow), so both paths
end with the same registers.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from innet.switch.program import Register, group_by
from innet.wire.operators import Operator

COLLECTING, WAITING, DONE = 0, 1, 2
# what a contribution did (``contribute``)
ADDED, COMPLETE, STALE, ANSWER, RESEND_UP, DUPLICATE, BAD_COUNT = (
    "added", "complete", "stale", "answer", "resend_up", "duplicate", "bad_count")
INT32_LIMIT = 1 << 31
WORD = 64


def words(fan_in: int) -> int:
    """Bitmap words a slot needs for ``fan_in`` contributors."""
    return max(1, -(-fan_in // WORD))


def pool_registers(keys: Any, elements: Any, bitmap_words: Any) -> tuple[Register, ...]:
    """The registers of a slot pool: ``keys`` slots (both versions) of ``elements`` values, each with a
    contributor bitmap of ``bitmap_words`` 64-bit words (shapes as ``Register`` takes them)."""
    return (
        Register("pool", (keys, elements), np.int32),
        Register("seen", (keys, bitmap_words), np.uint64),
        Register("have", (keys,), np.int32),
        Register("chunk", (keys,), np.int64, fill=-1),
        Register("state", (keys,), np.uint8),
        Register("exp", (keys,), np.int8),
        Register("count", (keys,), np.int32),
        Register("overflow", (keys,), np.bool_),
        Register("since", (keys,), np.float64),
    )


def new_pool(keys: int, elements: int, fan_in: int) -> SimpleNamespace:
    """A slot pool's registers outside a switch program (the PBox's)."""
    return SimpleNamespace(**{r.name: r.array(None) for r in pool_registers(keys, elements, words(fan_in))})


def slots_held(regs: SimpleNamespace) -> tuple[int, int] | None:
    """(slots holding a round, slots in all) of a pool's registers: a slot is held from its round's first
    contribution until its result goes down (collecting, or complete and waiting for the parent's result);
    None for registers without a pool (a program of its own)."""
    state, chunk = getattr(regs, "state", None), getattr(regs, "chunk", None)
    if not isinstance(state, np.ndarray) or not isinstance(chunk, np.ndarray) or state.shape != chunk.shape:
        return None
    return int(np.count_nonzero(((state == COLLECTING) & (chunk >= 0)) | (state == WAITING))), len(state)


@dataclass
class Folded:
    """What ``contribute_many`` did: the batch rows it took, the keys it completed, and for each of those
    the row (of the batch) of the packet that completed it."""

    taken: np.ndarray
    completed: np.ndarray
    last_rows: np.ndarray


def run_of(keys: np.ndarray) -> np.ndarray | slice:
    """``keys`` as a slice when they are consecutive and increasing (then indexing by it gives views), else
    as they are."""
    n = len(keys)
    if n > 1 and keys[-1] - keys[0] == n - 1 and (keys[1:] - keys[:-1] == 1).all():
        return slice(int(keys[0]), int(keys[0]) + n)
    return keys


class Engine:
    """Exactly-once aggregation with ``operator`` over the slot registers ``regs`` (see module doc)."""

    def __init__(self, regs: SimpleNamespace, operator: Operator) -> None:
        self.r, self.op = regs, operator
        self.combine, self.identity = operator.combine, np.int32(operator.identity or 0)  # on int32, as the operator says

    # -- one packet --------------------------------------------------------
    def contribute(self, key: int, who: int, need: int, chunk: int, exp: int, values: np.ndarray, now: float,
                   replicate: bool = False) -> str:
        """Fold contributor ``who``'s ``values`` of ``chunk`` into slot ``key``, which completes with
        ``need`` contributors. Returns what happened: ADDED, COMPLETE, STALE (an older chunk), ANSWER
        (a repeat of a finished slot: answer it with the result), RESEND_UP (a repeat of a slot waiting
        for its parent: send the partial up again), DUPLICATE, BAD_COUNT (another length than the round's).
        ``replicate``: the round's values are the one contribution that has any (all-gather, broadcast:
        innet.wire.collectives); the others are headers that only count."""
        r = self.r  # registers read with .item(): one packet's scalars as ints, without numpy scalars
        held = r.chunk.item(key)
        if chunk < held:
            return STALE
        word, bit = who // WORD, 1 << (who % WORD)
        n = len(values)
        if chunk > held:  # the first packet of a new round in this slot
            r.chunk[key], r.state[key], r.have[key], r.seen[key] = chunk, COLLECTING, 0, 0
            r.exp[key], r.overflow[key], r.since[key], r.count[key] = exp, False, now, n
            r.pool[key, :n] = values
            seen = 0
        else:
            seen = r.seen.item(key, word)
            if seen & bit:
                state = r.state.item(key)
                return ANSWER if state == DONE else RESEND_UP if state == WAITING else DUPLICATE
            if n != r.count.item(key):
                if not replicate or (n and r.count.item(key)):
                    return BAD_COUNT
                if n:  # the values, after headers: they are the round's
                    r.pool[key, :n], r.count[key] = values, n
            else:
                self._combine(key, values)
            if exp > r.exp.item(key):
                r.exp[key] = exp
        r.seen[key, word] = seen | bit
        have = r.have.item(key) + 1
        r.have[key] = have
        return COMPLETE if have >= need else ADDED

    def _combine(self, key: int, values: np.ndarray) -> None:
        """Slot ``key``'s values combined with ``values`` (as long), flagging an int32 overflow."""
        r, n = self.r, len(values)
        acc = r.pool[key, :n]
        total = self.combine(acc, values)
        if self.op.can_overflow:
            wrapped = (acc ^ total) & (values ^ total)  # negative where int32 wrapped
            if n and wrapped.min() < 0:
                r.overflow[key] = True
        acc[:] = total

    def finish(self, keys: Any, down: bool) -> None:
        """Mark complete slots: DONE when their result goes down, WAITING for the parent's otherwise."""
        self.r.state[keys] = DONE if down else WAITING

    def take_result(self, key: int, chunk: int, exp: int, overflow: bool, values: np.ndarray) -> bool:
        """Store the parent's result for slot ``key`` if it is waiting for it (else the result is stale)."""
        r = self.r
        if chunk != r.chunk[key] or r.state[key] != WAITING:
            return False
        r.pool[key, : len(values)] = values
        r.exp[key], r.overflow[key], r.state[key], r.count[key] = exp, overflow, DONE, len(values)
        return True

    def take_results(self, keys: np.ndarray, chunks: np.ndarray, exps: np.ndarray, overflow: np.ndarray,
                     values: np.ndarray) -> np.ndarray:
        """``take_result`` for a batch: the positions taken (each waiting slot's first fresh result)."""
        r = self.r
        fresh = (chunks == r.chunk[keys]) & (r.state[keys] == WAITING)
        _, first = np.unique(np.where(fresh, keys, -1), return_index=True)
        take = np.sort(first[fresh[first]])
        done = keys[take]
        r.pool[done, : values.shape[1]] = values[take]
        r.exp[done], r.overflow[done], r.state[done], r.count[done] = exps[take], overflow[take], DONE, values.shape[1]
        return take

    def values(self, key: int) -> np.ndarray:
        return self.r.pool[key, : int(self.r.count[key])]

    # -- stalls --------------------------------------------------------------
    def stuck(self, keys: np.ndarray, now: float, timeout: float, heard: np.ndarray) -> int | None:
        """A key of ``keys`` collecting for longer than ``timeout`` whose missing contributors have all been
        silent that long (``heard[i]``: when contributor i last sent anything), or None. A contributor that
        still retransmits older chunks is alive: its slot waits for a result it lost, not for a crash."""
        r = self.r
        late = np.flatnonzero((r.state[keys] == COLLECTING) & (r.chunk[keys] >= 0) & (now - r.since[keys] > timeout))
        for key in keys[late].tolist():
            if (heard[self.missing(key, len(heard))] < now - timeout).all():
                return int(key)
        return None

    def missing(self, key: int, need: int) -> list[int]:
        """The contributors slot ``key`` has not heard from."""
        bits = np.unpackbits(self.r.seen[key].view(np.uint8), bitorder="little")[:need]
        return np.flatnonzero(bits == 0).tolist()

    def free(self, keys: np.ndarray) -> None:
        r = self.r
        r.chunk[keys], r.seen[keys], r.have[keys], r.state[keys], r.pool[keys] = -1, 0, 0, COLLECTING, self.identity

    # -- a batch -------------------------------------------------------------
    def contribute_many(self, keys: np.ndarray, who: np.ndarray, need: int, chunks: np.ndarray, exps: np.ndarray,
                        values: np.ndarray, plain: np.ndarray, now: float) -> Folded:
        """Fold a batch of contributions of one job (all of ``values``' width; ``plain``: not a
        retransmission). A slot's packets are folded at once when they are plain, distinct new
        contributions of one round that cannot overflow; the rows of every other slot are left."""
        r, n = self.r, len(keys)
        none = np.zeros(0, np.int64)
        if n == 0:
            return Folded(none, none, none)
        if np.bincount(keys).max() == 1:  # each slot once (one worker's stream): no grouping needed
            return self._fold_distinct(keys, who, need, chunks, exps, values, plain, now)
        count = values.shape[1]
        order, starts, sizes = group_by(keys)
        slots = keys[order[starts]]
        chunk = chunks[order]
        first, last = np.minimum.reduceat(chunk, starts), np.maximum.reduceat(chunk, starts)
        word, bit = who // WORD, np.left_shift(np.uint64(1), (who % WORD).astype(np.uint64))
        pair = np.sort(keys * (need + 1) + who)
        dup_keys = keys[np.isin(keys * (need + 1) + who, pair[1:][pair[1:] == pair[:-1]])]
        unseen = (r.seen[keys, word] & bit) == 0
        cur = r.chunk[slots]
        new = first > cur
        joins = ((first == cur) & (r.state[slots] == COLLECTING) & np.logical_and.reduceat(unseen[order], starts)
                 & (r.count[slots] == count))
        ok = (np.logical_and.reduceat(plain[order], starts) & (first == last) & ~np.isin(slots, dup_keys) & (new | joins))
        if self.op.can_overflow:
            peak = max(int(values.max()), -int(values.min())) if values.size else 0
            held = r.pool[slots[~new], :count]
            held_peak = max(int(held.max()), -int(held.min())) if held.size else 0
            ok &= peak * sizes + np.where(new, 0, held_peak) < INT32_LIMIT  # no partial result can overflow
        if not ok.any():
            return Folded(none, none, none)
        taken = order[np.repeat(ok, sizes)]  # the folded groups' rows, group by group, each in arrival order
        starts, sizes, slots, new = starts[ok], sizes[ok], slots[ok], new[ok]
        acc = values[order[starts]]  # a copy: the groups' first members
        if not new.all():
            acc[~new] = self.combine(r.pool[slots[~new], :count], acc[~new])
        for j in range(1, int(sizes.max())):  # the groups' later members, in arrival order
            later = np.flatnonzero(sizes > j)
            acc[later] = self.combine(acc[later], values[order[starts[later] + j]])
        r.pool[slots, :count] = acc
        group_exp = np.maximum.reduceat(exps[taken], np.concatenate(([0], np.cumsum(sizes)[:-1])))
        r.exp[slots] = np.where(new, group_exp, np.maximum(r.exp[slots], group_exp))
        fresh = slots[new]
        r.seen[fresh], r.have[fresh], r.overflow[fresh], r.since[fresh] = 0, 0, False, now
        r.state[slots], r.chunk[slots], r.count[slots] = COLLECTING, chunks[order[starts]], count
        np.bitwise_or.at(r.seen, (keys[taken], word[taken]), bit[taken])
        r.have[slots] += sizes.astype(np.int32)
        complete = r.have[slots] >= need
        return Folded(taken, slots[complete], order[starts[complete] + sizes[complete] - 1])

    def _fold_distinct(self, keys: np.ndarray, who: np.ndarray, need: int, chunks: np.ndarray, exps: np.ndarray,
                       values: np.ndarray, plain: np.ndarray, now: float) -> Folded:
        """``contribute_many`` when no two packets share a slot: each packet is its own group."""
        r, count = self.r, values.shape[1]
        word, bit = who // WORD, np.left_shift(np.uint64(1), (who % WORD).astype(np.uint64))
        at = run_of(keys)  # a slice where the keys are consecutive (a stream's chunks): views, no gathers
        cur = r.chunk[at]
        new = chunks > cur
        ok = plain & (new | ((chunks == cur) & (r.state[keys] == COLLECTING) & ((r.seen[keys, word] & bit) == 0)
                             & (r.count[keys] == count)))
        if self.op.can_overflow and not new.all():
            joins = ok & ~new
            peak = max(int(values.max()), -int(values.min())) if values.size else 0
            held = r.pool[at, :count] if isinstance(at, slice) and joins.all() else r.pool[keys[joins], :count]
            if held.size and peak + max(int(held.max()), -int(held.min())) >= INT32_LIMIT:
                ok &= new  # a join could overflow: the per-packet path flags it
        taken = np.flatnonzero(ok)
        if len(taken) < len(keys):
            keys, word, bit, chunks, exps, values, new = (a[taken] for a in (keys, word, bit, chunks, exps, values, new))
            at = run_of(keys)
        if new.all():
            r.pool[at, :count], r.exp[at] = values, exps
            r.seen[at], r.have[at], r.overflow[at], r.since[at] = 0, 0, False, now
        elif not new.any():  # every packet joins its slot's round
            if isinstance(at, slice):
                self.combine(r.pool[at, :count], values, out=r.pool[at, :count])
            else:
                r.pool[at, :count] = self.combine(r.pool[at, :count], values)
            r.exp[at] = np.maximum(r.exp[at], exps)
        else:
            fresh, joins = keys[new], keys[~new]
            r.pool[fresh, :count], r.exp[fresh] = values[new], exps[new]
            r.seen[fresh], r.have[fresh], r.overflow[fresh], r.since[fresh] = 0, 0, False, now
            r.pool[joins, :count] = self.combine(r.pool[joins, :count], values[~new])
            r.exp[joins] = np.maximum(r.exp[joins], exps[~new])
        r.state[at], r.chunk[at], r.count[at] = COLLECTING, chunks, count
        r.seen[keys, word] |= bit
        r.have[at] += 1
        complete = np.flatnonzero(r.have[at] >= need)
        return Folded(taken, keys[complete], taken[complete])
