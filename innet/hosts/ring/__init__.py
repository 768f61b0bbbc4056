"""Ring all-reduce between the worker hosts (the Horovod / Pipe-SGD baseline), sans-I/O: ``call`` (one rank's
part of one all-reduce: ``RingCall``), ``acks`` (what it acknowledges, and its scoreboard of what came back),
``geometry`` (segments, pieces, halves), ``linger`` (a rank after its last call).

Rank r sends only to rank r+1 (addressed packets, routed by the switches).
Steps, each one packet chain per ``elements``-sized piece:
1. N-1 exponent steps pass the running max exponent along, so all agree on a scale;
2. N-1 reduce-scatter steps: at step k rank r sends segment (r-k) mod N, its own
   values plus what it got for that segment at step k-1;
3. N-1 all-gather steps pass the reduced segments along.
Packet j of a step is sent as soon as packet j of the previous step arrived
(the ring is pipelined), as long as fewer than WINDOW packets are unacknowledged
(the flow control a ring gets from TCP in Gloo or NCCL; in-network all-reduce
gets the same from its slot pool); the rest wait in order. Receivers acknowledge with a bitmap of the packets of
a step they hold (every ACK_EVERY packets of a step, at the end of a step, on
every retransmission and on every packet that comes out of order, as TCP's
duplicate ACKs: a lost ACK for a hole then costs the next packet, not ACK_EVERY
more; star of 4, 262144 values, 1/5/20% loss: -9/-12/-19%). The window is at least ACK_EVERY x steps, so when it
is full some step has ACK_EVERY packets unacknowledged: either one of them is
still on its way, or its ACK is, or one was lost (and the timeout's probe
finds it); the two ends never just wait for each other.

Loss recovery (RACK-like): the path to the successor is FIFO, so an unacknowledged
packet of a step sent before one the successor has acknowledged for that step was
lost, and is retransmitted at once. On a timeout a sender retransmits only the
oldest unacknowledged packet of each step, as a probe: its RETX flag asks for an
immediate ACK, which then names any other holes. A late ACK so costs at most one
spurious packet per step, not a window's worth.

A rank's ACKs share its uplink with its own data, so behind a queue of data
they would make the round trip as long as the queue, and the window (however
large) would hold the ring below link rate: ACKs travel in priority band 0 and
data in the job's band, but never 0 (``data_band``), so they jump that queue
(Mininet, star of 4 at 25 Mbit/s: 1.90 -> 1.64 s, theory 1.56 s).

A rank whose call is done (every packet it owed sent and acknowledged) tells its successor so with
a DONE frame (an ACK-shaped frame for step ``3(N-1)``, no values). After its last call a rank
lingers (``Linger``): its predecessor may have missed its last ACKs and probe for them, so it keeps
answering until the predecessor's DONE (``predecessor_done``) says no probe will come. That DONE is
the one thing that ends a linger; a bound (the run's timeout) is the last resort for a predecessor
that died, or whose DONE was lost.

Frames are taken a block at a time (``receive_block``: one vectorised filter,
then each packet's step logic) and what a block lets a rank send is built as
one array of frames (``build_frames``) and sent with one sendmmsg.
"""
