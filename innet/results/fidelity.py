"""A run's fidelity: did the emulation measure the network, or the machine it ran on?

Given the dilation used, each process's share of a core over the run and the frames every interface
dropped, the verdict is "faithful" unless a process was CPU-bound, the run's processes together kept
the machine's cores busy, or frames were dropped at a queue or an interface (links an injected
``--loss`` makes lossy drop in the sender's fault injector, which none of these counts). The reasons
say which, in a line a reader can act on. Replaces the warnings runs printed before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from innet.graph import natural_key
from innet.results.record import RunRecord

CPU_BOUND = 0.8  # of one core over the run: a process this busy set the pace, not the links
TIME_TOLERANCE = 1.1  # measured over the timing model's time (the local backend's, to within 0.3%)
FAITHFUL = "faithful"
NOT_FAITHFUL = "not faithful"


@dataclass(frozen=True)
class Fidelity:
    """A run's ``fidelity`` record: the verdict, why, and what it was judged on (results.json's layout:
    ``shaper_burst_s`` and ``cpu_over_s`` where the machine was measured, ``model_ratio`` where the run was
    held against the timing model)."""

    dilation: float
    verdict: str
    reasons: tuple[str, ...]
    cpu: dict[str, float]  # process -> share of a core over the run
    wait: dict[str, float]  # process -> share of the run spent waiting for a core
    drops: dict[str, int]  # interface -> frames dropped at its queue and by itself
    cpu_over_s: float | None = None  # measured: the shares' span (None: nothing measured)
    shaper_burst_s: float | None = None  # measured: the shaper's bursts (None: TCLink's per-frame shaping)
    dilation_bound: str = ""  # auto's: the bound that chose the factor (innet.planning.timing.dilation.auto_bounds)
    modelled: bool = False  # held against the timing model: ``model_ratio`` is written (None: no model time)
    model_ratio: float | None = None
    sched: dict[str, str] | None = None  # process -> the scheduler policy it served under (innet.io.sched.granted)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"dilation": self.dilation, "verdict": self.verdict, "reasons": list(self.reasons),
                                  "cpu": dict(self.cpu), "wait": dict(self.wait), "drops": dict(self.drops)}
        if self.dilation_bound:
            out["dilation_bound"] = self.dilation_bound
        if self.cpu_over_s is not None:
            out.update(shaper_burst_s=self.shaper_burst_s, cpu_over_s=self.cpu_over_s)
        if self.modelled:
            out["model_ratio"] = self.model_ratio
        if self.sched is not None:
            out["sched"] = dict(self.sched)
        return out

    def judged(self, reason: str) -> Fidelity:
        """Not faithful, for ``reason`` too."""
        return replace(self, verdict=NOT_FAITHFUL, reasons=(*self.reasons, reason))


def fidelity(dilation: float, cpu: Mapping[str, float], queue: Mapping[str, int], interface: Mapping[str, int],
             socket: Mapping[str, int] | None = None, cores: int = 1,
             wait: Mapping[str, float] | None = None) -> Fidelity:
    """The ``fidelity`` record: ``cpu`` process -> share of a core; ``wait`` process -> share of the run it
    spent runnable, waiting for a CPU (other processes', this run's or not, had them all); ``queue``,
    ``interface``: interface -> frames dropped at its queue, by itself; ``socket``: switch -> frames its
    sockets dropped. A process busy or waiting for a core 80% of the run was CPU-bound."""
    wait = wait or {}
    reasons = []
    for name, share in sorted(cpu.items(), key=lambda kv: natural_key(kv[0])):
        waited = wait.get(name, 0.0)
        if share + waited >= CPU_BOUND:
            reasons.append(f"{name} used {share:.2f} of a core" + (f" and waited {waited:.2f} of the run for one"
                                                                    if waited >= 0.005 else ""))
    total = sum(cpu.values())
    if total >= CPU_BOUND * cores:
        reasons.append(f"the run's processes kept {total:.1f} of the {cores} cores busy")
    for what, counts in (("at their queues", queue), ("at the interface", interface), ("at a switch's sockets", socket or {})):
        dropped = {k: n for k, n in sorted(counts.items(), key=lambda kv: natural_key(kv[0])) if n > 0}
        if dropped:
            detail = ", ".join(f"{k}: {n}" for k, n in dropped.items())
            reasons.append(f"{len(dropped)} interface(s) dropped frames {what} ({detail})" if what != "at a switch's sockets"
                           else f"{len(dropped)} switch(es) dropped frames at their sockets ({detail})")
    drops = {k: queue.get(k, 0) + interface.get(k, 0) for k in sorted({*queue, *interface}, key=natural_key)}
    return Fidelity(float(dilation), NOT_FAITHFUL if reasons else FAITHFUL, tuple(reasons),
                    {k: round(v, 3) for k, v in sorted(cpu.items(), key=lambda kv: natural_key(kv[0]))},
                    {k: round(v, 3) for k, v in sorted(wait.items(), key=lambda kv: natural_key(kv[0]))}, drops)


def with_retransmissions(fid: Fidelity, retransmissions: int, lossy: bool) -> Fidelity:
    """``fid`` judged also by the run's retransmissions: on links without injected loss, duplication or
    reordering a faithful emulation retransmits nothing (a retransmission there is a timer that fired
    because a process was late)."""
    if lossy or retransmissions <= 0:
        return fid
    return fid.judged(f"{retransmissions} retransmission(s) on links without injected faults: results came back after the RTO")


def with_model(fid: Fidelity, measured: float, model: float) -> Fidelity:
    """``fid`` judged also against the timing model: a run ``TIME_TOLERANCE`` or more slower than the links
    allow measured something else (the model gives the local backend's virtual time to within 0.3%), and so did
    one as much faster (its links were not held to their rates: fat-tree k=8's ring at dilation 4175 took 0.47x)."""
    fid = replace(fid, modelled=True, model_ratio=round(measured / model, 4) if model > 0 and measured == measured else None)
    if fid.model_ratio is None or 1 / TIME_TOLERANCE <= fid.model_ratio <= TIME_TOLERANCE:
        return fid
    if fid.model_ratio < 1:  # the shaper let frames through faster than the dilated rate (htb at a fraction of a Mbit/s)
        return fid.judged(f"took {fid.model_ratio:.2f}x the {model:.4g} s its links allow (the timing model): faster than "
                          "its links were shaped to carry it")
    return fid.judged(f"took {fid.model_ratio:.2f}x the {model:.4g} s its links allow (the timing model)")


def sched_line(sched: Mapping[str, str], asked: str) -> str:
    """One line where processes did not get the policy ``asked`` ($INNET_SCHED's, innet.io.sched.prioritize):
    how many, which (the first few) and what they ran under ("" where every one got it, or it asked for none)."""
    if asked not in ("fifo", "rr"):
        return ""
    missed = {name: got for name, got in sorted(sched.items(), key=lambda kv: natural_key(kv[0])) if got != asked}
    if not missed:
        return ""
    shown = ", ".join(f"{name}: {got}" for name, got in list(missed.items())[:4]) + (", ..." if len(missed) > 4 else "")
    return (f"scheduler: {len(missed)} of {len(sched)} processes ran without SCHED_{asked.upper()} ({shown}): the kernel "
            "refused it (innet/io/sched.py)")


def virtual_fidelity(dilation: float = 1.0) -> Fidelity:
    """The local backend's: virtual time, nothing measured can be the machine's."""
    return Fidelity(float(dilation), FAITHFUL, ("virtual time: the fabric's clock waits for the CPU",), {}, {}, {})


def kernel_fidelity() -> Fidelity:
    """gloo's (``--backend gloo``): the kernel's TCP on undilated links; none of innet's processes is in it."""
    return Fidelity(1.0, "not judged", ("torch's gloo: the kernel's TCP on undilated links, not innet's processes",),
                    {}, {}, {})


def fidelity_line(record: RunRecord) -> str:
    """One line for the summary: the verdict, the dilation, and why."""
    return verdict_line(record["mode"], record["fidelity"])  # a Fidelity, or the dict a record read back from results.json has


def verdict_line(mode: str, fid: Any) -> str:
    """``fidelity_line`` of ``mode``'s ``fid`` (a Fidelity or its JSON view)."""
    factor = f"dilation {fid['dilation']:g}" if fid["dilation"] != 1 else "no dilation"
    factor += f", auto's {fid['dilation_bound']} bound" if fid.get("dilation_bound") else ""
    why = f": {'; '.join(fid['reasons'])}" if fid["reasons"] else ""
    return f"fidelity: {mode}: {fid['verdict']} ({factor}){why}"
