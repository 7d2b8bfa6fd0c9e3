"""How busy each node's busiest link was over a stall, against what it can carry.

A collective over one slow link holds every rank of the job inside it for as long as the
transfer takes: the ranks at both ends of that link wait alike, so "who arrives last"
cannot tell its node from the others. Its node's own saturation rule may not clear its
bound either: a collective moves its bytes in bursts with the ranks' compute between
them, so a token-bucket-shaped link never runs full (the fault lab's 8 Mbit/s tbf
carried 77-90% of its rate). Across the job's nodes the slow link still stands out: it
carries the same collective's bytes as every other node's link, at a far larger share of
what it can carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median

from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.view import Timing, link_capacity

BUSY_PART = 0.25  # of the stall: the share a link carried at least for this part of it


@dataclass(frozen=True, slots=True)
class LinkUse:
    port: str  # "eth0", or "mlx5_0/1"
    # the share of what it could carry that it carried, each interval against its own
    # capacity, at least during a quarter of the stall (its upper quartile)
    utilization_ratio: float


def busiest_link(node: NodeSeries, start: float, end: float) -> LinkUse | None:
    """The node's port that carried the largest share of its capacity over [start, end]
    (the busier direction, each interval against the capacity of its time: a shaped
    rate while the shaping lasts; the upper quartile over the intervals), or None where
    no port has bytes and a capacity."""
    best: LinkUse | None = None
    for (dev, port), f in node.network.items():
        ratio = _use(f, start, end)
        if ratio is not None and (best is None or ratio > best.utilization_ratio):
            best = LinkUse(f"{dev}/{port}" if port else dev, ratio)
    return best


def _use(f: Mapping[str, Series], start: float, end: float) -> float | None:
    series = [s for k in ("rx", "tx") if (s := f.get(k)) is not None and len(s) > 1]
    if not series:
        return None
    ref = series[0]
    i0, i1 = max(ref.index_at(start), 0), ref.index_at(end)
    if i1 - i0 < 1:
        return None
    tm = Timing(max(median(ref.ts[k + 1] - ref.ts[k] for k in range(i0, i1)), 0.05))
    shares: list[tuple[float, float]] = []  # (share of capacity, seconds) per interval
    for k in range(i0 + 1, i1 + 1):
        a, b = ref.ts[k - 1], ref.ts[k]
        if a < start - tm.interval_seconds or b - a > tm.gap_seconds:
            continue
        capacity, since = link_capacity(f, b, tm)
        if since is not None and a < since:
            continue  # the bytes of before the shaping took this rate, at another capacity
        moved = max((s.increase(a, b) or 0.0 for s in series), default=0.0)
        if capacity:
            shares.append((moved / (b - a) / capacity, b - a))
    return _upper_quartile(shares)


def _upper_quartile(shares: list[tuple[float, float]]) -> float | None:
    """The share the link carried at least during a quarter of the measured time: a
    stall's windows often run on past the fault (a loaded host's recovery), and over all
    of them a mean would dilute a link that was the bottleneck for the fault's part."""
    total = sum(dt for _, dt in shares)
    if total <= 0:
        return None
    ordered = sorted(shares, reverse=True)
    seen = 0.0
    for share, dt in ordered:
        seen += dt
        if seen >= BUSY_PART * total:
            return share
    return ordered[-1][0]
