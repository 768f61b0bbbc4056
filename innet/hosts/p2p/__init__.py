"""Point-to-point messages between worker hosts, routed through the switches as the ring's frames are (torch's
send/recv, and all-to-all, gather and scatter as messages between every pair that moves bytes), sans-I/O:
``wire`` (a message's frames and ACKs, and the bytes they put on a path), ``host`` (a host's messages in and
out: ``MessageHost``, an endpoint the fabric and a namespace's poll loop drive alike).

A message is a tensor's raw bytes (any dtype travels exact), a three-word preamble in front (its length, its
tag), cut into pieces of the job's values a packet; each piece a ROUTE frame of job ``P2P_JOB`` from the
sender's host to the receiver's, the switches forwarding it by its address. Pieces go out as a window allows
(shared by the host's messages, round robin); the receiver acknowledges every ACK_EVERY pieces and the last
(the ring's cumulative ACK with a selective bitmap, innet.hosts.ring.acks), at once on a hole or a duplicate.
Loss recovery: a piece sent before one acknowledged is lost (the path is FIFO) and is resent; else the RTO
probes the oldest piece (innet.hosts.recovery's timer). Without loss a message of ``n`` bytes puts
``wire.message_bytes`` on every link of its path and its ACKs on the way back, exactly: the planner's
prediction (innet.planning.prediction.exchange_link_bytes) is that.

A message is known by its sender, its channel (the user's send/recv, or a collective's exchange) and its
sequence number on that channel towards its receiver; a receiver hands them on in that order per sender and
channel (MPI's non-overtaking order), whatever order their pieces came in.
"""
