"""The job's other GPUs at the same instant, and a rank's own wait: no healthy past needed.

NVML counts a collective kernel that spins while it waits for a late peer as busy, so on
NCCL every victim of a straggler reads ~100% utilization. The engine's first check of
"busy is not working" compares SM activity with the GPU's own healthy level, and a job
that is slow from its first step never had one (issue 24). What a waiting GPU can always be
compared with is the rest of its job at the same moment: SM activity (GPM) far below the
highest of the job's GPUs now is a GPU that waits while another computes.

A rank's own collective wait (`gpufeed_job_rank_phase_seconds_total{phase="collective_wait"}`)
needs no peers: `gpu_collective_wait` reads it, and the engine counts it as work not done
(engine._peer_working, `rank_wait`). It once was counted only above the least any rank
of the job waited at the same instant; in a rotating imbalance every rank gates some of
a sample's steps, every rank waits alike over a sample, and that reference hid it.

Which GPUs and ranks count depends on the feed: the live agent sees only its own node (a
job whose culprit is on another node looks alike on every GPU here, and the job-level view,
correlator/job/, decides), `gpufeed analyze` and `gpufeed fleet` see every node of the job
(a batch holds whole jobs: feeds/batches.py). `JobPeers` reads whatever nodes it is given,
live, so a streamed feed that adds instances (or samples) as it goes needs no rebuilding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpufeed.correlator.engine.node import GpuColumns, JobColumns, NodeSeries
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.view import COLLECTIVE_WAIT, Timing

# Fewer GPUs (ranks) of the job than this with a current reading: nothing to compare with.
MIN_PEERS = 2
# A rank's collective wait is read over its last sample interval (the SDK reports a wait in
# flight every second), not the 10 s rate window: over that, a wait goes on counting for
# 10 s after it ended, against the compute that follows it, and on a GPU whose utilization
# already read idle while it waited (gloo) the same wait counted twice (measured: a healthy
# job with 46 s steps, 4 s of them in the all-reduce, read 0.78 busy over its steps).
WAIT_WINDOW_SECONDS = 0.0


STARTUP = "startup"  # the SDK's start-up phase: reported in one piece, not phase time


@dataclass(frozen=True, slots=True)
class CpuShares:
    """A CPU-only job's phase time on one node over a window: its compute and its ranks'
    collective wait, seconds per second, and all its phases' (start-up left out)."""

    compute_per_second: float | None
    collective_wait_per_second: list[float]
    phases_per_second: float


def cpu_shares(j: JobColumns, t: float, window: float, timing: Timing) -> CpuShares:
    stale, gap = timing.stale_seconds, timing.gap_seconds
    rates = [s.rate_at(t, window, stale, gap) for p, s in j.phases.items() if p != STARTUP]
    compute = j.phases.get("compute")
    waits = [
        r
        for (_, p), s in j.rank_phases.items()
        if p == COLLECTIVE_WAIT and (r := s.rate_at(t, window, stale, gap)) is not None
    ]
    return CpuShares(
        compute.rate_at(t, window, stale, gap) if compute is not None else None,
        waits,
        sum(r for r in rates if r is not None),
    )


def cpu_wait_share(shares: CpuShares) -> float | None:
    """The share of a CPU-only job's phase time its ranks here waited in collectives."""
    if not shares.collective_wait_per_second or shares.phases_per_second <= 1e-9:
        return None
    return min(sum(shares.collective_wait_per_second) / shares.phases_per_second, 1.0)


class JobPeers:
    """Per job and instant: the busiest SM activity of the job's GPUs, and the least
    collective-wait share of a CPU-only job's nodes, over `nodes` (instance -> columns;
    read as it is now)."""

    __slots__ = (
        "_busiest",
        "_gpu_index",
        "_index_size",
        "_index_t",
        "_job_index",
        "_least",
        "nodes",
    )

    def __init__(self, nodes: Mapping[str, NodeSeries]) -> None:
        self.nodes = nodes
        # job -> [(gpu columns, its job_info series)], rebuilt when series appear (checked once per instant: a fleet holds 1,000 nodes)
        self._gpu_index: dict[str, list[tuple[GpuColumns, Series]]] = {}
        self._job_index: dict[str, list[JobColumns]] = {}  # job -> its columns per node
        self._index_size = -1
        self._index_t = -math.inf
        # one instant's answers: every GPU of a node asks at the same instant
        self._busiest: dict[tuple[str, float], float | None] = {}
        self._least: dict[tuple[str, float, float], float | None] = {}

    @classmethod
    def of_node(cls, node: NodeSeries) -> JobPeers:
        """The peers one node sees: its own GPUs (the live agent)."""
        return cls({node.instance: node})

    def _refresh(self, t: float) -> None:
        if t == self._index_t:
            return
        self._index_t = t
        nodes = self.nodes.values()
        size = sum(len(n.job_info) + len(n.jobs) for n in nodes)
        if size == self._index_size:
            return
        gpus: dict[str, list[tuple[GpuColumns, Series]]] = {}
        jobs: dict[str, list[JobColumns]] = {}
        for n in nodes:
            for (j, gpu), s in n.job_info.items():
                g = n.gpus.get(gpu)
                if g is not None:
                    gpus.setdefault(j, []).append((g, s))
            for j, cols in n.jobs.items():
                jobs.setdefault(j, []).append(cols)
        self._gpu_index, self._job_index, self._index_size = gpus, jobs, size

    def least_cpu_wait_share(
        self, job: str, t: float, window: float, timing: Timing
    ) -> float | None:
        """The least collective-wait share of a CPU-only job's nodes at t over `window`
        (None: fewer than MIN_PEERS nodes report one). The node whose ranks wait least
        arrives last: it pays only the collective's own cost, what every rank pays in a
        healthy step; more than that on another node is exposed wait a late rank made."""
        key = (job, t, window)
        if key in self._least:
            return self._least[key]
        if len(self._least) > 4096:
            self._least.clear()
        self._refresh(t)
        seen = [
            w
            for cols in self._job_index.get(job, ())
            if (w := cpu_wait_share(cpu_shares(cols, t, window, timing))) is not None
        ]
        got = min(seen) if len(seen) >= MIN_PEERS else None
        self._least[key] = got
        return got

    def busiest_sm_active(self, job: str, t: float, timing: Timing) -> float | None:
        """The highest SM activity of the job's GPUs at t (None: fewer than MIN_PEERS)."""
        key = (job, t)
        if key in self._busiest:
            return self._busiest[key]
        if len(self._busiest) > 4096:
            self._busiest.clear()
        stale = timing.stale_seconds
        held = 0.5 * timing.interval_seconds  # presence, as Classifier.gpu_jobs reads it
        seen = []
        self._refresh(t)
        for g, info in self._gpu_index.get(job, ()):
            v = info.value_at(t, max(held, stale))
            if v is None or v <= 0:
                continue
            col = g.fields.get("sm_active")
            sm = col.value_at(t, stale) if col is not None else None
            if sm is not None:
                seen.append(sm)
        got = max(seen) if len(seen) >= MIN_PEERS else None
        self._busiest[key] = got
        return got


def gpu_collective_wait(
    j: JobColumns, uuid: str, t: float, timing: Timing, window: float = WAIT_WINDOW_SECONDS
) -> float | None:
    """The collective-wait share at t of the rank on the GPU `uuid` (None: no rank names
    it), over the last interval or about `window` seconds."""
    if not uuid:
        return None
    tm = timing
    for rank, u in j.rank_uuid.items():
        if u == uuid:
            s = j.rank_phases.get((rank, COLLECTIVE_WAIT))
            if s is None:
                return None
            r = s.rate_at(t, window, tm.stale_seconds, tm.gap_seconds)
            return None if r is None else min(r, 1.0)
    return None


def ranks_collective_wait(j: JobColumns, t: float, window: float, timing: Timing) -> list[float]:
    """Each of the job's ranks here: its collective-wait share over about `window` s."""
    stale, gap = timing.stale_seconds, timing.gap_seconds
    return [
        min(r, 1.0)
        for (_, p), s in j.rank_phases.items()
        if p == COLLECTIVE_WAIT and (r := s.rate_at(t, window, stale, gap)) is not None
    ]
