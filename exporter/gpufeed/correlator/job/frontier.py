"""Who gates each step of a multi-rank job: a frontier accounting of the ranks' waits.

A synchronous job's step ends when its last rank arrives at the step's collectives; every
other rank waits for it there, and that exposed wait is the last arrivers' doing. So, per
step (a slice of the stall about one step long, at least one sample interval), the ranks
that wait clearly least in collectives gate it (under `GATE_RATIO` of the ranks' median,
which is itself at least `MIN_SLICE_WAIT`), and every other rank's wait above theirs is
credited to them, shared equally: an additive account of the step's lost time (the
per-step frontier of StageFrontier, arXiv 2606.06751; Greyhound's per-step comparison).
The reference is the job's other ranks in the same step, never the job's own past, so a
job that is slow from its first step is attributed like one that slowed down later.

Over a stall this tells three things apart (`Frontier`):
- the same ranks gate most steps (`persistent`): the culprit ranks (a slow worker, the
  ranks of a node whose tier stalls), or, where they are one pipeline stage on every
  data-parallel replica, a stage imbalance (no worker at fault);
- the gating data-parallel rank changes from step to step while no group gates most
  steps (`rotating`): an input imbalance (sequence lengths), no worker at fault;
- nobody gates clearly (every rank waits alike: a slow link, congestion): not decided here.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median

from gpufeed.correlator.engine.engine import step_counters
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.series import Series

RankKey = tuple[str, str]  # (instance, rank)

MIN_SLICE_WAIT = 0.25  # the ranks' median collective wait in a step, seconds/second
GATE_RATIO = 0.5  # a gating rank waits less than this share of the step's median
# a rank (or group) that gates at least this share of the attributed steps is persistent
PERSISTENT_SHARE = 0.6
# a rotation: the gating group changes from one step to the next at least this often
MIN_CHANGE_SHARE = 1 / 3
MIN_ATTRIBUTED_STEPS = 3  # fewer attributed steps decide nothing
# a data-parallel replica's share of the gated slices that turns taken at random among
# the job's replicas give at least this often is no persistent gate (two replicas that
# gate by turns: one gated 6 of 9 slices, over PERSISTENT_SHARE, as often as not)
TURNS_CHANCE = 0.05
# persistent gates need clear last arrivers in at least this share of the waiting steps:
# where most of the stall every rank waits alike (a slow link), a few steps' gates are
# noise, not a culprit (a rotation is judged on its attributed steps: an imbalanced
# step's slowest rank often stands out from the others' median by less than GATE_RATIO)
MIN_ATTRIBUTED_SHARE = 0.5
ACTIVE_LOOKBACK_SECONDS = 300.0  # a rank that reported in this span before the stall
MAX_SLICES = 360  # the most slices one stall is cut into (each reads every rank twice)


@dataclass(frozen=True, slots=True)
class Frontier:
    steps: int  # slices of the stall in which the job waited (median wait high enough)
    attributed: int  # of those, the slices with clear last arrivers
    slice_seconds: float
    gates: tuple[frozenset[RankKey], ...]  # each attributed slice's gating ranks
    credit_seconds: Mapping[RankKey, float]  # the others' exposed wait credited to each
    busy_share: Mapping[RankKey, float]  # 1 - collective wait share over the stall

    def decides(self) -> bool:
        """Whether enough of the waiting slices have clear last arrivers to name the
        ranks that gate them."""
        return (
            self.attributed >= MIN_ATTRIBUTED_STEPS
            and self.attributed >= MIN_ATTRIBUTED_SHARE * self.steps
        )

    def persistent(self) -> frozenset[RankKey]:
        """The ranks that gate at least PERSISTENT_SHARE of the attributed slices."""
        if not self.decides():
            return frozenset()
        n = Counter(k for g in self.gates for k in g)
        return frozenset(k for k, c in n.items() if c >= PERSISTENT_SHARE * self.attributed)

    def share(self, ranks: frozenset[RankKey]) -> float:
        """The share of the job's exposed wait over the stall credited to `ranks`."""
        total = sum(self.credit_seconds.values())
        mine = sum(v for k, v in self.credit_seconds.items() if k in ranks)
        return mine / total if total > 0 else 0.0

    def rotating(self, group: Mapping[RankKey, int]) -> int:
        """How many distinct groups (`group`: rank -> its data-parallel rank, or its own
        index without coordinates) gate the attributed slices in turn, where they rotate:
        most slices gated by ranks of one group, two groups or more, none gating
        PERSISTENT_SHARE of the slices unless turns taken at random give that share
        (`by_turns`), and the gating group changing from one slice to the next in at
        least MIN_CHANGE_SHARE of them; 0 otherwise."""
        if self.attributed < MIN_ATTRIBUTED_STEPS:
            return 0
        seq: list[int] = []
        for g in self.gates:
            ids = {group.get(k, -1) for k in g}
            if len(ids) == 1 and -1 not in ids:
                seq.append(ids.pop())
        per = Counter(seq)
        if len(per) < 2 or len(seq) < max(MIN_ATTRIBUTED_STEPS, 0.5 * self.attributed):
            return 0  # most slices gated by ranks of several groups: no rotation
        top = max(per.values())
        groups = len(set(group.values()))
        if top >= PERSISTENT_SHARE * len(seq) and not by_turns(top, len(seq), groups):
            return 0
        changes = sum(1 for a, b in pairwise(seq) if a != b)
        return len(per) if changes >= MIN_CHANGE_SHARE * (len(seq) - 1) else 0

    def gated_by(self, ranks: frozenset[RankKey]) -> int:
        """The attributed slices whose gates are all among `ranks`."""
        return sum(1 for g in self.gates if g <= ranks)


def by_turns(gated: int, slices: int, groups: int) -> bool:
    """Whether one of `groups` replicas that gate the slices by turns at random gates
    `gated` of `slices` or more at least TURNS_CHANCE of the time (the binomial tail)."""
    if groups < 2 or slices <= 0:
        return False
    p = 1.0 / groups
    tail = sum(
        math.comb(slices, i) * p**i * (1.0 - p) ** (slices - i) for i in range(gated, slices + 1)
    )
    return tail >= TURNS_CHANCE


def rank_waits(nodes: Mapping[str, NodeSeries], job_id: str, start: float) -> dict[RankKey, Series]:
    """(instance, rank) -> its cumulative collective wait, for the job's ranks that
    reported shortly before `start` (a rank gone before the stall is no candidate)."""
    out: dict[RankKey, Series] = {}
    for inst, n in nodes.items():
        j = n.jobs.get(job_id)
        if j is None:
            continue
        for (rank, phase), s in j.rank_phases.items():
            if phase != "collective_wait" or not len(s):
                continue
            info = j.rank_info.get(rank)
            if info is not None and info.value_at(start, ACTIVE_LOOKBACK_SECONDS) is None:
                continue
            out[(inst, rank)] = s
    return out


def step_seconds(nodes: Mapping[str, NodeSeries], job_id: str, start: float, end: float) -> float:
    """The job's step time over [start, end] from its nodes' step counters (the median
    node's; each counter shared out over the processes it sums), 0.0 where no node counts
    steps or none completed."""
    per: list[float] = []
    for n in nodes.values():
        j = n.jobs.get(job_id)
        if j is None or j.steps is None:
            continue
        a = j.steps.value_at(start, ACTIVE_LOOKBACK_SECONDS)
        b = j.steps.value_at(end, ACTIVE_LOOKBACK_SECONDS)
        if a is not None and b is not None and b > a:
            # the counter sums the steps of the job's processes here (engine.step_counters)
            steps = (b - a) / step_counters(j, end, ACTIVE_LOOKBACK_SECONDS)
            per.append((end - start) / steps)
    return median(per) if per else 0.0


def _interval(s: Series) -> float:
    """The series' sample interval: the median gap of its last samples."""
    gaps = [b - a for a, b in pairwise(s.ts[-65:]) if b > a]
    return median(gaps) if gaps else 0.0


def frontier(
    nodes: Mapping[str, NodeSeries], job_id: str, start: float, end: float
) -> Frontier | None:
    """The frontier accounting of the stall over [start, end] (see the module's doc);
    None where fewer than two ranks report their collective wait."""
    waits = rank_waits(nodes, job_id, start)
    if len(waits) < 2 or end <= start:
        return None
    iv = median(_interval(s) for s in waits.values())
    # at most MAX_SLICES slices: a long stall of a large job is judged in longer slices
    size = max(iv, step_seconds(nodes, job_id, start, end), (end - start) / MAX_SLICES)
    if size <= 0:
        return None
    edges = _edges(start, end, size)
    stale = max(2 * iv, ACTIVE_LOOKBACK_SECONDS)
    at = {k: _reported(s, edges, stale) for k, s in waits.items()}
    gates: list[frozenset[RankKey]] = []
    credit: dict[RankKey, float] = {}
    steps = 0
    for i in range(len(edges) - 1):
        d = edges[i + 1] - edges[i]
        x = {
            k: max(0.0, b - a) / d
            for k, v in at.items()
            if (a := v[i]) is not None and (b := v[i + 1]) is not None
        }
        if len(x) < 2:
            continue
        if waiting_level(x.values()) < MIN_SLICE_WAIT:
            continue
        steps += 1
        mid = median(x.values())
        gate = frozenset(k for k, w in x.items() if w <= GATE_RATIO * mid)
        if not gate:
            continue
        floor = max(x[k] for k in gate)
        exposed = sum(max(0.0, w - floor) for k, w in x.items() if k not in gate) * d
        for k in gate:
            credit[k] = credit.get(k, 0.0) + exposed / len(gate)
        gates.append(gate)
    busy = {
        k: 1.0 - max(0.0, v[-1] - v[0]) / (edges[-1] - edges[0])
        for k, v in at.items()
        if v[0] is not None and v[-1] is not None
    }
    return Frontier(steps, len(gates), size, tuple(gates), credit, busy)


def waiting_level(waits: Iterable[float]) -> float:
    """How long the ranks that wait in a slice wait, to tell whether the job waited in
    it: the upper quartile (the value a quarter of the ranks reach). Not the median: where
    half the ranks gate the step (one of two replicas) the median falls between the gates'
    wait and the victims', under MIN_SLICE_WAIT: two replicas that gated by turns, each
    rank waiting 40% of the steps the other gated, had 3 of 9 slices counted and nothing
    named. Who gates is still judged against the median (GATE_RATIO): against the upper
    quartile, of two ranks waiting alike in a slow all-reduce the one that waited a little
    less read as a gate, and the pair as a rotation."""
    xs = sorted(waits)
    return xs[math.ceil(0.75 * len(xs)) - 1]


def _reported(s: Series, edges: Sequence[float], stale: float) -> list[float | None]:
    """The rank's cumulative wait at each edge, read between its reports. A rank reports
    its wait as its steps end: under slow steps the counter holds still for several
    samples, then jumps by the wait of the whole step. Read as held, a slice shorter than
    the step sees one rank's jump and not the other's (their nodes sample at other
    instants) and reads a rank that waited all step as one that did not (a false gate,
    the two ranks gating slices in turn). So a move is spread evenly over the seconds
    before it that it must have taken (its size, within the hold before it); outside
    two moves (or a gap over `stale`), the held value."""
    moves_t: list[float] = []
    moves_v: list[float] = []
    for i, (t, v) in enumerate(zip(s.ts, s.vs, strict=True)):
        if i == 0 or v != s.vs[i - 1]:
            moves_t.append(t)
            moves_v.append(v)
    out: list[float | None] = []
    for t in edges:
        held = s.value_at(t, stale)
        j = bisect_right(moves_t, t)
        if held is None or j == 0 or j == len(moves_t):
            out.append(held)
            continue
        t0, t1 = moves_t[j - 1], moves_t[j]
        v0, v1 = moves_v[j - 1], moves_v[j]
        if t1 - t0 > stale or v1 < v0:
            out.append(held)
            continue
        # no rank waits faster than 1 s/s: the wait reported at t1 filled the last
        # (v1 - v0) seconds before it at most, and nothing before that
        begin = max(t0, t1 - (v1 - v0))
        out.append(v0 if t <= begin else v0 + (v1 - v0) * (t - begin) / (t1 - begin))
    return out


def _edges(start: float, end: float, size: float) -> list[float]:
    """Edges of equal slices from start to end, each at least `size` long and less than
    twice that (no sliver of a slice is judged alone)."""
    n = max(1, int((end - start) / size))
    return [start + (end - start) * i / n for i in range(n + 1)]
