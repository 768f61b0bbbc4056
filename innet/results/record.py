"""Run records: what one run of one mode gave, as frozen values, and their JSON.

A ``RunRecord`` has the fields every run has (mode, correctness, time, bytes per link, drops...)
and ``figures``: the scheme's and the backend's own (a workload's iteration times, a consistency
run's staleness, top-k's byte ratio, the Mininet processes' CPU, the input stream, the model's
prediction). ``to_json`` flattens figures into the record, which is results.json's stable layout;
``record["name"]`` reads that JSON view by name, for scripts and tests that address fields by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

JsonObject = dict[str, Any]  # a record as results.json holds it: the one edge where records become plain JSON


class _JsonView:
    """``to_json``, and reading its fields by name."""

    figures: Mapping[str, Any]

    def to_json(self) -> JsonObject:
        return _json(self)

    def __getitem__(self, name: str) -> Any:
        return self.to_json()[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.to_json().get(name, default)


@dataclass(frozen=True)
class JobRecord(_JsonView):
    """One job's verdict within a run."""

    job: int
    workers: tuple[str, ...]
    placement: str
    outcome: str
    priority: int
    correct: bool
    max_abs_error: float
    completion_s: float
    retransmissions: int
    errors: tuple[str, ...]
    result_digest: str
    figures: Mapping[str, Any] = field(default_factory=dict)
    spurious_retransmissions: int = 0  # answered sooner than a round trip could: the original was not lost
    host_queued: int = 0  # resends not made: the last copy was still in the sender's host queue


@dataclass(frozen=True)
class CallSpan:
    """One call of one rank: its collective, elements, start and end (seconds on the run's timeline)."""

    job: int
    rank: int
    host: str
    call: int
    collective: str
    elements: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SlotTrack:
    """One switch's slots held, (seconds, slots) at each change from none, and its pool's slots."""

    switch: str
    slots: int
    held: tuple[tuple[float, int], ...]


@dataclass(frozen=True)
class Timeline:
    """A mode run's timeline (``--timeline``): every rank's calls and every switch's slots held, on the run's
    timeline (innet.results.report.trace_events)."""

    calls: tuple[CallSpan, ...]
    switches: tuple[SlotTrack, ...]

    @property
    def end_s(self) -> float:
        """When the last call ended."""
        return max((c.end_s for c in self.calls), default=0.0)


@dataclass(frozen=True)
class RunRecord(_JsonView):
    """One run of one mode on one backend."""

    mode: str
    backend: str
    program: str
    placement: str
    workers: int
    elements: int
    packet_elements: int
    iterations: int
    seed: int
    correct: bool
    max_abs_error: float
    completion_s: float
    link_bytes: Mapping[str, int]
    tier_bytes: Mapping[str, int]
    cross_rack_bytes: int
    max_link_bytes: int  # the busiest link's bytes
    busiest_link: str  # the link whose bytes take longest at its rate (innet.results.metrics.busiest_link)
    predicted_link_bytes: Mapping[str, int]
    retransmissions: int
    packets_dropped: int
    drops: Mapping[str, int]
    fallbacks: int
    errors: tuple[str, ...]
    result_digest: str
    jobs: tuple[JobRecord, ...]
    figures: Mapping[str, Any] = field(default_factory=dict)
    spurious_retransmissions: int = 0  # of ``retransmissions``: answered sooner than a round trip could
    host_queued: int = 0  # resends not made: the last copy was still in the sender's host queue (``skb_still_in_host_queue``)
    # ``link_bytes`` and ``predicted_link_bytes`` one direction at a time, by link name: up is from the end the link's
    # tier names first (host to ToR, ToR to spine: innet.graph.uplink), down the other way; measured: empty where
    # the backend counted no directions
    link_bytes_up: Mapping[str, int] = field(default_factory=dict)
    link_bytes_down: Mapping[str, int] = field(default_factory=dict)
    predicted_link_bytes_up: Mapping[str, int] = field(default_factory=dict)
    predicted_link_bytes_down: Mapping[str, int] = field(default_factory=dict)
    # with ``--timeline``: each rank's calls and each switch's slots held (written as a trace, not into results.json)
    timeline: Timeline | None = field(default=None, compare=False, repr=False, metadata={"json": False})

    def with_figures(self, **more: Any) -> RunRecord:
        """The record with more figures (e.g. the model's prediction, or a backend's measurements)."""
        return replace(self, figures={**self.figures, **more})

    @property
    def fidelity(self) -> Any:
        """How far the run's times can be trusted (innet.results.fidelity.Fidelity: dilation, verdict, CPU
        shares, drops); None for a record without one."""
        return self.figures.get("fidelity")


def _json(record: Any) -> JsonObject:
    out: JsonObject = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if f.name == "figures" or not f.metadata.get("json", True):
            continue
        if isinstance(value, tuple) and value and hasattr(value[0], "to_json"):
            value = [v.to_json() for v in value]
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        out[f.name] = value
    return {**out, **{k: json_value(v) for k, v in record.figures.items()}}


def json_value(value: object) -> object:
    """A figure as JSON values: a record (innet.results.fidelity.Fidelity, an input stream's summary...) as its
    ``to_json`` or its fields, in order; everything else as it is."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_value(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_value(v) for v in value]
    return value
