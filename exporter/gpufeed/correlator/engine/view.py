"""Derived signals of one node at one instant: rates, latencies, shares (from raw columns)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpufeed.correlator.engine.node import (
    CONGESTION_PREFIX,
    ERROR_PREFIX,
    OBJECT_MOUNTPOINT,
    JobColumns,
    NodeSeries,
)
from gpufeed.correlator.engine.series import Series
from gpufeed.vocabulary import LINK_FLAP_COUNTERS

# Below this many operations per second a mean latency is mostly noise: leave it out.
MIN_OPS_FOR_LATENCY = 2.0
# A job reading less than this (bytes per second) has no hit ratio worth telling.
MIN_CACHE_READ_BYTES = 1e6
# An object-storage request moves a whole object (megabytes), so even one in the rate
# window says how slow the store is; a disk's latency over a handful of 4 KiB reads is noise.
MIN_OBJECT_REQUESTS_FOR_LATENCY = 0.1
COLLECTIVE_WAIT = "collective_wait"  # the per-rank phase: time inside collectives
BUSY_CPU_MODES = ("user", "system", "nice", "irq", "softirq", "steal")
# A link that went down this recently still explains a stall: a flapping link spends its
# time retraining between the downs, and the job's collectives time out and retry after.
LINK_FLAP_LOOKBACK_SECONDS = 300.0
# carrier_changes counts both transitions of a flap; link_downed counts the flap once
FLAP_WEIGHT = {c: 0.5 if c == "carrier_changes" else 1.0 for c in LINK_FLAP_COUNTERS}


@dataclass(frozen=True, slots=True)
class Timing:
    """How the node's samples are spaced, and the lookbacks derived from that."""

    interval_seconds: float

    @property
    def stale_seconds(self) -> float:  # a value stays current through one missed scrape
        return 2.5 * self.interval_seconds

    @property
    def rate_window_seconds(self) -> float:
        return max(2.0 * self.interval_seconds, 10.0)

    @property
    def share_window_seconds(self) -> float:
        """The lookback of a CPU-only job's compute share, its stand-in for utilization.

        Shorter than `rate_window_seconds`: a share over the last 10 s is back above an 0.8
        threshold only once 8 of those 10 s were healthy, so every window of a CPU job
        ended about 8 s after the job had recovered (measured in the fault lab: 10-11 s of
        healthy time inside each window). NVML's utilization, which this stands in for, is
        a gauge over the last second or so. Not shorter than 5 s: over 3 s a healthy job's
        share dips below the threshold often enough on a loaded host to hold a window
        open (the lab's two recorded runs re-analysed: healthy time inside a window 7.0%
        and 1.8% at 3 s, 3.8% and 2.5% at 5 s, 7.8% and 5.0% at 10 s)."""
        return max(2.0 * self.interval_seconds, 5.0)

    @property
    def gap_seconds(self) -> float:  # a longer hole is a gap, never bridged
        return max(4.0 * self.interval_seconds, 60.0)


@dataclass(slots=True)
class TierView:
    read_bytes_per_second: float | None = None
    write_bytes_per_second: float | None = None
    read_ops_per_second: float | None = None
    read_latency_seconds: float | None = None
    write_latency_seconds: float | None = None
    busy_ratio: float | None = None
    queue_depth: float | None = None
    # object-storage tiers: requests refused as too many, of all requests (None: no
    # object-storage requests in the rate window, or a mount)
    throttled_ratio: float | None = None
    read_latency_target_seconds: float | None = None  # from the config, where stated


@dataclass(slots=True)
class NetView:
    bytes_per_second: float | None = None  # the busier direction
    utilization_ratio: float | None = None  # of link speed
    transmit_wait_ratio: float | None = None  # seconds waited per second
    link_up: float | None = None  # 1 up, 0 down (gpufeed_network_link_up)
    flaps: float | None = None  # link downs within LINK_FLAP_LOOKBACK_SECONDS
    errors_per_second: float | None = None  # the other fault counters, summed
    congestion_packets_per_second: float | None = None


@dataclass(slots=True)
class JobView:
    # its phases are reported and stood still over the rate window (a job blocked, not one
    # that reports none): with collective waits growing, blocked in a collective
    phases_stand_still: bool = False
    shares: dict[str, float] = field(default_factory=dict)  # phase -> share of reported time
    steps_per_second: float | None = None
    checkpoint_bytes_per_second: float | None = None
    tier_read_bytes_per_second: dict[str, float] = field(default_factory=dict)
    # its /proc/PID/io reads count its input workers' as they read (the agent says how many
    # processes it sums): a job counted reading nothing there reads nothing
    reads_fully_counted: bool = False
    tier_write_bytes_per_second: dict[str, float] = field(default_factory=dict)
    # mean over the job's ranks here of their collective wait, seconds per second, and
    # per GPU (uuid) where a rank names its GPU
    collective_wait_ratio: float | None = None
    gpu_collective_wait_ratio: dict[str, float] = field(default_factory=dict)
    cpu_throttled_ratio: float | None = None  # of its cgroup's CPU quota periods
    # the share of its read bytes the page cache served (None while it reads little)
    cache_hit_ratio: float | None = None
    # tier -> share of its open files there that memory reclaim evicted from the page cache
    cache_evicted_ratio: dict[str, float] = field(default_factory=dict)
    # tier -> bytes of the regular files it has open there (job_cache collector)
    open_bytes: dict[str, float] = field(default_factory=dict)
    # its threads' run-queue wait and runnable time (run + wait), seconds per second
    # (schedstat), and on cgroup v2 its cgroup's CPU pressure (share of wall time)
    cpu_waiting_per_second: float | None = None
    cpu_runnable_per_second: float | None = None
    cpu_pressure_ratio: float | None = None


@dataclass(slots=True)
class NodeView:
    t: float
    tiers: dict[str, TierView] = field(default_factory=dict)
    nets: dict[str, NetView] = field(default_factory=dict)
    cpu_busy_ratio: float | None = None
    iowait_ratio: float | None = None
    cpu_idle_ratio: float | None = None
    psi_some: dict[str, float] = field(default_factory=dict)
    psi_full: dict[str, float] = field(default_factory=dict)
    jobs: dict[str, JobView] = field(default_factory=dict)
    # GPUDirect Storage reads (nvidia-fs): per second, their mean latency, failed per second
    gds_reads_per_second: float | None = None
    gds_read_latency_seconds: float | None = None
    gds_read_errors_per_second: float | None = None


def _rater(t: float, tm: Timing) -> Callable[[Series | None], float | None]:
    """`_rate` with the lookbacks bound once (a view computes dozens of rates)."""
    w, st, gp = tm.rate_window_seconds, tm.stale_seconds, tm.gap_seconds

    def rate(s: Series | None) -> float | None:
        return None if s is None else s.rate_at(t, w, st, gp)

    return rate


def _add(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def compute_view(node: NodeSeries, t: float, tm: Timing) -> NodeView:
    view = NodeView(t)
    rate = _rater(t, tm)
    # storage: sum the mounts of a tier; latency = time per operation over the window
    acc: dict[str, list[float | None]] = {}
    object_tiers: set[str] = set()
    for (tier, mp), f in node.storage.items():
        if mp == OBJECT_MOUNTPOINT:
            object_tiers.add(tier)
        a = acc.setdefault(tier, [None] * 8)
        for i, key in enumerate(
            ("read_bytes", "written_bytes", "reads", "read_time", "io_time", "io_weighted")
        ):
            r = rate(f.get(key))
            if key == "io_time" and r is not None and a[i] is not None:
                a[i] = max(a[i] or 0.0, r)  # busy: the busiest device of the tier
            else:
                a[i] = _add(a[i], r)
        a[6] = _add(a[6], rate(f.get("writes")))
        a[7] = _add(a[7], rate(f.get("write_time")))
    for tier, a in acc.items():
        rb, wb, ops, rtime, busy, qd, wops, wtime = a
        least = MIN_OBJECT_REQUESTS_FOR_LATENCY if tier in object_tiers else MIN_OPS_FOR_LATENCY
        lat = rtime / ops if ops is not None and rtime is not None and ops >= least else None
        wlat = wtime / wops if wops is not None and wtime is not None and wops >= least else None
        view.tiers[tier] = TierView(
            rb, wb, ops, lat, wlat, None if busy is None else min(busy, 1.0), qd
        )
    if node.gds:
        view.gds_reads_per_second = rate(node.gds.get("ops"))
        gds_lat = node.gds.get("latency")
        if gds_lat is not None:
            view.gds_read_latency_seconds = gds_lat.value_at(t, tm.stale_seconds)
        for key, errors in node.gds.items():
            if key.startswith("errors:"):
                view.gds_read_errors_per_second = _add(
                    view.gds_read_errors_per_second, rate(errors)
                )
    for tier, target in node.tier_latency_targets.items():
        if tier in view.tiers:
            view.tiers[tier].read_latency_target_seconds = target.value_at(t, tm.stale_seconds)
    for (tier, mp), f in node.storage.items():
        if mp != OBJECT_MOUNTPOINT or tier not in view.tiers:
            continue
        requests = _add(rate(f.get("reads")), rate(f.get("writes")))
        throttled = _add(rate(f.get("throttled:read")), rate(f.get("throttled:write")))
        if requests and throttled is not None and requests >= MIN_OBJECT_REQUESTS_FOR_LATENCY:
            view.tiers[tier].throttled_ratio = min(throttled / requests, 1.0)
    for (dev, port), f in node.network.items():
        speed, since = link_capacity(f, t, tm)
        w = tm.rate_window_seconds
        if since is not None:
            # a shaped link: its bytes since the shaping took its present rate, not over a
            # window that reaches back to when the link carried ten times more
            w = min(w, max(t - since, 2.0 * tm.interval_seconds))
        rx, tx = (
            None if (s := f.get(k)) is None else s.rate_at(t, w, tm.stale_seconds, tm.gap_seconds)
            for k in ("rx", "tx")
        )
        bps = None if rx is None and tx is None else max(rx or 0.0, tx or 0.0)
        util = bps / speed if bps is not None and speed else None
        name = f"{dev}/{port}" if port else dev
        nv = view.nets[name] = NetView(bps, util, rate(f.get("tx_wait")))
        _link_view(nv, f, t, tm, rate)
    if node.cpu:
        rates = {m: rate(s) for m, s in node.cpu.items()}
        total = sum(r for r in rates.values() if r is not None)
        if total > 0:
            busy = sum(rates.get(m) or 0.0 for m in BUSY_CPU_MODES)
            view.cpu_busy_ratio = busy / total
            iow = rates.get("iowait")
            view.iowait_ratio = None if iow is None else iow / total
            idle = rates.get("idle")
            view.cpu_idle_ratio = None if idle is None else idle / total
    for res, s in node.psi_some.items():
        r = rate(s)
        if r is not None:
            view.psi_some[res] = min(r, 1.0)
    for res, s in node.psi_full.items():
        r = rate(s)
        if r is not None:
            view.psi_full[res] = min(r, 1.0)
    for job_id, j in node.jobs.items():
        jv = JobView()
        if j.phases:
            pr = {p: rate(s) for p, s in j.phases.items()}
            tot = sum(r for r in pr.values() if r is not None)
            if tot > 1e-9:
                jv.shares = {p: r / tot for p, r in pr.items() if r is not None}
            else:
                jv.phases_stand_still = any(r is not None for r in pr.values())
        jv.steps_per_second = rate(j.steps)
        jv.checkpoint_bytes_per_second = rate(j.checkpoint_bytes)
        for tier, s in j.tier_read.items():
            r = rate(s)
            if r is not None:
                jv.tier_read_bytes_per_second[tier] = r
        if j.io_processes is not None:
            jv.reads_fully_counted = j.io_processes.value_at(t, tm.stale_seconds) is not None
        periods = rate(j.cpu.get("periods"))
        throttled = rate(j.cpu.get("throttled_periods"))
        if periods is not None and throttled is not None and periods > 0:
            jv.cpu_throttled_ratio = min(throttled / periods, 1.0)
        pressure = rate(j.cpu.get("pressure"))
        jv.cpu_pressure_ratio = None if pressure is None else min(pressure, 1.0)
        waiting, running = rate(j.cpu.get("waiting")), rate(j.cpu.get("running"))
        if waiting is not None and running is not None:
            jv.cpu_waiting_per_second = waiting
            jv.cpu_runnable_per_second = waiting + running
        for tier, s in j.tier_written.items():
            r = rate(s)
            if r is not None:
                jv.tier_write_bytes_per_second[tier] = r
        _cache_view(jv, j, t, tm, rate)
        waits = []
        for (rank, p), s in j.rank_phases.items():
            if p == COLLECTIVE_WAIT and (r := rate(s)) is not None:
                waits.append(r)
                if rank in j.rank_uuid:
                    jv.gpu_collective_wait_ratio[j.rank_uuid[rank]] = min(r, 1.0)
        if waits:
            jv.collective_wait_ratio = min(sum(waits) / len(waits), 1.0)
        view.jobs[job_id] = jv
    return view


def _cache_view(
    jv: JobView, j: JobColumns, t: float, tm: Timing, rate: Callable[[Series | None], float | None]
) -> None:
    requested, fetched = rate(j.cache.get("requested")), rate(j.cache.get("fetched"))
    if requested is not None and fetched is not None and requested >= MIN_CACHE_READ_BYTES:
        jv.cache_hit_ratio = min(max(1.0 - fetched / requested, 0.0), 1.0)
    for (tier, what), s in j.cache_tier.items():
        if what != "open":
            continue
        size = s.value_at(t, tm.stale_seconds)
        if size is not None:
            jv.open_bytes[tier] = size
        ev = j.cache_tier.get((tier, "evicted"))
        evicted = ev.value_at(t, tm.stale_seconds) if ev is not None else None
        if size and evicted is not None:
            jv.cache_evicted_ratio[tier] = min(evicted / size, 1.0)


def _link_view(
    nv: NetView,
    f: dict[str, Series],
    t: float,
    tm: Timing,
    rate: Callable[[Series | None], float | None],
) -> None:
    """Link state, flaps, fault and congestion rates of one port (absent where not exported)."""
    up = f.get("up")
    nv.link_up = up.value_at(t, tm.stale_seconds) if up is not None else None
    for key, s in f.items():
        if key.startswith(ERROR_PREFIX):
            counter = key[len(ERROR_PREFIX) :]
            weight = FLAP_WEIGHT.get(counter)
            if weight is not None:
                inc = s.increase(t - LINK_FLAP_LOOKBACK_SECONDS, t)
                if inc is not None:
                    nv.flaps = (nv.flaps or 0.0) + inc * weight
            else:
                nv.errors_per_second = _add(nv.errors_per_second, rate(s))
        elif key.startswith(CONGESTION_PREFIX):
            nv.congestion_packets_per_second = _add(nv.congestion_packets_per_second, rate(s))


def link_capacity(
    f: Mapping[str, Series], t: float, tm: Timing
) -> tuple[float | None, float | None]:
    """What the link can carry at `t` and, where a root qdisc shapes it below its speed (a
    veth says 10 Gbit/s whatever its tbf lets through), since when at that rate (None: not
    shaped). A shaped rate counts only while it is as fresh as the link's own series: a
    qdisc removed stops its series while the link's go on."""
    sp, sh = f.get("speed"), f.get("shaped")
    speed = sp.value_at(t, tm.stale_seconds) if sp is not None else None
    shaped = sh.value_at(t, tm.stale_seconds) if sh is not None else None
    if sh is None or not shaped or (speed and shaped >= speed):
        return speed or None, None
    i = sh.index_at(t)
    if sp is not None and speed and sp.ts[sp.index_at(t)] > sh.ts[i]:
        return speed, None
    # back to the first sample of this rate (only as far as a rate window reaches)
    k = i
    while (
        k > 0
        and sh.vs[k - 1] == sh.vs[i]
        and sh.ts[k] - sh.ts[k - 1] <= tm.stale_seconds
        and sh.ts[k - 1] >= t - tm.rate_window_seconds
    ):
        k -= 1
    return shaped, sh.ts[k]
