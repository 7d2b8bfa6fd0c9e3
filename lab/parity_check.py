"""Whether the correlator's feeds gave the same windows for one run (issue 23).

Every feed is compared with the live agent's windows, window by window in time order per
(gpu, job): the same number of windows (a window split in one feed and not in another
fails), the same cause, and each edge within the feeds' sample interval of the other (the
larger of the two: 1 s for the agent and its trace, one scrape interval for a TSDB's).
`agreement` gives the figures: per feed, the share of the time both it and the live agent
hold a window in which they name the same cause, and the window counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FEEDS = ("live", "file", "promql", "fleet")
REFERENCE = "live"

Windows = Sequence[Mapping[str, Any]]


def _keyed(ws: Windows) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for w in sorted(ws, key=lambda w: float(w["start"])):
        out.setdefault((str(w.get("gpu", "")), str(w.get("job_id", ""))), []).append(w)
    return out


def pair_differences(want: Windows, got: Windows, tol_seconds: float) -> list[str]:
    """What differs between two feeds' windows (empty: they agree)."""
    a, b = _keyed(want), _keyed(got)
    out: list[str] = []
    for key in sorted(set(a) | set(b)):
        xs, ys = a.get(key, []), b.get(key, [])
        if len(xs) != len(ys):
            out.append(f"{key}: {len(xs)} windows against {len(ys)}: {_show(xs)} / {_show(ys)}")
            continue
        for x, y in zip(xs, ys, strict=True):
            if x["cause"] != y["cause"]:
                out.append(f"{key}: cause {x['cause']} against {y['cause']}: {_show([x, y])}")
            for edge in ("start", "end"):
                d = abs(float(x[edge]) - float(y[edge]))
                if d > tol_seconds + 1e-6:
                    out.append(
                        f"{key}: {edge} {d:.1f} s apart (> {tol_seconds:g}): {_show([x, y])}"
                    )
    return out


def differences(feeds: Mapping[str, Windows], tol_seconds: Mapping[str, float]) -> list[str]:
    """Every feed against the live agent's windows; each line names the feed."""
    ref = feeds[REFERENCE]
    out: list[str] = []
    for f in FEEDS:
        if f == REFERENCE or f not in feeds:
            continue
        tol = max(tol_seconds.get(f, 1.0), tol_seconds.get(REFERENCE, 1.0))
        out += [f"{f}: {d}" for d in pair_differences(ref, feeds[f], tol)]
    return out


def _same_cause_seconds(a: Windows, b: Windows) -> tuple[float, float]:
    """(seconds both hold a window, seconds of that with the same cause), per (gpu, job)."""
    both = same = 0.0
    for x in a:
        for y in b:
            if (x.get("gpu", ""), x.get("job_id", "")) != (y.get("gpu", ""), y.get("job_id", "")):
                continue
            lo = max(float(x["start"]), float(y["start"]))
            hi = min(float(x["end"]), float(y["end"]))
            if hi > lo:
                both += hi - lo
                same += (hi - lo) if x["cause"] == y["cause"] else 0.0
    return both, same


def agreement(feeds: Mapping[str, Windows]) -> dict[str, dict[str, Any]]:
    """Per feed: its window count, and (against the live agent's) the share of shared
    window time with the same cause (None when they share no window time)."""
    ref = feeds[REFERENCE]
    out: dict[str, dict[str, Any]] = {}
    for f in FEEDS:
        if f not in feeds:
            continue
        both, same = _same_cause_seconds(ref, feeds[f])
        out[f] = {
            "windows": len(feeds[f]),
            "causes": [w["cause"] for w in sorted(feeds[f], key=lambda w: float(w["start"]))],
            "same_cause_share": round(same / both, 4) if both > 0 else None,
        }
    return out


def _show(ws: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{w['cause']} {float(w['start']):.1f}-{float(w['end']):.1f}" for w in ws)
