"""scripts/bench_fidelity.py: its breakdown of hand-made frames (exact lateness against exact links), its pcap
reader, and (root) one real rate's row, whose fields agree with each other."""

import json
import subprocess
import sys

import pytest
from scapy.utils import wrpcap

from innet.wire.layer import scapy_frame
from innet.wire.packet import RESULT, RETX
from scripts.bench_fidelity import lines, read_pcap, stages

RATE, DELAY = 8e6, 0.002  # bit/s: a 1000-byte frame takes 1 ms, a 100-byte one 0.1 ms


def frame(t, chunk, result=False, size=1000, flags=0):
    return (t, 0xFFFF if result else 0, chunk, chunk, flags | (RESULT if result else 0), size)


def ports():
    """Two workers on a switch (and the PBox's idle port): chunk 1 is the exponent's (100 bytes), 2 and 3 data.
    Each frame is a set time late against links of RATE and DELAY, from a start at 10.0."""
    return {
        "s1-eth1": [frame(10.0026, 1, size=100),  # 0.5 ms late
                    frame(10.0060, 1, True, size=100),  # the exponent's answer, due 10.0057: 0.3 ms late
                    frame(10.0097, 2), frame(10.0107, 3),  # 0.7 ms turnaround; then at the link's pace
                    frame(10.0127, 2, True), frame(10.0147, 3, True),  # due 10.0127 and 10.0137
                    frame(10.0200, 3, flags=RETX)],  # a resent copy: counted, not timed
        "s1-eth2": [frame(10.0036, 1, size=100), frame(10.0061, 1, True, size=100),  # 1.5 and 0.4 ms late
                    frame(10.0093, 2), frame(10.0103, 3),  # 0.2 ms turnaround
                    frame(10.0128, 2, True), frame(10.0139, 3, True)],  # due 10.0127 and 10.0138
        "s1-eth3": [],
    }


def test_the_critical_paths_steps_are_how_late_each_came_and_add_up_to_the_span():
    row = stages(ports(), 10.0, 10.0150, RATE, DELAY)
    # the latest exponent frame (port 2's, 1.5 ms late), the latest answer (0.4 ms after it was due), the latest
    # first data frame (port 1's: 0.6 ms after the answer's hop and its own), then its second frame and the last
    # result's hop: due 10.0137, out 10.0147
    late = {k: row[k] for k in ("start_ms", "exponent_ms", "turnaround_ms", "stream_ms", "end_ms")}
    assert late == pytest.approx({"start_ms": 1.5, "exponent_ms": 0.4, "turnaround_ms": 0.6, "stream_ms": 1.0,
                                  "end_ms": 0.3})
    assert row["ideal_ms"] == pytest.approx(11.2)  # 4 hops' delay, two 100-byte frames, three 1000-byte ones
    assert sum(late.values()) + row["ideal_ms"] == pytest.approx(15.0)  # the calls' span
    assert row["results_ms"] == pytest.approx({"median": 0.1, "p99": 1.0, "max": 1.0})
    assert row["up"] == pytest.approx({"pace": 1.0, "bursts": 0.0})  # data frames one serialization apart
    assert row["down"] == pytest.approx({"pace": 2.0, "bursts": 0.0})  # port 1's second result a frame late
    assert (row["contributions"], row["results"], row["retransmitted"]) == (6, 6, 1)


def test_frames_let_through_together_are_bursts():
    burst = {"s1-eth1": [frame(1.0, 1, size=100), frame(1.01, 1, True, size=100),
                         frame(1.02, 2), frame(1.02001, 3), frame(1.022, 4), frame(1.02201, 5)]}
    assert stages(burst, 1.0, 1.03, RATE, DELAY)["up"] == pytest.approx({"pace": 0.67, "bursts": 0.667})


def test_no_contributions_is_an_error_not_a_row():
    with pytest.raises(ValueError, match="no contributions"):
        stages({"s1-eth1": []}, 0.0, 1.0, RATE, DELAY)


def test_the_pcap_reader_gives_each_innet_frames_time_and_header(tmp_path):
    path = str(tmp_path / "s1-eth1.pcap")
    a = scapy_frame(1, 2, rank=3, slot=4, chunk=5, values=[1, 2])
    b = scapy_frame(2, 1, rank=0xFFFF, slot=4, chunk=5, flags=RESULT)
    packets = []
    for t, raw in ((100.25, a), (100.5, b)):
        from scapy.layers.l2 import Ether

        p = Ether(raw)
        p.time = t
        packets.append(p)
    wrpcap(path, packets)
    assert read_pcap(path) == [(100.25, 3, 4, 5, 0, len(a)), (100.5, 0xFFFF, 4, 5, RESULT, len(b))]
    (tmp_path / "empty.pcap").write_bytes(b"")
    assert read_pcap(str(tmp_path / "empty.pcap")) == []


@pytest.mark.mininet
def test_one_rates_row_has_every_stage_and_its_figures_agree(tmp_path):
    out = tmp_path / "rows.json"
    printed = subprocess.run([sys.executable, "scripts/bench_fidelity.py", "--rates", "40", "--json", str(out)],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    [row] = json.loads(out.read_text())
    assert row["correct"] and row["rate_mbps"] == 40 and row["dilation"] == 2500
    assert row["frame_ms"] == 1.65 and row["delay_ms"] == 5.0  # 8250-byte frames; the star's 2 us hops, dilated
    assert row["completion_ms"] - row["local_ms"] == pytest.approx(row["excess_ms"], abs=0.01)
    assert row["ratio"] == pytest.approx(row["completion_ms"] / row["local_ms"], abs=1e-3)
    assert row["contributions"] == row["results"] == 4 * 33  # 4 workers: the exponent's chunk and 32 of 2048 values
    late = sum(row[k] for k in ("start_ms", "exponent_ms", "turnaround_ms", "stream_ms", "end_ms"))
    assert late + row["ideal_ms"] == pytest.approx(row["completion_ms"], abs=0.05)  # the steps add up to the run
    assert row["ideal_ms"] == pytest.approx(row["local_ms"], rel=0.01)  # exact links: the local backend's time
    assert row["results_ms"]["median"] <= row["results_ms"]["p99"] <= row["results_ms"]["max"]
    assert 0 < row["up"]["pace"] < 2 and 0 <= row["down"]["bursts"] <= 1
    assert set(row["cpu"]) == {"h1", "h2", "h3", "h4", "s1"} and set(row["timer"]) == {"poll_ms", "sleep_ms"}
    assert set(row["softirq"]) == {"cpu", "wait"} and all(0 <= v < 4 for v in row["softirq"].values())
    assert printed.splitlines()[1:] == lines(row)
