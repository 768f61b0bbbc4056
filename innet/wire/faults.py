"""Per-link fault injection: loss, duplication, reordering and extra delay.

``tc netem`` does not exist on these machines, so faults are injected where a
frame leaves a port: by the in-process fabric's links and by the Mininet
ports of the switch runtime, with the same parameters and the same code.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

Hold = tuple[float, float]  # a link's hold on a frame: seconds, and seconds per byte of the frame (its serialization)


@dataclass(frozen=True)
class FaultSpec:
    """Fault probabilities for one direction of a link (all default to none)."""

    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.002
    delay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("loss", "dup", "reorder", "reorder_delay", "delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("loss", "dup", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1), got {value}")
        if self.delay < 0 or self.reorder_delay < 0:
            raise ValueError(f"delays must not be negative, got delay {self.delay:g}, reorder_delay {self.reorder_delay:g}")

    @property
    def active(self) -> bool:
        return bool(self.loss or self.dup or self.reorder or self.delay)


def fault_seed(seed: int, sender: str, receiver: str) -> int:
    """The one seed rule: the seed of the faults on frames ``sender`` puts on its link to ``receiver`` in a
    run with ``seed``. Every backend seeds each link direction with it, so the same seed gives the same
    fault pattern on the fabric and on Mininet (frame for frame where the frames go in the same order)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{sender}->{receiver}".encode()).digest()[:8], "big")


class FaultInjector:
    """Applies a FaultSpec to frames: returns (extra delay, frame) per copy sent."""

    def __init__(self, spec: FaultSpec, seed: int = 0) -> None:
        self.spec = spec
        self.seed, self.rng = seed, random.Random(seed)
        self.lost = self.duplicated = self.reordered = 0

    def apply(self, frame: bytes) -> list[tuple[float, bytes]]:
        spec, rng = self.spec, self.rng
        if spec.loss and rng.random() < spec.loss:
            self.lost += 1
            return []
        delay = spec.delay
        if spec.reorder and rng.random() < spec.reorder:
            self.reordered += 1
            delay += spec.reorder_delay * (0.5 + rng.random())
        out = [(delay, frame)]
        if spec.dup and rng.random() < spec.dup:
            self.duplicated += 1
            out.append((delay, frame))
        return out


def parse_link_fault(text: str) -> tuple[str, FaultSpec]:
    """``a--b:loss=0.1`` (both directions) or ``a->b:delay=0.005`` (one port's direction); ValueError if bad."""
    link, _, params = text.partition(":")
    if not ("--" in link or "->" in link) or not params:
        raise ValueError(f"{text!r} is not LINK:key=value,... (e.g. h1--t1:loss=0.05 or t1->h1:loss=0.05)")
    from innet.graph import link_name

    kw = {}
    for item in params.split(","):
        key, _, value = item.partition("=")
        if key not in FaultSpec.__dataclass_fields__:
            raise ValueError(f"unknown fault {key!r}; use loss, dup, reorder, reorder_delay or delay")
        kw[key] = float(value)
    if "->" in link:
        a, b = link.split("->", 1)
        return f"{a}->{b}", FaultSpec(**kw)
    a, b = link.split("--", 1)
    return link_name(a, b), FaultSpec(**kw)
