"""``--dilation auto``: the link rate this machine carries faithfully, measured once and cached.

The calibration runs what the dilation is for: an all-reduce on a star of 4 (innet mode, 65536 elements; each
worker in its own process, ``CALIBRATION_GROUP``) at ``TARGET_MBPS`` on Mininet, dilated so its links run at a
candidate real rate, and the same run on the local backend (virtual time, no CPU in it). The faithful rate is the
highest candidate, doubling from ``RATES[0]``, at which Mininet's completion time (the median of
``CALIBRATION_RUNS``, fewer when the first agree: ``settled``) is within ``TOLERANCE`` of the local one; the first
candidate that misses ends the doubling, and ``REFINE`` halvings of the ratio between the two (geometric midpoints,
each measured alike) place the rate to within 2^(1/4) (19%) of where it misses. A dilated run at real rate r
does what an undilated run at r does, so the figure holds for any requested rate; a run's factor is then
``innet.schemes.modes.auto_dilation``: more where a run keeps more links busy at once than this star.

It also measures what a frame pays per process hop in wall time (``hop_s``): barriers on the same star,
undilated at the faithful rate (one tiny frame from each worker through the switch and back, nothing to
carry), Mininet's time per call (on the eBPF switch from its last rank's start) less the local backend's (the
links' time) over the hops the timing model counts on the barrier's path. Dilation divides it by the factor; a run whose critical path has
many hops for its time (a barrier, a small call, a long ring) is dilated until they weigh little
(``innet.planning.timing.dilation.latency_factor``).

Each data plane (``--data-plane``) is calibrated apart: the Python switch's in ``cache_dir()/calibration.json``,
the eBPF switch's (the star's switch in the kernel, each hop held by the host at its end) in
``calibration-ebpf.json``; the hop is measured on each plane's own switch, at its faithful rate (``measured_hop``). Each is keyed
by the CPU model, the core count and the data plane's version (a digest of the code every frame passes through,
so a change there recalibrates by itself). A file keeps the last ``KEPT`` keys' calibrations: checkouts of other
versions on one machine (a branch, a release) each keep theirs instead of measuring again every time the other ran.
``sudo python scripts/calibrate_dilation.py`` measures again and rewrites this key's; deleting the file forgets
them all. A machine busy with other work when it calibrates measures a lower rate.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from innet.backends.mininet.dataplane import cache_dir
from innet.errors import UserError
from innet.node.codec import from_json, to_json
from innet.results.files import write_text_atomic
from innet.shipped import CHECKOUT as ROOT
from innet.shipped import PROGRAMS

RATES = (2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)  # Mbit/s, real, tried in order
REFINE = 2  # geometric midpoints measured between the last faithful rate and the first miss: on the doubling grid alone
# a rate 1.9x apart from the 2% line read alike (the eBPF star's line at ~95-113 Mbit/s, the Python one's at ~11: 80
# against 10 or 5, 8x or 16x by which side of 2% the runs at 10 landed; docs/performance.md)
TARGET_MBPS = 100000.0  # the virtual rate calibrated at: the seeds' 100 Gbit/s
TOLERANCE = 1.02  # Mininet's completion time over the local backend's: a fifth of the 10% a run should meet, since
# the other modes load the CPU more than this one star does (runs that keep more links busy are dilated more: auto_dilation),
# and runs of more hops lose more (at the 40 Mbit/s 1.05 chose, star 1.02, the default leaf-spine's PBox 1.05-1.10)
WITHIN = 1  # band_side of a ratio within TOLERANCE either way (0 below the band, 2 above it)
CALIBRATION_TIMEOUT_S = 20.0  # real seconds without progress before a calibration run gives up
CALIBRATION_RUNS = 3  # Mininet runs per candidate rate, their median taken: one run beside other programs' load misses by chance;
# the runs stop once more than half agree on the side of the band the median is then on (settled)
HOP_CALLS = 9  # barrier calls the hop latency is the median of: one more Mininet run, 10-15 s here (of ~70 s)
CALIBRATION_VERSION = 7  # bump when the procedure above changes (5: band_side on numpy ratios fixed; 6: CALIBRATION_GROUP;
# 7: REFINE)
EBPF_HOP = 3  # the eBPF calibration's hop: 1 measured through the Python switch, 2 its own (hosts' hops only), 3 from
# each barrier's last start (from_last_start)
CALIBRATION_GROUP = 1  # the star's workers each in a process of its own: as a large run's, several processes a core
# (innet.planning.grouping), not a small run's one a core, which carried twice the rate (eBPF 160 Mbit/s, Python 10),
# and fat-tree k=8's ring dilated by that calibration kept 1.6-1.8 cores busy and was not faithful
KEPT = 8  # calibrations calibration.json keeps, the newest: one per machine key (data plane version)
DATA_PLANE = ("innet/wire/packet.py", "innet/switch/runtime.py", "innet/switch/engine.py", "innet/switch/reduction.py",
              "innet/switch/program.py", "innet/hosts/worker/call.py", "innet/hosts/worker/window.py",
              "innet/hosts/worker/framing.py", "innet/hosts/worker/process.py", "innet/hosts/recovery.py",
              "innet/hosts/ring/call.py", "innet/hosts/ring/acks.py", "innet/hosts/pbox.py", "innet/node/__main__.py",
              "innet/node/switch.py", "innet/node/worker.py", "innet/io/rawport.py", "innet/io/mmsg.py",
              "innet/node/egress.py", "innet/io/sched.py", "innet/backends/mininet/shaper.py", "innet/planning/grouping.py",
              os.path.relpath(os.path.join(PROGRAMS, "sum_allreduce.py"), ROOT))  # innet/switch_programs/ installed
# and DATA_PLANE: its hosts, and the switch's Python side
EBPF_PLANE = ("innet/ebpf/switch.c", "innet/ebpf/build.py", "innet/ebpf/loader.py", "innet/backends/mininet/dataplane.py",
              "innet/ebpf/holds.py", "innet/backends/mininet/nodes.py")


def data_plane_version(data_plane: str = "python") -> str:
    """A digest of the data plane's code: the calibration is only as good as the code it measured."""
    digest = hashlib.sha256(f"{CALIBRATION_VERSION} {RATES} {REFINE} {TARGET_MBPS} {TOLERANCE} {CALIBRATION_RUNS}".encode())
    if data_plane != "python":
        digest.update(f"{data_plane} {EBPF_HOP}".encode())
    for rel in DATA_PLANE + (EBPF_PLANE if data_plane == "ebpf" else ()):
        path = os.path.join(ROOT, rel)
        if os.path.exists(path):
            with open(path, "rb") as fh:
                digest.update(fh.read())
    return digest.hexdigest()[:16]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"


@dataclass(frozen=True)
class MachineKey:
    """What a calibration is valid for: this CPU, this many cores, this data plane."""

    cpu: str
    cores: int
    data_plane: str


@dataclass(frozen=True)
class Calibration:
    """The cached calibration (``calibration.json``): the faithful rate, and the ratios it was found from."""

    key: MachineKey
    faithful_mbps: float
    target_mbps: float
    tolerance: float
    ratios: dict[str, float]  # real rate (Mbit/s) -> Mininet's completion time over the local backend's
    when: str
    hop_s: float  # wall seconds a frame pays per process hop (measured_hop)


def machine_key(version: str | None = None, data_plane: str = "python") -> MachineKey:
    return MachineKey(cpu_model(), os.cpu_count() or 1, version or data_plane_version(data_plane))


def cache_file(data_plane: str = "python") -> str:
    """Where ``data_plane``'s calibration is cached."""
    return os.path.join(cache_dir(), "calibration.json" if data_plane == "python" else f"calibration-{data_plane}.json")


def is_cached(data_plane: str = "python") -> bool:
    """Whether this machine's calibration for ``data_plane`` is cached (``calibration`` would not measure it)."""
    key = machine_key(data_plane=data_plane)
    return any(c.key == key for c in _read(cache_file(data_plane)))


def search(ratio_at: Callable[[float], float], rates: tuple[float, ...] | None = None) -> tuple[float, dict[str, float]]:
    """The highest of ``rates`` (in order) whose ``ratio_at`` is within TOLERANCE before the first that is
    not, either way (a run faster than its links was not held to their rates: the eBPF switch's star at 80 Mbit/s
    took 0.98 of their time, the shaper's 2 ms bursts passing two frames at once), then REFINE geometric midpoints
    between it and that miss, each kept where it is within (``faithful_of``); and every ratio measured, in the
    order measured. The lowest rate when none is within."""
    rates = rates or RATES
    measured: dict[str, float] = {}

    def within(rate: float) -> bool:
        ratio = ratio_at(rate)
        measured[f"{rate:g}"] = round(float(ratio), 4)
        return band_side(ratio) == WITHIN

    faithful, miss = rates[0], None
    for rate in rates:
        if not within(rate):
            miss = rate
            break
        faithful = rate
    if miss is not None and miss != rates[0]:
        for _ in range(REFINE):
            mid = float(f"{math.sqrt(faithful * miss):.3g}")
            if within(mid):
                faithful = mid
            else:
                miss = mid
    return faithful, measured


def faithful_of(ratios: dict[str, float]) -> float:
    """The faithful rate a calibration's ``ratios`` (real rate -> ratio) say: the highest rate within TOLERANCE
    below every rate that is not; the lowest rate when there is none."""
    sides = sorted((float(rate), band_side(ratio)) for rate, ratio in ratios.items())
    first_miss = min((rate for rate, side in sides if side != WITHIN), default=math.inf)
    return max((rate for rate, side in sides if side == WITHIN and rate < first_miss), default=sides[0][0])


def faithful_rate(ratio_at: Callable[[float], float] | None = None, version: str | None = None,
                  again: bool = False, rates: tuple[float, ...] | None = None,
                  hop_at: Callable[[float], float] | None = None, data_plane: str = "python") -> float:
    """The cached faithful rate for this machine (``calibration``'s)."""
    return calibration(ratio_at, version, again, rates, hop_at, data_plane).faithful_mbps


def calibration(ratio_at: Callable[[float], float] | None = None, version: str | None = None,
                again: bool = False, rates: tuple[float, ...] | None = None,
                hop_at: Callable[[float], float] | None = None, data_plane: str = "python") -> Calibration:
    """The cached calibration for this machine and ``data_plane``, measured first (the faithful rate with
    ``ratio_at``, default ``measured_ratio`` on ``data_plane``, at ``rates``, default RATES; then the hop latency at
    that rate with ``hop_at``, default ``measured_hop``) when there is none for this machine and data plane, or
    with ``again``."""
    key = machine_key(version, data_plane)
    path = cache_file(data_plane)
    kept = _read(path)
    if not again:
        cached = next((c for c in kept if c.key == key), None)
        if cached is not None:
            return cached
    _log(f"calibrating time dilation for the {data_plane} data plane (once per machine and data plane; a few "
         "Mininet runs)")
    rate, measured = search(ratio_at or (lambda r: measured_ratio(r, data_plane)), rates)
    hop = round(float((hop_at or (lambda r: measured_hop(r, data_plane)))(rate)), 6)
    record = Calibration(key, rate, TARGET_MBPS, TOLERANCE, measured, time.strftime("%Y-%m-%dT%H:%M:%S%z"), hop)
    try:
        others = [to_json(c) for c in kept if c.key != key][-(KEPT - 1):]
        write_text_atomic(path, json.dumps({"calibrations": [*others, to_json(record)]}, indent=1))
    except UserError as exc:
        raise UserError(f"cannot write the dilation calibration ({exc}); "
                        "set INNET_CACHE_DIR to a writable directory") from None
    _log(f"faithful rate {rate:g} Mbit/s (Mininet/local completion time by real rate: {measured}), "
         f"{hop * 1e3:.3g} ms a process hop; saved in {path}")
    return record


def _read(path: str) -> list[Calibration]:
    """The cached calibrations, oldest first; none where there is no file, or not one this version can read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [from_json(Calibration, c) for c in json.load(fh)["calibrations"]]
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return []


def calibration_case(rate: float) -> tuple[Any, Any, float]:
    """The calibration's run at ``rate`` real Mbit/s: its star (links at ``TARGET_MBPS`` virtual), its
    RunSpec for Mininet, and the dilation factor that puts the links at ``rate``."""
    from innet.planning.spec import RunSpec
    from innet.planning.timing.dilation import CALIBRATION_WORKERS, MININET_MIN_RTO
    from innet.shipped import build

    factor = TARGET_MBPS / rate
    stuck = CALIBRATION_TIMEOUT_S / factor  # virtual: a wedged calibration run gives up after this many real seconds
    graph = build("star", workers=CALIBRATION_WORKERS, bw=TARGET_MBPS)
    return graph, RunSpec(mode="innet", seed=1, min_rto=MININET_MIN_RTO, timeout=stuck), factor


def local_completion(graph: Any) -> float:
    """The local backend's completion time of the calibration's run on ``graph`` (virtual seconds)."""
    from innet.backends.local.run import run_local
    from innet.planning.spec import RunSpec

    return float(run_local(graph, RunSpec(mode="innet", seed=1)).completion_s)


def measured_ratio(rate: float, data_plane: str = "python") -> float:
    """Mininet's completion time over the local backend's for the calibration run on ``data_plane``, its links at
    ``rate`` real Mbit/s (``TARGET_MBPS`` virtual): the median of ``CALIBRATION_RUNS`` Mininet runs."""
    from dataclasses import replace

    from innet.backends.mininet.emulation import run_mininet

    graph, spec, factor = calibration_case(rate)
    local = local_completion(graph)
    ratios: list[float] = []
    while not settled(ratios):
        record = run_mininet(graph, replace(spec, data_plane=data_plane), dilation=factor, node_group=CALIBRATION_GROUP)
        ran = set(record["switch_data_plane"].values())
        if ran != {data_plane}:
            raise UserError(f"the calibration's star ran the {'/'.join(sorted(ran))} switch, not the {data_plane} one "
                            "(the lines above say why)")
        ratios.append(record.completion_s / local if record.correct else float("inf"))
    return statistics.median(ratios)


def band_side(ratio: float) -> int:
    """Where ``ratio`` falls against the tolerance band: 0 below it (faster than the links), WITHIN, 2 above it. As
    Python floats: numpy's booleans add as a logical or (np.float64 ratios above the band came out WITHIN, and the
    search went on to 320 Mbit/s, calling every rate faithful)."""
    ratio = float(ratio)
    return int(ratio >= 1 / TOLERANCE) + int(ratio > TOLERANCE)


def settled(ratios: list[float]) -> bool:
    """Whether the median of CALIBRATION_RUNS ratios is on a known side of the tolerance band already: all runs
    made, or more than half of them on one side (band_side), which the median then is too."""
    sides = [band_side(ratio) for ratio in ratios]
    return len(ratios) >= CALIBRATION_RUNS or any(2 * sides.count(side) > CALIBRATION_RUNS for side in set(sides))


def measured_hop(rate: float, data_plane: str = "python") -> float:
    """Wall seconds a frame pays per process hop on this machine and ``data_plane``: HOP_CALLS barriers on the
    calibration's star, its links at ``rate`` real Mbit/s, undilated; Mininet's time per call (the median) less the
    local backend's, over the hops the timing model counts on a barrier's path (its time with 1 ms hops less its
    time without, in ms): every node's on the Python switch, on the eBPF switch only the hosts' (its switch forwards
    in the kernel: innet.planning.timing.dilation.woken_graph), and there from each call's last start
    (``from_last_start``; the Python switch's hop_cost is fitted to its whole call, so it keeps it). A barrier that
    fails says nothing: then MININET_HOP, the model's figure for a busy machine."""
    from dataclasses import replace

    from innet.backends.local.run import run_local
    from innet.backends.mininet.emulation import run_mininet
    from innet.planning.spec import RunSpec, program_of
    from innet.planning.timing import MININET_HOP, predict
    from innet.planning.timing.dilation import CALIBRATION_WORKERS, MININET_MIN_RTO, woken_graph
    from innet.schemes.modes import plan_run
    from innet.shipped import build

    graph = build("star", workers=CALIBRATION_WORKERS, bw=rate)
    spec = RunSpec(mode="innet", collective="barrier", seed=1, iterations=HOP_CALLS, min_rto=MININET_MIN_RTO,
                   timeout=CALIBRATION_TIMEOUT_S)
    rp = plan_run(graph, spec, program_of(spec))
    counted = woken_graph(graph) if data_plane == "ebpf" else graph
    hops = (predict(counted, spec, list(rp.plans), rp.per_packet, 1e-3)["completion_s"]
            - predict(graph, spec, list(rp.plans), rp.per_packet, 0.0)["completion_s"]) / 1e-3
    local = run_local(graph, spec).completion_s
    ebpf = data_plane == "ebpf"
    record = run_mininet(graph, replace(spec, data_plane=data_plane), calls=ebpf, node_group=CALIBRATION_GROUP)
    if set(record["switch_data_plane"].values()) != {data_plane}:
        raise UserError(f"the calibration's barrier did not run on the {data_plane} switch (the lines above say why)")
    if not record.correct or hops <= 0:
        return MININET_HOP
    return max(0.0, ((from_last_start(record.timeline) if ebpf else record.completion_s) - local) / hops)


def from_last_start(timeline: Any) -> float:
    """The median call's time from its last rank's start to its last rank's end (a run record's ``timeline``): the
    call's time less its ranks' start spread. Back to back, a call starts on each rank as the previous one ends
    there, so the spread is the previous call's end: its 4 hosts' wake-ups in turn on 2 cores, counted in that
    call already (0.4-1.0 ms of the eBPF star's 1.3-2.9 ms barrier, a third of its median)."""
    calls: dict[int, list[Any]] = {}
    for span in timeline.calls:
        calls.setdefault(span.call, []).append(span)
    return statistics.median(max(s.end_s for s in spans) - max(s.start_s for s in spans) for spans in calls.values())


def _log(msg: str) -> None:
    from innet.backends.mininet.network import log

    log(msg)
