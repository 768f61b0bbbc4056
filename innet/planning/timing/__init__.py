"""An analytic timing model of every mode (Pipe-SGD's, made exact for innet's protocols).

One all-reduce call of ``e`` elements per worker takes

    T(e) = T_bw(e) + T_lat

- ``T_bw``: the busiest link direction's bytes over its rate. The bytes are
  innet.planning.prediction's exact per-mode frame counts: in-network, a worker link
  carries one stream each way; PBox, the PBox link carries N streams each way;
  ring, each neighbour link carries 2(N-1)/N of a stream (plus ACKs back).
- ``T_lat``: the round trips the protocol waits for, each hop costing one full
  frame's serialization plus ``hop`` seconds of processing. In-network and PBox:
  the exponent round trip (small frames) and the last chunk's round trip to the
  aggregation point (less the last frame's serialization on the busiest
  link, already in ``T_bw``); at a PBox, plus the N-1 frames its first key
  waits for before results can flow back. Ring: the exponent passes N-1 hops; each of the
  2(N-1) steps then takes the longer of its share of ``T_bw`` and one piece's
  trip from the predecessor (a step's first piece waits for it), summed along
  the ring's slowest chain of neighbour paths, plus the last piece's arrival.

With a workload, the calls follow the training schedule (innet.hosts.training) with
these durations: iteration time and communication wait come from the same
recurrence the emulated workers run, so model and measurement differ only by
the call times. ``hop``: 0 on the fabric (it models links, not CPUs); on
Mininet, a Python switch or host takes ~0.6 ms to pass a frame on when
several share 2 cores (``MININET_HOP``: measured with ``run_topology.py
--predict`` on star and leaf-spine at 10 Mbit/s; ``--hop-latency`` sets it).

Where the closed form cannot see the order frames meet in, a dense call of at most QUEUED_FRAMES worker
frames is also followed frame by frame through the links' FIFOs (``queues``): an in-network call through
its tree (a relay passes two ToRs' streams up one link, all-gather's header partials behind values), a
PBox call (near workers' streams ahead of a far one's; a collective's headers beside its values).

Modules: ``calls`` (one call without loss), ``queues`` (frame by frame), ``loss`` (the loss term,
``lossy_time``), ``runs`` (a run's figures: each call's time, a workload's schedule).
"""

from innet.planning.timing.calls import MININET_HOP, busiest_direction, call_time
from innet.planning.timing.loss import lossy_time
from innet.planning.timing.runs import call_times, planned_training, predict

__all__ = ["MININET_HOP", "busiest_direction", "call_time", "call_times", "lossy_time", "planned_training", "predict"]
