"""A recorded trace replayed as the agent's snapshots, one per timestamp.

So that the live correlator can be fed exactly what `gpufeed analyze` reads (tests, the
live-cost benchmark): both paths then see the same data and must find the same windows.
The `instance` label is dropped, as the agent's own /metrics has none.
"""

from __future__ import annotations

from gpufeed.correlator.feeds.labels import parse_series
from gpufeed.model import Family, LabelPairs, Sample, label_pairs
from gpufeed.snapshot import Snapshot


def snapshots_from_trace(text: str) -> list[Snapshot]:
    by_t: dict[float, dict[str, list[Sample]]] = {}
    cache: dict[str, tuple[str, LabelPairs]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, value, ts = line.rsplit(" ", 2)
        got = cache.get(head)
        if got is None:
            name, labels = parse_series(head)
            labels.pop("instance", None)
            got = cache[head] = (name, label_pairs(labels))
        by_t.setdefault(float(ts), {}).setdefault(got[0], []).append(
            Sample(got[0], got[1], float(value))
        )
    return [
        Snapshot(
            t,
            tuple(
                Family(n, "counter" if n.endswith("_total") else "gauge", "", tuple(s))
                for n, s in by_t[t].items()
            ),
        )
        for t in sorted(by_t)
    ]
