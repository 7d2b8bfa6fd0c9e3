"""A tagged underutilization window, and its JSON form (the contract's fields exactly)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufeed.correlator.engine.causes import Cause


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

    @property
    def duration_seconds(self) -> float:
        return self.end_seconds - self.start_seconds

    def to_json(self) -> dict[str, Any]:
        ev: dict[str, Any] = dict(self.evidence)
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
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any], open_: bool = False) -> Window:
        ev = dict(d.get("evidence") or {})
        summary = str(ev.pop("summary", ""))
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
        )
