"""Plain-JSON forms of the control plane's messages (switch configs, job specs)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from innet.hosts.worker import JobSpec
from innet.switch.program import JobPort
from innet.switch.runtime import SwitchConfig
from innet.wire.faults import FaultSpec


def _int_keys(d: dict[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}


def config_to_json(cfg: SwitchConfig) -> dict[str, Any]:
    return asdict(cfg)


def config_from_json(data: dict[str, Any]) -> SwitchConfig:
    jobs = {}
    for key, job in data["jobs"].items():
        job = dict(job)
        job["children"] = tuple(job["children"])
        job["contributors"] = _int_keys(job["contributors"])
        job["rank_ports"] = _int_keys(job["rank_ports"])
        jobs[int(key)] = JobPort(**job)
    return SwitchConfig(
        name=data["name"], node=data["node"], tier=data["tier"], ports=_int_keys(data["ports"]),
        neighbors=_int_keys(data["neighbors"]), routes=_int_keys(data["routes"]), jobs=jobs,
        memory_bytes=data["memory_bytes"], groups={int(g): tuple(p) for g, p in data.get("groups", {}).items()},
    )


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return asdict(spec)


def spec_from_json(data: dict[str, Any]) -> JobSpec:
    return JobSpec(**data)


def faults_from_json(data: dict[str, Any]) -> FaultSpec:
    return FaultSpec(**data)
