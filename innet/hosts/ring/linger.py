"""A ring rank after its last call (``Linger``): it keeps answering its predecessor, which may have missed its
last ACKs and probe for them, until the predecessor's DONE says no probe will come (innet.hosts.ring)."""

from __future__ import annotations

from innet.hosts.ring.call import RingCall

DONE_REPEATS = 16  # a lossy call's DONE, resent while lingering: all lost at 20% loss on 4 links, 1 in 10^4


class Linger:
    """A ring rank after its last call (``call``), which keeps answering its predecessor until the
    predecessor's DONE came, ``limit`` seconds at most. Any other call (not a ring's, or one of a ring of
    one) has no predecessor to wait for: it is over at once.

    A call that lost something (so its links lose) resends its own DONE ``DONE_REPEATS`` times, a tail probe's
    spacing apart, and lingers until they are out: a lost DONE no longer holds the successor for ``limit``
    (the run's timeout: 2000 s on Mininet at ×200 dilation). A clean call sends its DONE once, as before."""

    def __init__(self, call: object, now: float, limit: float) -> None:
        self.call = call if isinstance(call, RingCall) and call.spec.nworkers > 1 else None
        self.end = now + limit
        lossy = self.call is not None and self.call.sent_done and (self.call.retransmissions or self.call.receipts.hole_acked)
        self.repeats = DONE_REPEATS if lossy else 0
        self.next_repeat = now

    def over(self, now: float) -> bool:
        return self.call is None or (self.call.predecessor_done and not self.repeats) or now >= self.end

    def due(self) -> float:
        """When to resend the DONE next (inf: never again)."""
        return self.next_repeat if self.repeats else float("inf")

    def repeat(self, now: float) -> list[bytes]:
        """The DONE, if a repeat is due."""
        if self.call is None or not self.repeats or now < self.next_repeat:
            return []
        self.repeats -= 1
        self.next_repeat = now + self.call.quiet()
        return [self.call.done_frame()]
