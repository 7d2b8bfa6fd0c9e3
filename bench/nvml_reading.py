"""How NVML reads a GPU whose rank waits in a collective, for every labelled generator.

NCCL's collective kernel spins while it waits for a late peer, so NVML's utilization (the
share of time a kernel ran) counts the wait as busy, and only SM activity (GPM) shows the
compute; gloo, or collectives that do not spin, leave the GPU idle while it waits, and
utilization is the compute share. The generators model both (`GUISES`), the spinning one
first: the default for multi-rank jobs (issue 24: every accuracy figure for both).
"""

from __future__ import annotations

import math
import random

SPIN = "spin"
COMPUTE_ONLY = "compute_only"
GUISES = (SPIN, COMPUTE_ONLY)


def check_guise(guise: str, known: tuple[str, ...] = GUISES) -> None:
    if guise not in known:
        raise ValueError(f"unknown guise {guise!r}; known: {', '.join(known)}")


def utilization(compute: float, waiting: float, spins: bool, r: random.Random) -> float:
    """NVML's utilization of a GPU that computed `compute` and waited in a collective
    `waiting` of the sample interval (shares): the spinning kernel counts as busy."""
    if spins:
        return min(1.0, (compute + waiting) * (0.97 + 0.03 * r.random()))
    return min(1.0, compute * math.exp(r.gauss(0.0, 0.01)))


def sm_active(compute: float, waiting: float, r: random.Random) -> float:
    """SM activity (GPM) of the same interval: the compute's, and the little a waiting
    collective kernel keeps busy."""
    return min(1.0, (0.72 * compute + 0.05 * waiting) * math.exp(r.gauss(0.0, 0.03)))
