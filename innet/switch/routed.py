"""Where a complete slot's result goes down the tree: to every rank (all-reduce), or its values to one
rank (reduce-scatter's shard owner, reduce's root) and to every other a header alone.

A collective that routes (innet.wire.collectives) marks each contribution with the rank its result is
for, in the header's ``nworkers`` field: ``size + 1 + rank`` names that rank (``mark``), the job's size
(what all-reduce's workers send) or anything else means every rank. A collective that replicates
(all-gather, broadcast) marks its contributions ``2 * size + 1`` (``replica_mark``): one rank sends a
chunk's values, every other rank its header alone, and the slot's result is those values.
The mark travels up with the partials and down with the
result, so every switch on the way splits the same: the values out of the port towards the rank, a
header without values out of every other port. That header is the slot's acknowledgement: it frees the
slot at the workers that do not keep the values, as the result frees it at the one that does.
"""

from __future__ import annotations

import numpy as np

from innet.switch.program import Action, Emit, EmitMany, JobPort, Multicast
from innet.wire.packet import Packet


def mark(nworkers: int, rank: int) -> int:
    """The ``nworkers`` field of a packet for ``rank`` alone, in a job of ``nworkers``."""
    return nworkers + 1 + rank


def replica_mark(nworkers: int) -> int:
    """The ``nworkers`` field of a replicating collective's contributions, in a job of ``nworkers``."""
    return 2 * nworkers + 1


def replicates(job: JobPort, field: int) -> bool:
    return field == replica_mark(job.nworkers)


def kept_mark(job: JobPort, fields: np.ndarray) -> np.ndarray:
    """The ``nworkers`` fields a switch sends on for packets that came with ``fields``: a collective's mark
    as it came, else the job's size."""
    return np.where((marked(job, fields) >= 0) | (fields == replica_mark(job.nworkers)), fields, job.nworkers)


def kept_field(job: JobPort, field: int) -> int:
    """``kept_mark`` for one packet, in plain ints (the per-packet path)."""
    return field if dest_of(job, field) is not None or field == replica_mark(job.nworkers) else job.nworkers


def dest_of(job: JobPort, field: int) -> int | None:
    """The rank a packet whose ``nworkers`` field is ``field`` is for, or None: every rank."""
    rank = field - job.nworkers - 1
    return rank if 0 <= rank < job.nworkers else None


def marked(job: JobPort, fields: np.ndarray) -> np.ndarray:
    """``dest_of`` for an array of fields: the rank, or -1 for every rank."""
    rank = fields.astype(np.int64) - job.nworkers - 1
    return np.where((rank >= 0) & (rank < job.nworkers), rank, -1)


def result_down(job: JobPort, result: Packet) -> list[Action]:
    """A result sent to the children: all of them, or its values towards its rank and headers elsewhere."""
    dest = dest_of(job, int(result.hdr["nworkers"]))
    if dest is None or not len(result.values):
        return [Multicast(job.children, result, job.priority)]
    towards = job.rank_ports.get(dest)
    ack = result.replace(result.values[:0])
    return [Emit(p, result if p == towards else ack, job.priority) for p in job.children]


def answer(job: JobPort, result: Packet, port: int) -> Packet:
    """The answer to a repeat of a finished slot that came in on ``port``: the values if their rank is
    behind that port (a worker, or a switch whose partial carries another rank's), else a header."""
    dest = dest_of(job, int(result.hdr["nworkers"]))
    return result if dest is None or job.rank_ports.get(dest) == port else result.replace(result.values[:0])


def for_rank(job: JobPort, result: Packet, rank: int) -> Packet:
    """A result passed on to rank ``rank`` alone (a relay passing an answer): its values only if they are the rank's."""
    dest = dest_of(job, int(result.hdr["nworkers"]))
    return result if dest is None or dest == rank or not len(result.values) else result.replace(result.values[:0])


def results_down(job: JobPort, hdr: np.ndarray, values: np.ndarray) -> list[Action]:
    """``result_down`` for a block of results (rows of ``hdr`` and ``values``)."""
    dest = marked(job, hdr["nworkers"])
    routed = dest >= 0
    if not routed.any() or values.shape[1] == 0:
        return [EmitMany(port, hdr, values, job.priority) for port in job.children]
    port_of = np.full(job.nworkers, -1, np.int64)
    for rank, port in job.rank_ports.items():
        port_of[rank] = port
    towards = port_of[np.where(routed, dest, 0)]
    out: list[Action] = []
    for port in job.children:
        full = ~routed | (towards == port)
        if full.any():
            out.append(EmitMany(port, np.ascontiguousarray(hdr[full]), values[full], job.priority))
        if not full.all():
            acks = hdr[~full].copy()
            acks["count"] = 0
            out.append(EmitMany(port, acks, values[~full][:, :0], job.priority))
    return out
