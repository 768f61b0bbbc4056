"""Top-k sparse all-reduce: ``sum_allreduce`` for chunks that may travel as (index, value) pairs.

Workers run with ``--topk F`` send each chunk in the shorter of its two forms
(innet.sparse): dense values, or a SPARSE payload of (index, value) pairs. This
program densifies what comes in, aggregates with exactly the registers,
rounds, retransmission and stall rules of ``sum_allreduce``, and sends every
partial sum and result back out sparse whenever that is shorter: the union of
the contributors' indices. So the sum is exact for what was sent, and bytes
shrink with the density on every link, up and down the tree.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from innet import ABORT, SPARSE, Batch, Drop, Emit, EmitMany, Multicast, Packet, on_batch, on_packet
from innet.programs import load_program
from innet.sparse import densify, encode

SumAllreduce = load_program("sum_allreduce")


class TopkSparse(SumAllreduce):
    name = "topk_sparse"
    sparse = True  # takes SPARSE chunks (run_topology.py --topk)

    @on_packet("contribution")
    def contribution(self, ctx, pkt):
        dense = densify(pkt, self.elements)
        return Drop("bad_sparse") if dense is None else self._sparsify(super().contribution(ctx, dense))

    @on_packet("result")
    def result(self, ctx, pkt):
        dense = densify(pkt, self.elements)
        return Drop("bad_sparse") if dense is None else self._sparsify(super().result(ctx, dense))

    @on_batch("contribution")
    def contributions(self, ctx, batch):
        return self._dense_batch(ctx, batch, SumAllreduce.contributions)

    @on_batch("result")
    def results(self, ctx, batch):
        return self._dense_batch(ctx, batch, SumAllreduce.results)

    def _dense_batch(self, ctx, batch, handle):
        """A batch handler of ``sum_allreduce`` (``handle``) on dense values. Dense batches go to it as
        they are; a SPARSE batch (its rows of any length) is densified first, in a few numpy calls. Rows
        that do not decode are left to the per-packet handler (which drops them), and so is everything
        from the first row that densifies to another length than the first (a short last chunk):
        arrival order holds. What it sends goes out in the shorter form."""
        if not batch.hdr["flags"][0] & SPARSE:
            actions, rest = handle(self, ctx, batch)
            return self._sparsify(actions), rest
        dense, good = self._densify_batch(batch)
        rows = np.flatnonzero(good)
        if not len(rows):
            return [], np.arange(len(batch))
        hdr = batch.hdr[rows]
        hdr["flags"] &= 0xFF ^ SPARSE
        hdr["count"] = dense.shape[1]
        actions, rest = handle(self, ctx, Batch(batch.port, hdr, dense[rows], batch.src[rows], batch.dst[rows], batch.band[rows]))
        return self._sparsify(actions), np.sort(np.concatenate([np.flatnonzero(~good), rows[rest]]))

    def _densify_batch(self, batch):
        """``decode`` for a whole batch: (dense values, the rows decoded), both up to the first row of
        another length than the first good row's."""
        counts = batch.hdr["count"].astype(np.int64)
        values = batch.values
        pairs = (counts - 1) // 2
        width = (values.shape[1] - 1) // 2
        index, value = values[:, 1 : 1 + 2 * width : 2].astype(np.int64), values[:, 2 : 2 + 2 * width : 2]
        real = np.arange(width) < pairs[:, None]
        ascending = np.ones_like(real)
        ascending[:, 1:] = index[:, 1:] > index[:, :-1]
        lengths = values[:, 0].astype(np.int64) if values.shape[1] else np.full(len(batch), -1)
        good = ((counts % 2 == 1) & (0 <= lengths) & (lengths <= self.elements)
                & ~(real & ((index < 0) | (index >= lengths[:, None]) | ~ascending)).any(axis=1))
        if not good.any():
            return np.zeros((len(batch), 0), np.int32), good
        length = lengths[np.argmax(good)]
        other = np.flatnonzero(good & (lengths != length))
        good &= np.arange(len(batch)) < (other[0] if len(other) else len(batch))
        dense = np.zeros((len(batch), length), np.int32)
        take = real & good[:, None]
        dense[np.nonzero(take)[0], index[take]] = value[take]
        return dense, good

    def _sparsify(self, actions):
        """The actions with every sum they send in its shorter form."""
        if actions is None:
            return None
        out = []
        for action in actions if isinstance(actions, (list, tuple)) else (actions,):
            if isinstance(action, (Emit, Multicast)):
                action = replace(action, packet=self._short(action.packet))
            elif isinstance(action, EmitMany) and action.src is None:
                out.extend(self._short_many(action))
                continue
            out.append(action)
        return out

    @staticmethod
    def _short(pkt):
        if pkt.has(SPARSE) or pkt.has(ABORT):
            return pkt
        payload = encode(pkt.values)
        return pkt if payload is None else pkt.replace(payload, flags=int(pkt.hdr["flags"]) | SPARSE)

    def _short_many(self, action):
        """An EmitMany with its rows that are shorter sparse sent one by one, the rest still as a block."""
        payloads = [encode(row) for row in action.values]
        keep = np.array([p is None for p in payloads])
        out = [replace(action, hdr=action.hdr[keep], values=action.values[keep])] if keep.any() else []
        for k in np.flatnonzero(~keep):
            hdr = action.hdr[k].copy()
            hdr["flags"] |= SPARSE
            hdr["count"] = len(payloads[k])
            out.append(Emit(action.port, Packet(hdr, payloads[k]), action.priority))
        return out
