"""A model of MXNet's KVStore parameter server, and of P3 over the same servers (model only: nothing emulates it).

P3's paper (Jayarajan et al., SysML 2019) measures against MXNet's KVStore, not against a streamed all-reduce:

- **Servers beside the workers.** Each of the N machines runs a worker and a server (MXNet's ``dist_sync`` as
  the paper runs it); every host link carries ``rate`` bytes per second each way.
- **Keys.** KVStore pushes a layer's gradient as one key, and a key lives on one server: key k (FIFO order, the
  backward pass's) on server ``k mod N``, round-robin; a key of more than ``MXNET_KVSTORE_BIGARRAY_BOUND``
  (1,000,000 parameters by default, ``BIGARRAY_BOUND``; scaled with the workload) is split evenly over all the
  servers. ``whole`` splits none: one server per key, so a huge layer (VGG-19's fc6: 72% of its parameters)
  loads one server. P3 cuts layers into slices and deals the slices out round-robin the same way.
- **Push, then pull.** A key's pull begins once the whole key has been pushed by every worker and summed: the
  N-1 remote workers' copies pass the server's link in, then the sum passes it out to the N-1 of them (the
  co-located worker's copy never leaves its machine). Keys overlap: a key's pull beside the next key's push.
- **Order.** KVStore sends keys as backpropagation produces them (FIFO); P3 sends the ready slice of the lowest
  layer first (a server's link takes the most urgent key waiting whenever it falls idle: no preemption).
- **The next forward pass** runs layer by layer (MXNet's dependency engine): layer l's forward starts once
  layer l-1's is done and all of layer l's keys are pulled.

Every iteration's exchange ends before the next one's first gradient exists (the forward pass needs every
layer), so the steady state is one iteration's schedule: ``period`` returns the time from one iteration's
compute start to the next's. Each push and each pull first holds its server's link for ``request`` seconds
(``ps_period`` gives a header frame's round trip). Not modelled: the workers' own links (balanced keys load
them as they load the servers'), the servers' CPU, TCP.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from innet.hosts.training import Training
from innet.planning.prediction import frame_bytes

BIGARRAY_BOUND = 1_000_000  # MXNet's MXNET_KVSTORE_BIGARRAY_BOUND: a bigger key is split over every server


@dataclass(frozen=True)
class Scheme:
    sliced: bool  # keys are the run's calls (slices), not whole layers
    urgent: bool  # the lowest layer first (P3's order), not FIFO
    split: bool  # a whole-layer key over the bound is split over every server (MXNet's KVStore)


SCHEMES = {"kvstore": Scheme(False, False, True), "whole": Scheme(False, False, False),  # --ps (PS_SCHEMES)
           "sliced": Scheme(True, False, True), "priority": Scheme(False, True, True), "p3": Scheme(True, True, True)}


@dataclass(frozen=True)
class Key:
    layer: int  # forward index (0: needed first)
    elements: int
    ready: float  # seconds after the iteration's compute start that its gradient exists


def wire_bytes(elements: int, per_packet: int) -> int:
    """One worker's copy of ``elements`` values on the wire, in full packets and the rest."""
    full, rest = divmod(elements, per_packet)
    return full * frame_bytes(per_packet) + (frame_bytes(rest) if rest else 0)


def serve(jobs: Sequence[tuple[float, tuple[float, int], float]]) -> list[float]:
    """One link direction, non-preemptive: ``jobs`` as (arrival, rank, seconds); whenever the link is idle it
    takes the arrived job of least rank. Each job's end, in the order given."""
    order = sorted(range(len(jobs)), key=lambda j: jobs[j][0])
    ends = [0.0] * len(jobs)
    waiting: list[tuple[tuple[float, int], int]] = []
    now, i = 0.0, 0
    while i < len(order) or waiting:
        if not waiting:
            now = max(now, jobs[order[i]][0])
        while i < len(order) and jobs[order[i]][0] <= now:
            heapq.heappush(waiting, (jobs[order[i]][1], order[i]))
            i += 1
        _, j = heapq.heappop(waiting)
        now = ends[j] = now + jobs[j][2]
    return ends


def keys_of(training: Training, elements: Sequence[int], sliced: bool, split: int = 0, servers: int = 1) -> list[Key]:
    """One iteration's keys in FIFO order: the run's calls (``elements``, one iteration's), or with ``sliced``
    false each layer's calls merged into one whole-layer key, ready once its last slice's gradient is; a
    whole-layer key of more than ``split`` elements (0: none) cut into ``servers`` equal parts, one a server."""
    layer = training.layer or tuple(range(training.layers - 1, -1, -1))
    ready = [training.forward + t for t in accumulate(training.backward)]
    calls = [Key(layer[k], elements[k], ready[k]) for k in range(training.layers)]
    if sliced:
        return calls
    merged: dict[int, Key] = {}
    for key in calls:
        was = merged.get(key.layer)
        merged[key.layer] = key if was is None else Key(key.layer, was.elements + key.elements, max(was.ready, key.ready))
    out = []
    for key in merged.values():
        parts = servers if split and key.elements > split else 1
        out += [Key(key.layer, len(range(p, key.elements, parts)), key.ready) for p in range(parts)]
    return out


def period(training: Training, elements: Sequence[int], workers: int, rate: float, per_packet: int,
           scheme: str = "kvstore", bound: int = BIGARRAY_BOUND, request: float = 0.0) -> float:
    """Seconds from one steady-state iteration's compute start to the next's, the exchange on ``workers``
    co-located servers (module doc). ``elements``: one iteration's calls (FIFO order), as the run cuts them;
    ``rate``: each host link's bytes per second; ``scheme``: one of ``SCHEMES``; ``bound``: the elements above
    which a KVStore key is split (``BIGARRAY_BOUND`` at full size); ``request``: the seconds each push and each
    pull holds its server's link before its bytes flow (a request's round trip: the server answers each)."""
    how = SCHEMES[scheme]
    keys = keys_of(training, elements, how.sliced, bound if how.split else 0, workers)
    remote = max(workers - 1, 0)
    seconds = [request + remote * wire_bytes(k.elements, per_packet) / rate for k in keys]
    rank = [(float(k.layer) if how.urgent else 0.0, j) for j, k in enumerate(keys)]
    pulled = [0.0] * len(keys)
    for server in range(max(workers, 1)):
        mine = [j for j in range(len(keys)) if j % max(workers, 1) == server]
        pushed = serve([(keys[j].ready, rank[j], seconds[j]) for j in mine])
        ends = serve([(p, rank[j], seconds[j]) for j, p in zip(mine, pushed, strict=True)])
        for j, end in zip(mine, ends, strict=True):
            pulled[j] = end
    back = {k.layer: 0.0 for k in keys}
    for k, end in zip(keys, pulled, strict=True):
        back[k.layer] = max(back[k.layer], end)
    at = training.compute  # the backward pass is done; the next forward runs layer by layer
    for layer, forward in enumerate(training.forward_layers):
        at = max(at, back.get(layer, 0.0)) + forward
    return at - training.forward
