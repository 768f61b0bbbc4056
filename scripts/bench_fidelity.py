#!/usr/bin/env python3
"""Where the faithful rate is lost (issue 49, item 1): the calibration's run (innet.backends.mininet.calibration:
an all-reduce on a star of 4, 65536 elements, innet mode, dilated so its links run at a real rate) at a few
real rates, and for each a breakdown of its time. Needs root (Mininet); 35-50 seconds.

    sudo python scripts/bench_fidelity.py [--rates 5,10,20,40] [--json FILE] [--data-plane python|ebpf]

Per rate, real milliseconds unless said otherwise. The switch's ports are captured (run_mininet's pcaps:
tcpdump, kernel timestamps: a worker's frame when its shaper lets it onto the veth, a result when the
switch's does), and every frame is held against exact links: a frame sent at t is due at the far end at
t + the hop's delay + its serialization (the port holds it that long), and not before the link's frame
before it is through. "Late" is how much later it came: the steps below are the call's critical path,
each from the latest frame of the step before.
  ratio          Mininet's completion time over the local backend's (the calibration's figure: 2% tolerance)
  excess         the same as real time: how much longer the Mininet run took than its links allow
  frame, delay   one 8250-byte frame's serialization at the real rate; the hop's delay, dilated
  start          the latest worker's exponent frame, against the calls' start (wake-up on "go", port hold)
  exponent       the switch's answer to the exponent agreement, against that frame (its wake-up and hold; a
                 round trip every call makes before its data: innet.hosts.worker.call)
  turnaround     the latest worker's first data frame, against that answer (its wake-up and hold)
  stream         the last result, against that frame: the rest of that worker's data up at the link's rate,
                 the last result's hop down (the shaper's early frames, the switch's lateness, its results
                 falling behind their links); "results" is each result's own lateness (median/p99/max)
  end            the calls' end (the last worker's) after the last result left the switch: a worker's wake-up
  ideal          the path on exact links: the five steps above add up to the calls' span less this
  pace           the data frames' span on a port over their serializations (the slowest port), up and down:
                 under 1, the shaper let them through faster than the link's rate; and the share of gaps under
                 half a frame (frames let through together: htb's burst)
  cpu/wait       the run's fidelity record: each process's share of a core, and of the run spent waiting for
                 one; and the kernel's softirq threads' (ksoftirqd: deferred shaper and veth work), summed
  timer          how late a wake-up one frame ahead comes: select.poll on innet's wait_ms (innet.node.egress:
                 what every process's pacing waits on), and time.sleep (median/p99)
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.node.egress import wait_ms  # noqa: E402
from innet.wire.packet import HEADER_OFFSET, RESULT, RETX  # noqa: E402

RATES = (5.0, 10.0, 20.0, 40.0)  # real Mbit/s
FRAME_BYTES = 8250  # the calibration's frames: 2048 values (innet's default packet)
TIMER_SAMPLES = 40
HEADER = struct.Struct("!HHHHIHB")  # job, rank, nworkers, slot, chunk, count, flags (innet.wire.packet's InnetAgg)

Frame = tuple[float, int, int, int, int, int]  # seconds, rank, slot, chunk, flags, bytes


def read_pcap(path: str) -> list[Frame]:
    """The innet frames of a pcap file (tcpdump's, classic format), with their kernel timestamps."""
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < 24:
        return []
    scale = {0xA1B2C3D4: 1e-6, 0xA1B23C4D: 1e-9}[struct.unpack("<I", data[:4])[0]]
    out, at = [], 24
    while at + 16 <= len(data):
        sec, frac, caplen, length = struct.unpack("<IIII", data[at:at + 16])
        frame = data[at + 16:at + 16 + caplen]
        at += 16 + caplen
        if len(frame) >= HEADER_OFFSET + HEADER.size and frame[12:14] == b"\x08\x00" and frame[23] == 17:
            _, rank, _, slot, chunk, _, flags = HEADER.unpack_from(frame, HEADER_OFFSET)
            out.append((sec + frac * scale, rank, slot, chunk, flags, length))
    return out


def spread(values: Sequence[float], scale: float = 1e3) -> dict[str, float]:
    """Median, 99th percentile and largest of ``values`` (times ``scale``: seconds to ms by default)."""
    if not values:
        return {"median": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"median": round(statistics.median(ordered) * scale, 3), "p99": round(p99 * scale, 3),
            "max": round(ordered[-1] * scale, 3)}


def stages(ports: dict[str, list[Frame]], start: float, end: float, rate: float, delay: float) -> dict[str, object]:
    """The switch's ports' frames (contributions in, results out; first copies only; kernel timestamps), the
    calls' window (``start``, ``end``: the same clock) and the links' ``rate`` (bit/s) and one-way ``delay``
    (s, real), made into the critical path of the module's docstring: each step's lateness against exact
    links, from the latest frame of the step before. They add up to the window less ``ideal_ms``."""
    def ser(f: Frame) -> float:
        return f[5] * 8 / rate

    ins: dict[str, list[Frame]] = {}
    outs: dict[str, list[Frame]] = {}
    retx = 0
    for port, frames in ports.items():
        seen_in: dict[int, Frame] = {}
        seen_out: dict[int, Frame] = {}
        for f in sorted(frames):
            retx += bool(f[4] & RETX)
            (seen_out if f[4] & RESULT else seen_in).setdefault(f[3], f)
        if seen_in:  # a worker's port (the PBox's is idle in innet mode)
            ins[port], outs[port] = sorted(seen_in.values()), sorted(seen_out.values())
    if not ins or not all(len(f) > 1 for f in ins.values()) or not all(outs.values()):
        raise ValueError("no contributions and results captured at the switch")
    last_in: dict[int, float] = defaultdict(float)
    for frames in ins.values():
        for f in frames:
            last_in[f[3]] = max(last_in[f[3]], f[0])
    first = min(last_in)  # the exponent agreement's chunk (innet.hosts.worker.call)
    exp_in = max((frames[0] for frames in ins.values()), key=lambda f: f[0])
    answer = max((f for frames in outs.values() for f in frames if f[3] == first), key=lambda f: f[0])
    data_in = max((frames[1] for frames in ins.values()), key=lambda f: f[0])
    last_out = max((f for frames in outs.values() for f in frames), key=lambda f: f[0])
    n = max(len(frames) for frames in ins.values()) - 1  # data chunks
    results = []
    for frames in outs.values():
        prev = 0.0
        for f in frames:
            if f[3] != first:
                results.append(f[0] - max(last_in[f[3]] + delay + ser(f), prev + ser(f)))
            prev = f[0]

    def paced(per_port: dict[str, list[Frame]]) -> dict[str, float]:
        """The data frames' pace on each port: their span over their serializations (the slowest port's), and
        the share of gaps under half a frame (frames let through in a burst)."""
        streams = [[f for f in frames if f[3] != first] for frames in per_port.values()]
        gaps = [(b[0] - a[0]) / ser(b) for fs in streams for a, b in zip(fs, fs[1:], strict=False)]
        spans = [(fs[-1][0] - fs[0][0]) / sum(map(ser, fs[1:])) for fs in streams if len(fs) > 1]
        return {"pace": round(max(spans), 4) if spans else float("nan"),
                "bursts": round(sum(g < 0.5 for g in gaps) / len(gaps), 3) if gaps else float("nan")}

    def ms(seconds: float) -> float:
        return round(seconds * 1e3, 3)

    stream = (n - 1) * ser(data_in) + delay + ser(last_out)  # the latest worker's other data up, the last result down
    return {"start_ms": ms(exp_in[0] - (start + delay + ser(exp_in))),
            "exponent_ms": ms(answer[0] - (exp_in[0] + delay + ser(answer))),
            "turnaround_ms": ms(data_in[0] - (answer[0] + delay + ser(data_in))),
            "stream_ms": ms(last_out[0] - data_in[0] - stream), "end_ms": ms(end - last_out[0]),
            "ideal_ms": ms(3 * delay + ser(exp_in) + ser(answer) + ser(data_in) + stream),
            "results_ms": spread(results), "up": paced(ins), "down": paced(outs), "retransmitted": retx,
            "contributions": sum(map(len, ins.values())), "results": sum(map(len, outs.values()))}


def timer_late(wait_s: float, samples: int = TIMER_SAMPLES) -> dict[str, dict[str, float | int]]:
    """How late a wake-up ``wait_s`` ahead comes: select.poll on innet's wait_ms (what the workers' and
    switches' pacing waits on), and time.sleep."""
    r, w = os.pipe()
    poller = select.poll()
    poller.register(r, select.POLLIN)

    def late(wait: Callable[[float], object]) -> list[float]:
        out = []
        for _ in range(samples):
            due = time.monotonic() + wait_s
            wait(due)
            out.append(time.monotonic() - due)
        return out

    try:
        return {"poll_ms": spread(late(lambda due: poller.poll(wait_ms(due)))),
                "sleep_ms": spread(late(lambda due: time.sleep(max(0.0, due - time.monotonic()))))}
    finally:
        os.close(r)
        os.close(w)


def softirq_threads() -> list[str]:
    """The schedstat files of the kernel's softirq threads (ksoftirqd/N): where the shaper's and the veths'
    work goes when softirqs are deferred, as they are on a busy machine."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
                if fh.read().startswith("ksoftirqd/"):
                    found.append(f"/proc/{pid}/schedstat")
        except OSError:
            continue
    return found


class Softirq:
    """The softirq threads' CPU time and wait for a CPU, sampled every ``every`` seconds in a thread, so that
    their share of the calls' window can be read afterwards (``shares``)."""

    def __init__(self, every: float = 0.005) -> None:
        self.paths, self.every = softirq_threads(), every
        self.samples: list[tuple[float, int, int]] = []  # monotonic, CPU ns, wait ns (summed over the threads)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _take(self) -> None:
        ran = waited = 0
        for path in self.paths:
            try:
                with open(path, encoding="ascii") as fh:
                    run_ns, wait_ns, _ = fh.read().split()
            except (OSError, ValueError):
                continue
            ran, waited = ran + int(run_ns), waited + int(wait_ns)
        self.samples.append((time.monotonic(), ran, waited))

    def _run(self) -> None:
        while not self.done.wait(self.every):
            self._take()

    def __enter__(self) -> Softirq:
        self._take()
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()

    def shares(self, start: float, end: float) -> dict[str, float]:
        """The threads' CPU and wait over [``start``, ``end``] (monotonic), each as a share of that span."""
        before = max((s for s in self.samples if s[0] <= start), default=self.samples[0])
        after = min((s for s in self.samples if s[0] >= end), default=self.samples[-1])
        span = max(after[0] - before[0], 1e-9)
        return {"cpu": round((after[1] - before[1]) / 1e9 / span, 3), "wait": round((after[2] - before[2]) / 1e9 / span, 3)}


def breakdown(rate: float, local_s: float | None = None, data_plane: str = "auto") -> dict[str, object]:
    """One Mininet run of the calibration at ``rate`` real Mbit/s on ``data_plane``'s switch, its ports captured,
    broken down."""
    from dataclasses import replace

    from innet.backends.mininet import emulation
    from innet.backends.mininet.calibration import CALIBRATION_GROUP, calibration_case, local_completion

    graph, spec, factor = calibration_case(rate)
    spec = replace(spec, data_plane=data_plane)
    local = local_s if local_s is not None else local_completion(graph)
    delay = max(d.get("latency", 0.0) for _, _, d in graph.edges(data=True)) * factor
    windows: list[tuple[float, float] | None] = []
    calls_window = emulation.calls_window

    def kept(*args: object) -> tuple[float, float] | None:  # the calls' window, as the run reads it
        windows.append(calls_window(*args))  # type: ignore[arg-type]
        return windows[-1]

    emulation.calls_window = kept  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory(prefix="innet-fidelity-") as tmp:
            pcaps = os.path.join(tmp, "pcap")
            wall = time.time() - time.monotonic()  # tcpdump's clock less the workers' (both this machine's)
            with Softirq() as softirq:
                record = emulation.run_mininet(graph, spec, pcap_dir=pcaps, dilation=factor,
                                               node_group=CALIBRATION_GROUP)  # as the calibration runs it
            time.sleep(0.2)  # tcpdump ended with the network: let it have written its last frames
            ports = {name[:-5]: read_pcap(os.path.join(pcaps, name)) for name in sorted(os.listdir(pcaps))
                     if name.endswith(".pcap")}
    finally:
        emulation.calls_window = calls_window
    window = windows[0] if windows else None
    if window is None:
        raise RuntimeError("the run left no calls' window (a worker failed?)")
    fid = record["fidelity"]
    return {
        "rate_mbps": rate, "dilation": round(factor, 1), "correct": bool(record["correct"]),
        "ratio": round(record["completion_s"] / local, 4),
        "completion_ms": round(record["completion_s"] * factor * 1e3, 3), "local_ms": round(local * factor * 1e3, 3),
        "excess_ms": round((record["completion_s"] - local) * factor * 1e3, 3),
        "frame_ms": round(FRAME_BYTES * 8 / (rate * 1e3), 3), "delay_ms": round(delay * 1e3, 3),
        **stages(ports, window[0] + wall, window[1] + wall, rate * 1e6, delay),
        "cpu": fid["cpu"], "wait": fid["wait"], "softirq": softirq.shares(*window), "verdict": fid["verdict"],
        "timer": timer_late(FRAME_BYTES * 8 / (rate * 1e6)),
    }


def lines(row: dict[str, object]) -> list[str]:
    """``row`` (a ``breakdown``) as the few lines the script prints."""
    def ms(key: str) -> str:
        s = row[key]
        assert isinstance(s, dict)
        return f"{s['median']:g}/{s['p99']:g}/{s['max']:g}"

    up, down, timer, cpu, wait, soft = (row[k] for k in ("up", "down", "timer", "cpu", "wait", "softirq"))
    assert isinstance(up, dict) and isinstance(down, dict) and isinstance(timer, dict)
    assert isinstance(cpu, dict) and isinstance(wait, dict) and isinstance(soft, dict)
    return [
        f"{row['rate_mbps']:g} Mbit/s real (dilation {row['dilation']:g}): ratio {row['ratio']:.4f}, "
        f"completion {row['completion_ms']:.1f} ms vs local {row['local_ms']:.1f} (excess {row['excess_ms']:.1f}); "
        f"frame {row['frame_ms']:.2f} ms, hop delay {row['delay_ms']:.1f} ms; {row['verdict']}",
        f"  late (ms): start {row['start_ms']:.2f}, exponent answer {row['exponent_ms']:.2f}, turnaround "
        f"{row['turnaround_ms']:.2f}, stream {row['stream_ms']:.2f}, end {row['end_ms']:.2f} (path {row['ideal_ms']:.1f} "
        f"on exact links); each result {ms('results_ms')} (median/p99/max)",
        f"  pace (span over serialization): up {up['pace']:.4f} ({up['bursts']:.0%} bursts), "
        f"down {down['pace']:.4f} ({down['bursts']:.0%} bursts); {row['contributions']} in, {row['results']} out, "
        f"{row['retransmitted']} retransmitted",
        "  cpu/wait " + ", ".join(f"{k} {v:g}/{wait.get(k, 0):g}" for k, v in cpu.items())
        + f", ksoftirqd {soft['cpu']:g}/{soft['wait']:g}",
        f"  timer late for a {row['frame_ms']:.2f} ms wait: poll {timer['poll_ms']['median']:g}/{timer['poll_ms']['p99']:g}, "
        f"sleep {timer['sleep_ms']['median']:g}/{timer['sleep_ms']['p99']:g} ms (median/p99)",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES), help="real Mbit/s, comma-separated")
    p.add_argument("--json", default="", help="also write the rows to this file")
    p.add_argument("--data-plane", default="auto", choices=("auto", "python", "ebpf"),
                   help="the star's switch, as run_topology.py's (default auto: eBPF where it loads)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_fidelity: needs root (Mininet): sudo python scripts/bench_fidelity.py", file=sys.stderr)
        return 2
    from innet.backends.mininet.calibration import calibration_case, local_completion

    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
    local = local_completion(calibration_case(RATES[0])[0])  # the same virtual run at every rate
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        rows.append(breakdown(rate, local, args.data_plane))
        print("\n".join(lines(rows[-1])), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
