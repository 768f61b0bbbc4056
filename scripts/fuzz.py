"""Malformed frames, seeded, for the fuzz tests and ``scripts/fuzz_frames.py``.

Every frame made here is wrong in a way a switch must notice: truncated
headers, lengths that disagree, random bytes, impossible element counts,
broken IPv4 headers, or a well-formed header from a port that is no member of
any job. None carries the ROUTE flag with a valid source, so a correct switch
counts each one as bad or dropped and forwards none.
"""

from __future__ import annotations

import random
import struct

import numpy as np

from innet.wire.packet import ABORT, FLAGS_OFFSET, HEADER_OFFSET, PAYLOAD_OFFSET, RESULT, ROUTE, make_packet

KINDS = ("truncated", "short_payload", "long_payload", "random", "huge_count", "bad_ip", "wrong_udp_len", "not_member")


def malformed_frames(count: int, src: int, dst: int, seed: int = 0) -> list[bytes]:
    """``count`` malformed frames, as if sent by node ``src`` towards neighbour ``dst``."""
    rng = random.Random(seed)
    frames = []
    for n in range(count):
        kind = KINDS[n % len(KINDS)]
        values = np.array([rng.randrange(-(2**31), 2**31) for _ in range(rng.randrange(0, 8))], np.int32)
        pkt = make_packet(values, job=rng.randrange(65536), rank=rng.randrange(65536), nworkers=rng.randrange(65536),
                          slot=rng.randrange(65536), chunk=rng.randrange(2**32), flags=rng.randrange(256) & ~ROUTE,
                          exp=rng.randrange(-128, 128))
        frame = bytearray(pkt.to_frame(src, dst))
        if kind == "truncated":
            frame = frame[: rng.randrange(0, PAYLOAD_OFFSET)]
        elif kind == "short_payload" and len(values):
            frame = frame[:-rng.randrange(1, 4 * len(values) + 1)]
        elif kind == "long_payload" or (kind == "short_payload" and not len(values)):
            frame += bytes(rng.randrange(1, 64))
        elif kind == "random":
            frame = bytearray(rng.randbytes(rng.randrange(1, 1500)))
        elif kind == "huge_count":
            frame[HEADER_OFFSET + 12 : HEADER_OFFSET + 14] = struct.pack("!H", rng.randrange(len(values) + 1, 65536))
        elif kind == "bad_ip":
            frame[14] = rng.choice([0x46, 0x55, 0x65, 0x00])
        elif kind == "wrong_udp_len":
            frame[38:40] = struct.pack("!H", (struct.unpack("!H", frame[38:40])[0] + rng.randrange(1, 100)) % 65536)
        if kind == "random" and len(frame) > FLAGS_OFFSET:
            frame[FLAGS_OFFSET] &= ~ROUTE & 0xFF
        frames.append(bytes(frame))
    return frames


def forged_frames(me: int, tor: int, victim: int, pbox: int, job: int = 1) -> list[tuple[str, bytes]]:
    """One round of a deliberately spoofing host ``me`` behind switch ``tor``: (the drop it must cause, frame).

    It claims another job, a rank it is not, another host's address, a result
    from below, an ABORT, and results routed as if from the PBox; the last one
    is honestly addressed from ``me`` to ``victim``, so the switches deliver it
    and the victim must ignore it ("delivered").
    """
    vals = np.full(256, 2**20, np.int32)
    return [
        ("drop:unknown_job", make_packet(vals, job=job + 76, rank=0, slot=0, chunk=1).to_frame(me, tor)),
        ("drop:not_member", make_packet(vals, job=job, rank=0, slot=1, chunk=2).to_frame(me, tor)),
        ("drop:spoofed_source", make_packet(vals, job=job, rank=2, slot=1, chunk=2).to_frame(victim, tor)),
        ("drop:result_from_child", make_packet(vals, job=job, rank=0xFFFF, slot=1, chunk=2, flags=RESULT).to_frame(me, tor)),
        ("drop:not_member", make_packet(np.zeros(2, np.int32), job=job, flags=ABORT).to_frame(me, tor)),
        ("drop:spoofed_source", make_packet(vals, job=job, rank=0, slot=1, chunk=2, flags=RESULT | ROUTE).to_frame(pbox, victim)),
        ("delivered", make_packet(vals, job=job, rank=0, slot=1, chunk=2, flags=RESULT | ROUTE).to_frame(me, victim)),
    ]


def main(argv: list[str] | None = None) -> int:
    """Send malformed frames out of an interface at a bounded rate (run inside a Mininet host)."""
    import argparse
    import time

    from innet.io.rawport import RawPort

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iface", required=True)
    p.add_argument("--src", type=int, required=True, help="node index of the sending host")
    p.add_argument("--dst", type=int, required=True, help="node index of its switch")
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=20_000, help="frames per second at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spoof", nargs=2, type=int, metavar=("VICTIM", "PBOX"),
                   help="send forged packets (innet.fuzz.forged_frames) instead, --count rounds of them")
    args = p.parse_args(argv)
    port = RawPort(args.iface)
    if args.spoof:
        frames = [f for _ in range(args.count) for _, f in forged_frames(args.src, args.dst, *args.spoof)]
    else:
        frames = malformed_frames(args.count, args.src, args.dst, args.seed)
    start = time.monotonic()
    for n, frame in enumerate(frames):
        if len(frame) < 14:  # shorter than an Ethernet header: the kernel refuses to send it
            frame = frame + bytes(14 - len(frame))
        port.send(frame)
        ahead = n / args.rate - (time.monotonic() - start)
        if ahead > 0.001:
            time.sleep(ahead)
    print(f"sent {len(frames)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
