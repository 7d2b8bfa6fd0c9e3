"""The verdicts of the real-GPU truth check, from what bench/gpu_smoke.py recorded.

Pure: time series in, PASS/FAIL/SKIP lines out, so the judgement itself is tested on the CPU
(tests/test_gpu_truth.py), including that a x100 scale bug or a swapped PCIe direction FAILs.

Three witnesses are compared: the agent's /metrics (`AgentPoint`), `nvidia-smi
--query-gpu ... -lms 500` (`SmiPoint`) and a raw NVML reader that shares no code with the
agent (`RawPoint`, bench/gpu_raw_reader.py). Each phase proves one thing (see `PHASES`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

GIB = 2**30
MIB = 2**20

# What each phase is for, printed with the verdicts.
PHASES = {
    "idle": "nothing runs: utilization ~0 in the agent and in nvidia-smi",
    "matmul": "dense bf16 matmuls: utilization and SM activity ~1; power, SM clock and the "
    "energy counter agree with nvidia-smi",
    "spin": "one-thread kernels back to back: utilization ~1, SM activity <= 0.1",
    "h2d": "pinned host->device copies of counted bytes: PCIe receive counter",
    "d2h": "pinned device->host copies of counted bytes: PCIe transmit counter",
    "alloc": "a 32 GiB allocation: memory used rises by 32 GiB; used and reserved vs nvidia-smi",
}


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start_seconds: float
    end_seconds: float
    bytes_moved: float = 0.0  # copies: bytes counted by the load itself
    allocated_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class AgentPoint:
    """One scrape of the agent, the load GPU's values by short name (see gpu_smoke.FAMILIES)."""

    t_seconds: float
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class SmiPoint:
    """One line of nvidia-smi: utilization (0..1), power_watts, sm_clock_hertz, memory bytes."""

    t_seconds: float
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class RawPoint:
    """One reading of the raw NVML reader: kind "fields" (PCIe raw counters, fast) or
    "state" (everything else, slower)."""

    t_seconds: float
    kind: str
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class Line:
    verdict: str  # PASS, FAIL, SKIP, INFO
    name: str
    detail: str

    def __str__(self) -> str:
        return f"{self.verdict:4} {self.name}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Limits:
    idle_utilization_max: float = 0.05
    busy_utilization_min: float = 0.95
    matmul_sm_active_min: float = 0.8
    spin_utilization_min: float = 0.9
    spin_sm_active_max: float = 0.1
    power_relative: float = 0.05
    clock_relative: float = 0.05
    energy_relative: float = 0.10
    # PCIe counters (fields 197/198 and GPM alike) count link bytes with the TLP headers, not
    # payload: measured on an H200 (Gen5 x16) at 1.07-1.09x the bytes copied. So the counter
    # must be at least the bytes copied and at most this much above them ...
    pcie_overhead_max: float = 0.12
    # ... and the agent must agree with the raw NVML field read every 20 ms within this.
    pcie_vs_nvml_relative: float = 0.02
    pcie_wrong_direction_max: float = 0.10  # the other direction, as a fraction of the bytes
    memory_relative: float = 0.01
    memory_vs_smi_bytes: float = 64 * MIB
    settle_seconds: float = 3.0


@dataclass(slots=True)
class Recording:
    phases: list[Phase]
    agent: list[AgentPoint]
    smi: list[SmiPoint]
    raw: list[RawPoint]
    facts: dict[str, object] = field(default_factory=dict)


def evaluate(rec: Recording, limits: Limits | None = None) -> list[Line]:
    lim = limits or Limits()
    out: list[Line] = []
    by_name = {p.name: p for p in rec.phases}
    for name in PHASES:
        phase = by_name.get(name)
        if phase is None:
            out.append(Line("SKIP", name, "phase did not run"))
            continue
        judge = _JUDGES[name]
        out.extend(judge(rec, phase, lim))
    return out


# -- helpers --------------------------------------------------------------------------------


def _settled(
    points: Sequence[AgentPoint | SmiPoint], phase: Phase, settle: float
) -> list[AgentPoint | SmiPoint]:
    return [p for p in points if phase.start_seconds + settle <= p.t_seconds < phase.end_seconds]


def _mean(points: Sequence[AgentPoint | SmiPoint], key: str) -> float | None:
    vals = [p.values[key] for p in points if key in p.values]
    return statistics.fmean(vals) if vals else None


def _fmt(v: float | None, unit: str = "", digits: int = 3) -> str:
    if v is None:
        return "absent"
    return f"{v:.{digits}f}{unit}"


def _relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else math.inf


def _at_or_before(points: Sequence[AgentPoint], t: float, key: str) -> float | None:
    """The agent's last value of `key` scraped at or before t."""
    best: float | None = None
    for p in points:
        if p.t_seconds > t:
            break
        if key in p.values:
            best = p.values[key]
    return best


def _at_or_after(points: Sequence[AgentPoint], t: float, key: str) -> float | None:
    for p in points:
        if p.t_seconds >= t and key in p.values:
            return p.values[key]
    return None


def _check(name: str, ok: bool | None, detail: str) -> Line:
    if ok is None:
        return Line("SKIP", name, detail)
    return Line("PASS" if ok else "FAIL", name, detail)


# -- the phases ------------------------------------------------------------------------------


def _idle(rec: Recording, ph: Phase, lim: Limits) -> list[Line]:
    agent = _settled(rec.agent, ph, lim.settle_seconds)
    smi = _settled(rec.smi, ph, lim.settle_seconds)
    ua, us = _mean(agent, "utilization"), _mean(smi, "utilization")
    sm = _mean(agent, "sm_active")
    ok = None if ua is None or us is None else max(ua, us) <= lim.idle_utilization_max
    return [
        _check(
            "idle.utilization",
            ok,
            f"agent {_fmt(ua)}, nvidia-smi {_fmt(us)} (want both <= {lim.idle_utilization_max})",
        ),
        _check(
            "idle.sm_active",
            None if sm is None else sm <= lim.idle_utilization_max,
            f"agent {_fmt(sm)} (want <= {lim.idle_utilization_max})",
        ),
    ]


def _matmul(rec: Recording, ph: Phase, lim: Limits) -> list[Line]:
    agent = _settled(rec.agent, ph, lim.settle_seconds)
    smi = _settled(rec.smi, ph, lim.settle_seconds)
    out: list[Line] = []
    ua, us = _mean(agent, "utilization"), _mean(smi, "utilization")
    out.append(
        _check(
            "matmul.utilization",
            None if ua is None or us is None else min(ua, us) >= lim.busy_utilization_min,
            f"agent {_fmt(ua)}, nvidia-smi {_fmt(us)} (want both >= {lim.busy_utilization_min})",
        )
    )
    sm = _mean(agent, "sm_active")
    out.append(
        _check(
            "matmul.sm_active",
            None if sm is None else sm >= lim.matmul_sm_active_min,
            f"agent {_fmt(sm)} (want >= {lim.matmul_sm_active_min})",
        )
    )
    for key, name, unit, scale, rel in (
        ("power_watts", "matmul.power_vs_nvidia_smi", " W", 1.0, lim.power_relative),
        ("sm_clock_hertz", "matmul.sm_clock_vs_nvidia_smi", " MHz", 1e-6, lim.clock_relative),
    ):
        a, s = _mean(agent, key), _mean(smi, key)
        if a is None or s is None:
            out.append(Line("SKIP", name, f"agent {_fmt(a)}, nvidia-smi {_fmt(s)}"))
            continue
        r = _relative(a, s)
        out.append(
            _check(
                name,
                r <= rel,
                f"agent {a * scale:.1f}{unit}, nvidia-smi {s * scale:.1f}{unit}, "
                f"off by {r:.1%} (want <= {rel:.0%})",
            )
        )
    out.append(_energy(agent, lim))
    busy = _counter_rate(agent, "busy_seconds")
    out.append(
        _check(
            "matmul.busy_seconds_rate",
            None if busy is None or ua is None else abs(busy - ua) <= 0.05,
            f"rate {_fmt(busy)} vs mean utilization {_fmt(ua)} (want within 0.05)",
        )
    )
    for key in ("tensor_active", "sm_occupancy", "dram_bandwidth", "memory_time_fraction"):
        out.append(Line("INFO", f"matmul.{key}", f"agent mean {_fmt(_mean(agent, key))}"))
    return out


def _counter_rate(points: Sequence[AgentPoint | SmiPoint], key: str) -> float | None:
    """The counter's increase per second between the first and the last time it changed."""
    changes: list[tuple[float, float]] = []
    last: float | None = None
    for p in points:
        v = p.values.get(key)
        if v is not None and v != last:
            changes.append((p.t_seconds, v))
            last = v
    if len(changes) < 3:
        return None
    (t0, v0), (t1, v1) = changes[0], changes[-1]
    return (v1 - v0) / (t1 - t0) if t1 > t0 else None


def _energy(agent: Sequence[AgentPoint | SmiPoint], lim: Limits) -> Line:
    rate = _counter_rate(agent, "energy_joules")
    power = _mean(agent, "power_watts")
    if rate is None or power is None:
        return Line("SKIP", "matmul.energy_rate_vs_power", f"energy rate {_fmt(rate)}")
    r = _relative(rate, power)
    return _check(
        "matmul.energy_rate_vs_power",
        r <= lim.energy_relative,
        f"energy counter rate {rate:.1f} W, mean power {power:.1f} W, off by {r:.1%} "
        f"(want <= {lim.energy_relative:.0%})",
    )


def _spin(rec: Recording, ph: Phase, lim: Limits) -> list[Line]:
    agent = _settled(rec.agent, ph, lim.settle_seconds)
    smi = _settled(rec.smi, ph, lim.settle_seconds)
    ua, us = _mean(agent, "utilization"), _mean(smi, "utilization")
    sm = _mean(agent, "sm_active")
    return [
        _check(
            "spin.utilization",
            None if ua is None or us is None else min(ua, us) >= lim.spin_utilization_min,
            f"agent {_fmt(ua)}, nvidia-smi {_fmt(us)} (want both >= {lim.spin_utilization_min})",
        ),
        _check(
            "spin.sm_active",
            None if sm is None else sm <= lim.spin_sm_active_max,
            f"agent {_fmt(sm)} (want <= {lim.spin_sm_active_max}: GPM measures SMs, "
            "it does not echo utilization)",
        ),
    ]


def _pcie(direction: str) -> Callable[[Recording, Phase, Limits], list[Line]]:
    key, other = (
        ("pcie_receive_bytes", "pcie_transmit_bytes")
        if direction == "h2d"
        else ("pcie_transmit_bytes", "pcie_receive_bytes")
    )
    raw_key = "rx" if direction == "h2d" else "tx"

    def judge(rec: Recording, ph: Phase, lim: Limits) -> list[Line]:
        out: list[Line] = []
        moved = ph.bytes_moved
        # counters from before the phase to after it settled (the loader idles around it)
        before, after = ph.start_seconds - 0.05, ph.end_seconds + lim.settle_seconds
        a0, a1 = _at_or_before(rec.agent, before, key), _at_or_after(rec.agent, after, key)
        o0, o1 = _at_or_before(rec.agent, before, other), _at_or_after(rec.agent, after, other)
        fields = _unwrapped_field(rec.raw, raw_key, before, after)
        if a0 is None or a1 is None or not moved:
            out.append(Line("SKIP", f"{direction}.agent_vs_copied", "agent PCIe counter absent"))
        else:
            got = a1 - a0
            ratio = got / moved
            out.append(
                _check(
                    f"{direction}.agent_vs_copied",
                    1.0 <= ratio <= 1.0 + lim.pcie_overhead_max,
                    f"copied {moved / GIB:.2f} GiB, agent {key} +{got / GIB:.2f} GiB = "
                    f"{ratio:.3f}x (want 1.000..{1 + lim.pcie_overhead_max:.2f}x: payload plus "
                    "PCIe headers)",
                )
            )
            if o0 is not None and o1 is not None:
                wrong = o1 - o0
                out.append(
                    _check(
                        f"{direction}.direction",
                        wrong <= lim.pcie_wrong_direction_max * moved,
                        f"other direction +{wrong / GIB:.2f} GiB = {wrong / moved:.3f}x copied "
                        f"(want <= {lim.pcie_wrong_direction_max:.2f}x: read requests only)",
                    )
                )
            if fields is not None:
                r = _relative(got, fields[0])
                out.append(
                    _check(
                        f"{direction}.agent_vs_nvml_field",
                        r <= lim.pcie_vs_nvml_relative,
                        f"agent +{got / GIB:.2f} GiB, raw field unwrapped +{fields[0] / GIB:.2f} "
                        f"GiB, off by {r:.1%} (want <= {lim.pcie_vs_nvml_relative:.0%})",
                    )
                )
        if fields is None:
            out.append(Line("SKIP", f"{direction}.nvml_field_bytes", "fields 197/198 absent"))
        else:
            got, width = fields
            out.append(
                Line(
                    "INFO",
                    f"{direction}.nvml_field_bytes",
                    f"raw field {'198' if raw_key == 'rx' else '197'} +{got / GIB:.2f} GiB "
                    f"({got / moved:.3f}x copied) read every ~20 ms, unwrapped at {width} bits",
                )
            )
        gpm = _gpm_bytes(rec.raw, f"gpm_pcie_{raw_key}_bytes_per_second", before, after)
        out.append(
            Line(
                "INFO",
                f"{direction}.gpm_bytes",
                "raw GPM PCIe rate integrated: "
                + ("absent" if gpm is None else f"{gpm / GIB:.2f} GiB ({gpm / moved:.3f}x copied)"),
            )
        )
        if direction == "h2d":
            out.append(_width(rec.raw))
        return out

    return judge


def _unwrapped_field(
    raw: Sequence[RawPoint], key: str, t0: float, t1: float
) -> tuple[float, int] | None:
    series = [p for p in raw if p.kind == "fields" and key in p.values]
    before = [p for p in series if p.t_seconds <= t0][-1:]  # the last reading before the phase
    vals = [p.values[key] for p in before + [p for p in series if t0 < p.t_seconds <= t1]]
    if len(vals) < 2:
        return None
    wide = any(v >= 2**32 for p in raw if p.kind == "fields" for v in [p.values.get(key, 0.0)])
    modulus = 2**64 if wide else 2**32
    total = sum((b - a) % modulus for a, b in itertools.pairwise(vals))
    return total, 64 if wide else 32


def _width(raw: Sequence[RawPoint]) -> Line:
    seen = [(p.values.get("tx"), p.values.get("rx")) for p in raw if p.kind == "fields"]
    values = [v for pair in seen for v in pair if v is not None and not math.isnan(v)]
    if not values:
        return Line("SKIP", "pcie.field_width", "fields 197/198 absent on this driver")
    wraps = 0
    for key in ("tx", "rx"):
        series = [p.values[key] for p in raw if p.kind == "fields" and key in p.values]
        wraps += sum(1 for a, b in itertools.pairwise(series) if b < a)
    biggest = max(values)
    if biggest >= 2**32:
        verdict = f"wider than 32 bits: largest raw value {biggest:.4g} > 2^32"
    elif wraps:
        verdict = f"32 bits: {wraps} wrap(s) seen, largest raw value {biggest:.4g}"
    else:
        verdict = f"unproven: no value above 2^32 and no wrap seen (largest {biggest:.4g})"
    return Line("INFO", "pcie.field_width", verdict)


def _gpm_bytes(raw: Sequence[RawPoint], key: str, t0: float, t1: float) -> float | None:
    pts = [p for p in raw if p.kind == "state" and key in p.values]
    total, got = 0.0, False
    for a, b in itertools.pairwise(pts):
        if t0 <= a.t_seconds and b.t_seconds <= t1:
            total += b.values[key] * (b.t_seconds - a.t_seconds)
            got = True
    return total if got else None


def _alloc(rec: Recording, ph: Phase, lim: Limits) -> list[Line]:
    out: list[Line] = []
    size = ph.allocated_bytes
    before = _at_or_before(rec.agent, ph.start_seconds - 0.05, "memory_used_bytes")
    during = [
        p
        for p in rec.agent
        if ph.start_seconds + lim.settle_seconds <= p.t_seconds < ph.end_seconds
    ]
    held = _mean(during, "memory_used_bytes")
    if before is None or held is None:
        out.append(Line("SKIP", "alloc.used_rise", "agent memory used absent"))
    else:
        rise = held - before
        out.append(
            _check(
                "alloc.used_rise",
                _relative(rise, size) <= lim.memory_relative,
                f"allocated {size / GIB:.2f} GiB, agent used rose {rise / GIB:.3f} GiB "
                f"(want within {lim.memory_relative:.0%})",
            )
        )
    smi = [
        p for p in rec.smi if ph.start_seconds + lim.settle_seconds <= p.t_seconds < ph.end_seconds
    ]
    for key, name in (
        ("memory_used_bytes", "alloc.used_vs_nvidia_smi"),
        ("memory_reserved_bytes", "alloc.reserved_vs_nvidia_smi"),
    ):
        a, s = _mean(during, key), _mean(smi, key)
        if a is None or s is None:
            out.append(Line("SKIP", name, f"agent {_fmt(a)}, nvidia-smi {_fmt(s)}"))
            continue
        out.append(
            _check(
                name,
                abs(a - s) <= lim.memory_vs_smi_bytes,
                f"agent {a / MIB:.0f} MiB, nvidia-smi {s / MIB:.0f} MiB "
                f"(want within {lim.memory_vs_smi_bytes / MIB:.0f} MiB)",
            )
        )
    v1 = [
        p for p in rec.raw if p.kind == "state" and "used_v1" in p.values and "used_v2" in p.values
    ]
    if v1:
        p = v1[-1]
        gap = p.values["used_v1"] - p.values["used_v2"]
        res = p.values.get("reserved_v2")
        out.append(
            Line(
                "INFO",
                "memory.v1_minus_v2",
                f"v1 used - v2 used = {gap / MIB:.0f} MiB; v2 reserved = "
                f"{_fmt(None if res is None else res / MIB, ' MiB', 0)}",
            )
        )
    return out


_JUDGES: dict[str, Callable[[Recording, Phase, Limits], list[Line]]] = {
    "idle": _idle,
    "matmul": _matmul,
    "spin": _spin,
    "h2d": _pcie("h2d"),
    "d2h": _pcie("d2h"),
    "alloc": _alloc,
}


def exit_status(lines: Sequence[Line]) -> int:
    """1 if anything FAILed, else 0 (SKIPs are reported, not failures)."""
    return 1 if any(line.verdict == "FAIL" for line in lines) else 0
