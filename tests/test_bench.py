"""The benchmark sender's frames: what the switch will see."""

from innet.wire.packet import RESULT, ROUTE, VER, parse_frame
from scripts.blast import MultiSender, frames_for


def test_sum_frames_are_each_ranks_contributions_in_slot_order():
    per_port = frames_for("sum", [3, 4], dst=9, slots=4, elements=8, rounds=8)
    assert len(per_port) == 2
    pkts = [parse_frame(f) for f in per_port[1]]
    assert [p.rank for p in pkts] == [1] * 8 and [p.src for p in pkts] == [4] * 8
    assert [p.slot for p in pkts] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [p.chunk for p in pkts] == list(range(1, 9))
    assert [p.version for p in pkts] == [(c // 4) % 2 for c in range(1, 9)]
    assert not any(p.has(RESULT) or p.has(ROUTE) for p in pkts)


def test_replayed_frames_get_new_chunks_with_the_same_slot_and_version():
    frames = frames_for("sum", [3], dst=9, slots=4, elements=8, rounds=8)[0]
    sender = MultiSender(frames)
    sender.advance_chunks(8)
    size = len(frames[0])
    replay = [parse_frame(sender.frames.frames[i, :size].tobytes()) for i in range(8)]
    assert [p.chunk for p in replay] == list(range(9, 17))
    assert [p.has(VER) for p in replay] == [parse_frame(f).has(VER) for f in frames]


def test_forward_frames_are_routed():
    [frames] = frames_for("forward", [1], dst=2, slots=4, elements=16, rounds=3)
    assert all(parse_frame(f).has(ROUTE) and parse_frame(f).dst == 2 for f in frames)


def test_bench_blocks_prints_both_paths_for_every_read_size():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "scripts/bench_blocks.py", "--rounds", "2", "--repeats", "1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    assert out[0].split()[0] == "frames/read" and [int(row.split()[0]) for row in out[1:-1]] == [1, 2, 3, 4, 5, 6, 8, 16, 64]
    assert all(float(row.split()[1]) > 0 and float(row.split()[2]) > 0 for row in out[1:-1])
    assert out[-1].startswith("the batch path is cheaper from ") and out[-1].endswith("SMALL_BLOCK = 5")
