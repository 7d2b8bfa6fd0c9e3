"""Shared helpers for the correlator tests: the bench's scenario generator, and a tiny
trace writer for hand-made series."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from bench import correlator_scenarios as scenarios
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.trace.reader import read_trace

__all__ = ["T0", "analyze_text", "scenarios", "trace_text"]

T0 = 1_750_000_000.0

# A sample generator: (t) -> list of (series text, value); None drops the sample.
Gen = Callable[[float], Iterable[tuple[str, float | None]]]


def trace_text(gen: Gen, seconds: float, interval: float = 5.0, skip: Iterable[float] = ()) -> str:
    skipped = set(skip)
    lines = []
    t = T0
    while t <= T0 + seconds:
        if round(t - T0) not in skipped:
            for series, v in gen(t):
                if v is not None:
                    lines.append(f"{series} {v:.9g} {t:.3f}")
        t += interval
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def analyze_text(
    text: str, tmp_path: object, params: WindowParams | None = None, jobs: int = 1
) -> list[Window]:
    path = os.path.join(str(tmp_path), "trace.om")
    with open(path, "w") as f:
        f.write(text)
    tr = read_trace(path, jobs=jobs)
    return analyze_nodes(tr.nodes.values(), params or WindowParams(), jobs=jobs)


def snapshots_of(text: str) -> list[object]:
    """The trace's samples as the agent's snapshots (one per timestamp, no instance label)."""
    from gpufeed.trace.replay import snapshots_from_trace

    return list(snapshots_from_trace(text))
