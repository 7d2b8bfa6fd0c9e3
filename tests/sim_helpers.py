"""Helpers for the simulated-node tests: a strict trace checker and reading helpers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.model import Family

# The phases in which a job's ranks wait in collectives: on NCCL (a job's `collectives:
# spin`, the default) its GPUs read busy then, and only SM activity shows what they work.
SPINNING_PHASES = frozenset(("network", "straggler"))
# The least SM activity per unit of utilization a computing simulated GPU shows (the
# engine's 0.62-0.82): SM activity over it bounds the share a spinning GPU works.
SM_PER_BUSY = 0.62


def working_share(utilization: float, sm_active: float | None, phase: str) -> float:
    """The share a simulated GPU works: its utilization, or where its ranks wait in a
    spinning collective, what its SM activity allows at most."""
    if phase in SPINNING_PHASES and sm_active is not None:
        return min(utilization, sm_active / SM_PER_BUSY)
    return utilization


_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? '
    r"(\S+) (\d+(?:\.\d+)?)$"
)
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}


@dataclass
class TraceSummary:
    families: list[str] = field(default_factory=list)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    samples: int = 0


def check_trace(path: Path) -> TraceSummary:
    """Checks what OpenMetrics and `promtool create-blocks-from openmetrics` need, strictly.

    Each family once, contiguous, `# TYPE` before its samples; sample names belong to the
    family; every sample has a timestamp; a series' timestamps strictly increase; counters
    never decrease; the file ends with `# EOF` and nothing after it.
    """
    out = TraceSummary()
    fam = ""
    ftype = ""
    seen: set[str] = set()
    last_ts: dict[str, float] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and lines[-2] == "# EOF", "trace must end with '# EOF\\n'"
    for n, line in enumerate(lines[:-2], start=1):
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, ftype = line.split(" ")
            assert name not in seen, f"line {n}: family {name} appears twice"
            seen.add(name)
            fam = name
            out.families.append(name)
            continue
        assert not line.startswith("#"), f"line {n}: unexpected comment {line!r}"
        m = _SAMPLE.match(line)
        assert m, f"line {n}: malformed sample {line!r}"
        name, labels, value, ts = m.group(1), m.group(2) or "", float(m.group(3)), float(m.group(4))
        assert fam, f"line {n}: sample before any # TYPE"
        assert any(name == fam + s for s in _SUFFIXES[ftype]), f"line {n}: {name} not in {fam}"
        key = name + labels
        assert ts > last_ts.get(key, float("-inf")), f"line {n}: timestamp not increasing"
        last_ts[key] = ts
        hist = out.series.setdefault(key, [])
        if ftype in ("counter", "histogram") and hist:
            assert value >= hist[-1][1] - 1e-6 * abs(hist[-1][1]), f"line {n}: counter decreased"
        hist.append((ts, value))
        out.samples += 1
    return out


def sample_value(families: Iterable[Family], name: str, **labels: str) -> float | None:
    """The value of the one sample named `name` whose labels include `labels`."""
    found = [
        s.value
        for f in families
        for s in f.samples
        if s.name == name and all(s.label(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, f"{name} {labels}: {len(found)} samples match"
    return found[0] if found else None


def rate(
    read: Callable[[float], list[Family]], t: float, name: str, window: float = 10.0,
    **labels: str,
) -> float:  # fmt: skip
    """Per-second increase of a counter between t and t + window."""
    a = sample_value(read(t), name, **labels)
    b = sample_value(read(t + window), name, **labels)
    assert a is not None and b is not None, f"{name} {labels} absent"
    return (b - a) / window
