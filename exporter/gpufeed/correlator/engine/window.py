"""A tagged underutilization window, and its JSON form (the contract's fields exactly)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufeed.correlator.engine.causes import Cause


@dataclass(frozen=True, slots=True)
class Culprit:
    """Who a `straggler` window waits for (the job-level correlation names it): the node,
    the GPU ("" for the node as a whole) and its uuid, the rank ("" where unknown), and the
    culprit's own cause (`unknown`: its node shows no reason)."""

    instance: str
    gpu: str
    uuid: str
    rank: str
    cause: Cause

    def to_json(self) -> dict[str, str]:
        return {
            "instance": self.instance,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "rank": self.rank,
            "cause": self.cause.value,
        }

    @classmethod
    def from_json(cls, d: Any) -> Culprit:
        if not isinstance(d, dict):
            raise ValueError("culprit is not an object")
        return cls(
            str(d.get("instance", "")),
            str(d.get("gpu", "")),
            str(d.get("uuid", "")),
            str(d.get("rank", "")),
            Cause(d.get("cause", Cause.UNKNOWN.value)),
        )


@dataclass(frozen=True, slots=True)
class Window:
    instance: str
    gpu: str  # NVML index; "" for a CPU-only job
    uuid: str
    job_id: str  # "" when no job holds the GPU
    start_seconds: float  # unix time of the first underutilized sample
    end_seconds: float  # unix time it recovered (or the last sample while still open)
    cause: Cause
    confidence_ratio: float
    mean_utilization_ratio: float
    evidence: tuple[tuple[str, float | str], ...]  # the numbers that decided it
    summary: str
    open: bool = False
    culprit: Culprit | None = None  # straggler windows: who the job waits for
    # cause network only: saturated, congestion, link_errors or peer (vocabulary.NetworkReason)
    network_reason: str = ""

    @property
    def duration_seconds(self) -> float:
        return self.end_seconds - self.start_seconds

    def to_json(self) -> dict[str, Any]:
        ev: dict[str, Any] = dict(self.evidence)
        if self.culprit is not None:
            ev["culprit"] = self.culprit.to_json()
        ev["summary"] = self.summary
        out: dict[str, Any] = {
            "instance": self.instance,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "job_id": self.job_id,
            "start": round(self.start_seconds, 3),
            "end": round(self.end_seconds, 3),
            "cause": self.cause.value,
            "confidence": round(self.confidence_ratio, 3),
            "mean_utilization": round(self.mean_utilization_ratio, 4),
            "evidence": ev,
        }
        if self.network_reason:
            out["network_reason"] = self.network_reason
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any], open_: bool = False) -> Window:
        ev = dict(d.get("evidence") or {})
        summary = str(ev.pop("summary", ""))
        culprit = Culprit.from_json(ev.pop("culprit")) if "culprit" in ev else None
        return cls(
            instance=str(d["instance"]),
            gpu=str(d["gpu"]),
            uuid=str(d.get("uuid", "")),
            job_id=str(d.get("job_id", "")),
            start_seconds=float(d["start"]),
            end_seconds=float(d["end"]),
            cause=Cause(d["cause"]),
            confidence_ratio=float(d["confidence"]),
            mean_utilization_ratio=float(d["mean_utilization"]),
            evidence=tuple(ev.items()),
            summary=summary,
            open=open_,
            culprit=culprit,
            network_reason=str(d.get("network_reason", "")),
        )
