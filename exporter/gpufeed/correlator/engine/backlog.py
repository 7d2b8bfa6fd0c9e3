"""What the cluster's scheduler and the fabric's round trips add to a window's evidence.

- An `idle` GPU while eligible GPU jobs pend in the cluster's queue is not plain idle: the
  scheduler exporter (gpufeed scheduler) says whether the free GPUs are too scattered for
  any pending request (`fragmentation`) or a pending job would fit and still waits
  (`stall`); the window keeps cause `idle` (no job holds the GPU, nothing on the node is
  wrong) and carries the reason and the queue in its evidence and summary. Where the
  correlator reads no scheduler series (the live agent, trace files) nothing is added.
- A `network` window names the round-trip time and jitter of the job's TCP connections
  over the window beside their level before it, and the peer node with the most jitter,
  when they are evidence: at least twice their level before the window (and jitter at
  least 100 us), or without a level before it, jitter of a millisecond or more. A steady
  fabric says nothing about why this window is slow, and is left out.
"""

from __future__ import annotations

import statistics
from collections import Counter

from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.series import Series

BACKLOG_REASONS = ("fragmentation", "stall")
MIN_SHARE = 0.5  # of the window's scheduler readings that must show the reason
FABRIC_BEFORE_SECONDS = 600.0  # the "before" level: the 10 minutes before the window
FABRIC_RISE_X = 2.0  # RTT or jitter this many times its level before: evidence
FABRIC_MIN_JITTER_SECONDS = 100e-6  # below this, a rise is noise of an idle connection
FABRIC_JITTER_ALONE_SECONDS = 1e-3  # no level before: jitter this high is evidence


def _points(s: Series, start: float, end: float) -> list[float]:
    i = max(s.index_at(start), 0) if s.ts and s.ts[0] < start else 0
    return [v for t, v in zip(s.ts[i:], s.vs[i:], strict=True) if start <= t <= end]


def scheduler_backlog(node: NodeSeries, start: float, end: float) -> tuple[str, str] | None:
    """(reason, what the queue looked like) when free GPUs stayed idle while GPU jobs pended
    for most of [start, end]; None otherwise or without scheduler series."""
    if not node.cluster:
        return None
    best: tuple[float, str, float] | None = None  # share, reason, its last reading
    total = _readings(node, start, end)
    for reason in BACKLOG_REASONS:
        s = node.cluster.get(f"backlog:{reason}")
        if s is None or not total:
            continue
        on = [t for t, v in zip(s.ts, s.vs, strict=True) if start <= t <= end and v > 0]
        share = len(on) / total
        if on and share >= MIN_SHARE and (best is None or share > best[0]):
            best = (share, reason, on[-1])
    if best is None:
        return None
    return best[1], _queue_words(node, best[2])


def _readings(node: NodeSeries, start: float, end: float) -> int:
    """How many scheduler readings the window holds (the `up`-like free-GPU series)."""
    free = node.cluster.get("free")
    return len(_points(free, start, end)) if free is not None else 0


def _last(node: NodeSeries, key: str, end: float) -> float | None:
    s = node.cluster.get(key)
    return s.value_at(end, float("inf")) if s is not None else None


def _queue_words(node: NodeSeries, at: float) -> str:
    """The queue and the free GPUs at the scheduler's reading `at`."""
    by_reason: Counter[str] = Counter()
    for key, s in node.cluster.items():
        if key.startswith("pending:"):
            v = s.value_at(at, float("inf"))
            if v:
                by_reason[key.rsplit(":", 1)[1]] += int(v)
    jobs = sum(by_reason.values())
    reasons = ", ".join(f"{n} {r}" for r, n in by_reason.most_common(3))
    free, most = _last(node, "free", at), _last(node, "node_free_max", at)
    if jobs == 1:
        words = f"1 GPU job pends ({reasons})"
    else:
        words = f"{jobs} GPU jobs pend ({reasons})" if jobs else "GPU jobs pend"
    if free is not None:
        words += f" while {free:.0f} GPUs are free"
        if most is not None:
            words += f", at most {most:.0f} on one node"
    return words


def fabric_latency(node: NodeSeries, start: float, end: float) -> str:
    """ "RTT 37.1 ms, jitter 5.8 ms (before: 0.1 ms, 0.0 ms); most jitter to 10.0.0.2" over
    the window, from the job's TCP connections; "" without fabric series in the window."""
    cols = node.fabric.get("")
    if not cols or "rtt" not in cols or "jitter" not in cols:
        return ""
    rtt, jit = _points(cols["rtt"], start, end), _points(cols["jitter"], start, end)
    if not rtt or not jit:
        return ""
    r, j = statistics.fmean(rtt), statistics.fmean(jit)
    words = f"RTT {_ms(r)}, jitter {_ms(j)}"
    before = start - FABRIC_BEFORE_SECONDS
    rtt0, jit0 = _points(cols["rtt"], before, start), _points(cols["jitter"], before, start)
    if rtt0 and jit0:
        r0, j0 = statistics.median(rtt0), statistics.median(jit0)
        rose = r >= FABRIC_RISE_X * r0 or j >= FABRIC_RISE_X * j0
        if not rose or j < FABRIC_MIN_JITTER_SECONDS:
            return ""
        words += f" (before: {_ms(r0)}, {_ms(j0)})"
    elif j < FABRIC_JITTER_ALONE_SECONDS:
        return ""
    peers = [
        (statistics.fmean(p), peer)
        for peer, c in node.fabric.items()
        if peer and "jitter" in c and (p := _points(c["jitter"], start, end))
    ]
    if len(peers) > 1:
        words += f"; most jitter to {max(peers)[1]}"
    return words


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"
