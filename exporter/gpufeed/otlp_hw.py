"""GPU families under the OpenTelemetry hardware semantic conventions, for the OTLP push.

The conventions (semconv "Hardware: GPU" and "common" hw.* metrics, status Development) have
names for some of what the GPU collector exports; over OTLP those are sent under the
convention's name, instrument type, unit and attributes, and the gpufeed family is not sent
too. What the conventions lack (SM activity, NVLink, clocks, temperature, clock events, GPM,
busy seconds, MIG, reserved memory) keeps its gpufeed name. Prometheus' /metrics is not
affected: it always shows the contract's names.

| gpufeed family | semconv metric | instrument, unit | attributes added |
|---|---|---|---|
| gpufeed_gpu_utilization_ratio | hw.gpu.utilization | Gauge, 1 | hw.gpu.task=general |
| gpufeed_gpu_memory_used_bytes | hw.gpu.memory.usage | UpDownCounter, By | |
| gpufeed_gpu_memory_total_bytes | hw.gpu.memory.limit | UpDownCounter, By | |
| used / total | hw.gpu.memory.utilization | Gauge, 1 | |
| gpufeed_gpu_pcie_{receive,transmit}_bytes_total | hw.gpu.io | Counter, By | network.io.direction |
| gpufeed_gpu_energy_joules_total | hw.energy | Counter, J | |
| gpufeed_gpu_power_watts | hw.power | Gauge, W | |
| gpufeed_gpu_xid_errors_total | hw.errors | Counter, {error} | error.type=xid_<code> |
| gpufeed_gpu_up | hw.status | UpDownCounter, 1 | hw.state=ok / failed |

Every hw.* point carries hw.id (the GPU UUID), hw.type=gpu, and where known hw.name,
hw.vendor, hw.driver_version (from gpufeed_gpu_info), plus gpufeed's `gpu` index and
`gpufeed.backend` (nvml or simulated: a simulated GPU is labelled so here too).
`gpufeed_gpu_memory_bandwidth_utilization_ratio` is NOT hw.gpu.memory.utilization: the
convention means the fraction of memory used, NVML's figure is a time fraction.

Pure: families in, `HwMetric`s out; gpufeed.otlp turns them into OTLP.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gpufeed.model import Family, Sample

Instrument = Literal["gauge", "counter", "updowncounter"]


@dataclass(frozen=True, slots=True)
class HwPoint:
    attributes: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True, slots=True)
class HwMetric:
    name: str
    instrument: Instrument
    unit: str
    description: str
    points: tuple[HwPoint, ...]


# gpufeed family -> (semconv name, instrument, unit, description, extra attributes)
_DIRECT: dict[str, tuple[str, Instrument, str, str, tuple[tuple[str, str], ...]]] = {
    "gpufeed_gpu_utilization_ratio": (
        "hw.gpu.utilization",
        "gauge",
        "1",
        "Fraction of time spent in a specific task.",
        (("hw.gpu.task", "general"),),
    ),
    "gpufeed_gpu_memory_used_bytes": (
        "hw.gpu.memory.usage",
        "updowncounter",
        "By",
        "GPU memory used.",
        (),
    ),
    "gpufeed_gpu_memory_total_bytes": (
        "hw.gpu.memory.limit",
        "updowncounter",
        "By",
        "Size of the GPU memory.",
        (),
    ),
    "gpufeed_gpu_pcie_receive_bytes_total": (
        "hw.gpu.io",
        "counter",
        "By",
        "Received and transmitted bytes by the GPU.",
        (("network.io.direction", "receive"),),
    ),
    "gpufeed_gpu_pcie_transmit_bytes_total": (
        "hw.gpu.io",
        "counter",
        "By",
        "Received and transmitted bytes by the GPU.",
        (("network.io.direction", "transmit"),),
    ),
    "gpufeed_gpu_energy_joules_total": (
        "hw.energy",
        "counter",
        "J",
        "Energy consumed by the component.",
        (),
    ),
    "gpufeed_gpu_power_watts": (
        "hw.power",
        "gauge",
        "W",
        "Instantaneous power consumed by the component.",
        (),
    ),
}
_INFO = "gpufeed_gpu_info"
_UP = "gpufeed_gpu_up"
_XID = "gpufeed_gpu_xid_errors_total"
_USED, _TOTAL = "gpufeed_gpu_memory_used_bytes", "gpufeed_gpu_memory_total_bytes"

# Every gpufeed family that is sent under a semconv name instead.
REPLACED: frozenset[str] = frozenset({*_DIRECT, _UP, _XID})


def hw_metrics(families: Iterable[Family]) -> list[HwMetric]:
    """The semconv metrics for the GPU families among `families` (others are ignored)."""
    by_name = {f.name: f for f in families}
    ident = _identities(by_name.get(_INFO))
    collected: dict[str, tuple[Instrument, str, str, list[HwPoint]]] = {}

    def add(
        name: str, instrument: Instrument, unit: str, desc: str, s: Sample, value: float,
        extra: Sequence[tuple[str, str]] = (),
    ) -> None:  # fmt: skip
        uuid = s.label("uuid")
        attrs = dict(ident.get(uuid, ()))
        # hw.id is required: a GPU lost before its UUID was read is named by its index
        hw_id = uuid or f"gpu-index-{s.label('gpu')}"
        attrs.update({"hw.id": hw_id, "hw.type": "gpu", "gpu": s.label("gpu")})
        attrs.update(extra)
        entry = collected.setdefault(name, (instrument, unit, desc, []))
        entry[3].append(HwPoint(tuple(sorted(attrs.items())), value))

    for family_name, (name, instrument, unit, desc, extra) in _DIRECT.items():
        fam = by_name.get(family_name)
        for s in fam.samples if fam is not None else ():
            add(name, instrument, unit, desc, s, s.value, extra)
    used = {s.label("uuid"): s for s in by_name[_USED].samples} if _USED in by_name else {}
    total = {s.label("uuid"): s.value for s in by_name[_TOTAL].samples} if _TOTAL in by_name else {}
    for uuid, s in used.items():
        if total.get(uuid):
            add("hw.gpu.memory.utilization", "gauge", "1", "Fraction of GPU memory used.", s,
                s.value / total[uuid])  # fmt: skip
    for s in by_name[_UP].samples if _UP in by_name else ():
        desc = "Operational status: 1 (true) or 0 (false) for each of the possible states."
        add("hw.status", "updowncounter", "1", desc, s, s.value, (("hw.state", "ok"),))
        add("hw.status", "updowncounter", "1", desc, s, 1.0 - s.value, (("hw.state", "failed"),))
    for s in by_name[_XID].samples if _XID in by_name else ():
        add("hw.errors", "counter", "{error}", "Number of errors encountered by the component.",
            s, s.value, (("error.type", f"xid_{s.label('xid')}"),))  # fmt: skip
    return [
        HwMetric(name, instrument, unit, desc, tuple(points))
        for name, (instrument, unit, desc, points) in collected.items()
    ]


def _identities(info: Family | None) -> dict[str, tuple[tuple[str, str], ...]]:
    """uuid -> the recommended hw.* attributes gpufeed_gpu_info knows."""
    out: dict[str, tuple[tuple[str, str], ...]] = {}
    for s in info.samples if info is not None else ():
        backend = s.label("backend")
        attrs = {
            "hw.name": s.label("name"),
            "hw.vendor": "NVIDIA",  # both backends are NVIDIA (NVML, or a simulated NVML node)
            "hw.driver_version": s.label("driver_version"),
            "gpufeed.backend": backend,
        }
        out[s.label("uuid")] = tuple((k, v) for k, v in attrs.items() if v)
    return out
