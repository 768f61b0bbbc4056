"""The links' shaper: htb classes that release each link's frames in bursts of BURST_S of its rate.

Mininet's TCLink shapes each direction of a link with an htb class of burst 15 KB, and htb then
waits for tokens before every frame: at 1000 Mbit/s with jumbo frames that is a timer, a softirq
and a wake-up of the receiving process for each of 14k frames a second on every interface. That
kernel work, and the small reads it leaves the processes, is what took a 2-core machine's CPU
(docs/performance.md, "The shaper's granularity"). In htb's hysteresis mode a class that may send
goes on sending until it has overspent its burst, then waits until its tokens are back to zero:
with a burst of BURST_S of the link's rate, a link sends that much at a time at veth speed, and its
rate over any span longer than BURST_S is exact. Where a frame takes PACED_S or longer (below 360 Mbit/s with
9 KB frames) each frame waits for its own tokens: the burst is then an eighth of a frame. A burst
of a whole frame was overspent by a second one, so a slow link sent its frames in pairs (three after a
pause) at veth speed, a frame that arrived behind another left with it, and Mininet beat its links' rate
where background kept them busy (leaf-spine 2:1 at 10 Mbit/s, 50% permutation, dynamic trees: 0.405 s,
the fabric 0.463; the fabric with htb's pairs in its links 0.417, with frames paced one by one 0.488).

The mode is one switch for the whole machine (HYSTERESIS). A run that finds it off turns it on and
leaves MARKER; the last run using it turns it off again when it ends (or ``--clean``, after runs that
died), and only then. A value set by anyone else (no MARKER) is used and left alone. Where the switch
cannot be written the links keep TCLink's per-frame shaping (a larger burst without the mode would only
let a short transfer pass unshaped).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from innet.backends.mininet.cleanup import STATE_DIR, RunState, records
from innet.results.files import make_private_folder, write_text_atomic

BURST_S = 0.002  # a shaped link sends this much of its rate at a time (or one frame, where that is longer)
PACED = 8  # below a frame, the burst is this fraction of one: any frame over two bursts ends the class's burst
PACED_S = 0.0002  # a link whose frames take this long or longer paces them one by one (5000 frames a second or fewer)
HYSTERESIS = "/sys/module/sch_htb/parameters/htb_hysteresis"
MARKER = os.path.join(STATE_DIR, "htb_hysteresis.innet")  # an innet run turned the mode on
FLAG = "htb_hysteresis"  # in a run's record: the run relies on the mode


def burst_bytes(bw_mbps: float, frame: int) -> int:
    """The htb burst of a link of ``bw_mbps`` carrying frames of up to ``frame`` bytes: ``frame // PACED`` where a
    frame takes PACED_S or longer (hysteresis sends on until the tokens are a burst below zero, and a class starts
    from a burst above, so only a burst smaller than half a frame paces frames one by one); BURST_S of its rate on
    faster links. A burst of 2 ms passed a stream's first 4 ms at veth speed (5 jumbo frames at 80 Mbit/s), which
    the calibration's eBPF star (its links' hops ended by the hosts, which hold what they receive from when it came)
    finished early: 0.98 of its links' time at 80 Mbit/s."""
    if frame * 8 / (bw_mbps * 1e6) >= PACED_S:
        return max(1, frame // PACED)
    return int(bw_mbps * 1e6 / 8 * BURST_S)


def burst_command(intf: str, bw_mbps: float, frame: int) -> str:
    """The tc command that gives TCLink's class on ``intf`` (root 5:, class 5:1) its burst."""
    burst = burst_bytes(bw_mbps, frame)
    return (f"tc class change dev {intf} parent 5:0 classid 5:1 htb rate {bw_mbps:f}Mbit burst {burst} "
            f"cburst {burst} quantum {min(burst, 200_000)}")


@contextmanager
def _locked() -> Iterator[None]:
    make_private_folder(STATE_DIR)
    with open(os.path.join(STATE_DIR, "htb_hysteresis.lock"), "w", encoding="ascii") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _read() -> str:
    with open(HYSTERESIS, encoding="ascii") as fh:
        return fh.read().strip()


def _write(value: str) -> None:
    with open(HYSTERESIS, "w", encoding="ascii") as fh:
        fh.write(value)


def hold(state: RunState) -> bool:
    """Have htb's hysteresis mode on for this run (recorded in ``state`` first): whether it is on."""
    with _locked():
        try:
            on = _read() != "0"
        except OSError:  # htb not loaded, or /sys read-only here
            return False
        state.data.htb_hysteresis = True
        state.save()
        if on:
            return True
        write_text_atomic(MARKER, "", mode=0o600)
        try:
            _write("1")
        except OSError:
            os.unlink(MARKER)
            return False
        return True


def release(own: str | None = None) -> bool:
    """Turn the mode off if an innet run turned it on and no live run but ``own`` (a record's path) relies on
    it: whether it was turned off."""
    with _locked():
        if not os.path.exists(MARKER) or any(live and path != own and data.htb_hysteresis
                                             for path, data, live in records()):
            return False
        try:
            _write("0")
        except OSError:
            return False
        os.unlink(MARKER)
        return True
