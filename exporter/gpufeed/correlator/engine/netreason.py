"""A network window's sub-cause (`network_reason`) and the counters that decided it.

The `network` rules (rules.py) say *that* the network holds a GPU back; which of their
features carry the window says *why*. Each network feature belongs to one reason; a
reason's score is the noisy-OR of its rules' weighted strengths over the window's averaged
evidence, as the cause's own score is:

- `link_errors` wins as soon as it is clear (score >= 0.5): a link that flaps or corrupts
  packets also leaves its traffic stalled and slow, so congestion-like readings are its
  consequence, not a second explanation.
- Then `saturated`, when clear: a link that runs at its speed is the bottleneck itself;
  the transmit-wait a full link also shows (credits run out) is its consequence.
- Then `congestion`, when clear; otherwise the strongest local reason with any evidence.
- `peer` only when no local reason has any evidence: the node's own links are fine and the
  job waits for someone else. Where the ranks report their collective waits such a stall
  is the cause `straggler` (rules.py) and the job-level view names the culprit; `peer` is
  what is left for a network window without local evidence, and the benchmark counts a
  `straggler` window as `peer` (bench/network_accuracy.py).

The deciding counters are read from the node's series over the window itself (the fault
counters from a flap lookback before it), so the evidence names what moved, by the
kernel's counter names: "link_downed +3, symbol_error +1200 on mlx5_0/1".
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.node import CONGESTION_PREFIX, ERROR_PREFIX, NodeSeries
from gpufeed.correlator.engine.rules import RULES_BY_CAUSE
from gpufeed.correlator.engine.view import LINK_FLAP_LOOKBACK_SECONDS
from gpufeed.vocabulary import LINK_FLAP_COUNTERS, NetworkReason

R = NetworkReason
REASON_FEATURES: Final = MappingProxyType(
    {
        R.LINK_ERRORS: (
            F.NETWORK_LINK_FLAPS,
            F.NETWORK_LINK_DOWN,
            F.NETWORK_LINK_ERRORS_PER_SECOND,
        ),
        R.CONGESTION: (
            F.NETWORK_TRANSMIT_WAIT_X_BASELINE,
            F.NETWORK_CONGESTION_PACKETS_X_BASELINE,
        ),
        R.SATURATED: (
            F.NETWORK_UTILIZATION_RATIO,
            F.NETWORK_BUSY_IN_COLLECTIVES_RATIO,
            F.NVLINK_PEAK_RATIO,
        ),
        R.PEER: (F.SDK_COMMUNICATION_SHARE,),
    }
)
# Follows every reason (a slow fabric moves less): evidence, but no reason of its own.
REASON_NEUTRAL: Final = (F.NETWORK_THROUGHPUT_DROP_RATIO,)
LOCAL_REASONS: Final = (R.LINK_ERRORS, R.SATURATED, R.CONGESTION)  # precedence
CLEAR_SCORE = 0.5
# How many ports, and counters per port, the evidence line names at most.
MAX_PORTS = 2
MAX_COUNTERS = 4
MINOR_SHARE = 0.1  # of the busiest port's increase: less is left out of the line

_RULES = {r.feature: r for r in RULES_BY_CAUSE[Cause.NETWORK]}


def reason_scores(evidence: Mapping[str, float]) -> dict[NetworkReason, float]:
    out: dict[NetworkReason, float] = {}
    for reason, features in REASON_FEATURES.items():
        miss = 1.0
        for name in features:
            x = evidence.get(name)
            if x is not None:
                rule = _RULES[name]
                miss *= 1.0 - rule.weight * rule.strength(x)
        out[reason] = 1.0 - miss
    return out


def network_reason(evidence: Mapping[str, float]) -> NetworkReason:
    """The sub-cause of a network window from its (averaged) evidence."""
    scores = reason_scores(evidence)
    for reason in LOCAL_REASONS:
        if scores[reason] >= CLEAR_SCORE:
            return reason
    local = [(scores[r], -i, r) for i, r in enumerate(LOCAL_REASONS) if scores[r] > 0]
    if local:
        return max(local)[2]
    return R.PEER


def deciding_counters(
    node: NodeSeries, reason: NetworkReason, start: float, end: float, first_port: str = ""
) -> str:
    """What moved during the window, for the reasons that counters decide: the fault
    counters for `link_errors` (from a flap lookback before the window), the congestion
    counters and transmit-wait for `congestion`; "" when nothing moved or for the others."""
    if reason is R.LINK_ERRORS:
        prefix, since = ERROR_PREFIX, start - LINK_FLAP_LOOKBACK_SECONDS
    elif reason is R.CONGESTION:
        prefix, since = CONGESTION_PREFIX, start
    else:
        return ""
    ports: list[tuple[bool, bool, float, str, list[str]]] = []  # first, flapped, sum, name, words
    for (dev, port), fields in node.network.items():
        moved: list[tuple[bool, float, str]] = []
        for key, s in fields.items():
            inc = s.increase(since, end)
            if not inc or inc <= 0:
                continue
            if key.startswith(prefix):
                counter = key[len(prefix) :]
                moved.append((counter in LINK_FLAP_COUNTERS, inc, f"{counter} +{inc:.0f}"))
            elif key == "tx_wait" and reason is R.CONGESTION:
                moved.append((False, inc, f"transmit-wait +{inc:.1f} s"))
        if moved:
            name = f"{dev}/{port}" if port else dev
            moved.sort(reverse=True)  # flaps first, then the biggest increase
            words = [w for _, _, w in moved[:MAX_COUNTERS]]
            flapped = moved[0][0]
            ports.append((name == first_port, flapped, sum(m[1] for m in moved), name, words))
    top = max((p[2] for p in ports), default=0.0)
    # a port that barely moved beside the one that decided is noise, unless it flapped
    kept = [p for p in ports if p[0] or p[1] or p[2] >= MINOR_SHARE * top]
    kept.sort(reverse=True)
    return "; ".join(f"{', '.join(p[4])} on {p[3]}" for p in kept[:MAX_PORTS])
