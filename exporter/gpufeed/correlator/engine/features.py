"""Evidence features for one unit (a GPU, or a CPU-only job) at one instant.

Every feature is named after the signal it measures and is expressed relative to the
node's healthy baseline where that matters ("latency 6x its median"), or gated on a rise
above the baseline ("CPU 97% busy" counts only if the healthy job does not run its CPUs
that hot anyway). Context strings (which tier, which device) travel beside the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufeed import vocabulary
from gpufeed.correlator.engine.baseline import Baselines, Kind
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.rules import (
    DATA_STALL_RULES,
    DATA_TIER_RULES,
    HOST_STORAGE_STALL_FEATURES,
    JOB_CPU_RULES,
)
from gpufeed.correlator.engine.view import JobView, NodeView
from gpufeed.vocabulary import UNASSIGNED_TIER, UNATTRIBUTED_TIER

# Clock event reasons that slow a GPU down (sync_boost, idle and clock settings do not).
THROTTLE_REASONS = frozenset(vocabulary.SLOWDOWN_REASONS)
# The XIDs that explain a stall as a GPU error: the one list the paging alert uses too.
FATAL_XIDS = frozenset(vocabulary.FATAL_XIDS)
MIN_TIER_READ_BYTES = 1e5  # a tier reading less than this is not feeding anyone
USUAL_TIER_READ_BYTES = 1e6  # healthy median above this: a tier the node's jobs read from
# A tier reading at least this share of a job's unattributed read rate may be carrying it.
CARRY_SHARE = 0.5
BURST_MIN_WRITE_BYTES = 5e7
# A port carries the jobs' traffic when its healthy median is at least this share of the
# busiest port's: a management link's flap or errors say nothing about a training job.
TRAFFIC_PORT_SHARE = 0.1
CONGESTION_FLOOR_PACKETS = 100.0  # per second: a quieter healthy baseline counts as this
CONGESTION_MIN_PACKETS = 500.0  # per second: fewer congestion packets than this are noise
WRITE_FLOOR_BYTES = 2e7
# A job whose threads want less CPU than this (seconds per second, run + wait) has no
# wait share worth reading.
MIN_RUNNABLE_CPU = 0.05
# What one thread that is runnable all the time wants (seconds per second): the least CPU
# time a wait share is taken over. A starved input pipeline has at least one such thread.
ONE_THREAD_CPU = 1.0
FOREIGN_READ_RISE = 0.3  # others' share of a tier's reads counts this far above usual
DATA_WAIT_SHARE = 0.3  # the job's input wait share from which it counts as waiting for data
COLLECTIVE_WAIT_RISE = 0.15  # collective wait counts this far above its healthy median
# ranks waiting in collectives at least this share of the time (the straggler rule's weak
# point) while the link is busy: they wait for their own link
COLLECTIVE_WAIT_FOR_LINK = 0.25
COLLECTIVE_WAIT_CLEAR = 0.55  # the straggler rule's strong point: the ranks wait for others
INPUT_WAIT_NONE = 0.1  # the job's data-wait share below this: it does not wait for input
# A job's page-cache hit ratio is told when it falls this far below its healthy median, or
# when reclaim evicted at least CACHE_EVICTED_MIN of its open files on the data tier.
CACHE_HIT_DROP = 0.25
CACHE_EVICTED_MIN = 0.1
# A job whose threads want less than this share of their healthy CPU time sleeps.
THREADS_ASLEEP_SHARE = 0.5
# The job's CPU wait share counts this far above its healthy median: on a host that other
# work keeps busy its threads wait for a CPU in healthy time too (0.3-0.5 seen in the lab).
JOB_CPU_WAIT_RISE = 0.2


@dataclass(slots=True)
class Evidence:
    """Features (names: correlator/engine/names.py Feature) and context (Context) of one sample."""

    features: dict[str, float] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)

    def copy(self) -> Evidence:
        return Evidence(dict(self.features), dict(self.context))


def observe_healthy(b: Baselines, view: NodeView) -> None:
    """Feeds one healthy bucket of node signals into the baselines."""
    for tier, tv in view.tiers.items():
        b.observe((Kind.READ_LATENCY, tier), tv.read_latency_seconds)
        b.observe((Kind.BUSY, tier), tv.busy_ratio)
        b.observe((Kind.QUEUE_DEPTH, tier), tv.queue_depth)
        b.observe((Kind.READ_BYTES, tier), tv.read_bytes_per_second)
        b.observe((Kind.WRITE_BYTES, tier), tv.write_bytes_per_second)
        b.peak((Kind.READ_BYTES, tier), tv.read_bytes_per_second)
    for net, nv in view.nets.items():
        b.observe((Kind.TRANSMIT_WAIT, net), nv.transmit_wait_ratio)
        b.observe((Kind.NETWORK_BYTES, net), nv.bytes_per_second)
        b.observe((Kind.NETWORK_UTILIZATION, net), nv.utilization_ratio)
        b.observe((Kind.LINK_UP, net), nv.link_up)
        b.observe((Kind.LINK_ERRORS, net), nv.errors_per_second)
        b.observe((Kind.CONGESTION_PACKETS, net), nv.congestion_packets_per_second)
    b.observe((Kind.CPU_BUSY,), view.cpu_busy_ratio)
    b.observe((Kind.IOWAIT,), view.iowait_ratio)
    b.observe((Kind.PRESSURE, "cpu"), view.psi_some.get("cpu"))
    b.observe((Kind.PRESSURE, "io"), view.psi_some.get("io"))
    for job_id, jv in view.jobs.items():
        for tier, r in jv.tier_read_bytes_per_second.items():
            b.observe((Kind.JOB_READ, job_id, tier), r)
            b.observe((Kind.FOREIGN_READ, job_id, tier), _foreign_share(view, tier, r))
        b.observe((Kind.COLLECTIVE_WAIT, job_id), jv.collective_wait_ratio)
        b.observe((Kind.JOB_CACHE_HIT, job_id), jv.cache_hit_ratio)
        b.observe((Kind.JOB_CPU_WAIT, job_id), job_cpu_wait_ratio(b, job_id, jv))
        b.observe((Kind.JOB_CPU_RUNNABLE, job_id), jv.cpu_runnable_per_second)
        if jv.steps_per_second:
            b.observe((Kind.STEP_SECONDS, job_id), 1.0 / jv.steps_per_second)


def _rise(value: float | None, base: float | None, min_rise: float) -> float | None:
    """`value` if it stands above its baseline by `min_rise` (or no baseline yet), else 0."""
    if value is None:
        return None
    if base is None or value - base >= min_rise:
        return value
    return 0.0


def _tier_features(b: Baselines, tier: str, view: NodeView) -> dict[str, float]:
    tv = view.tiers[tier]
    f: dict[str, float] = {}
    if tv.read_latency_seconds is not None:
        base = b.median((Kind.READ_LATENCY, tier))
        if base is not None:
            f[F.DATA_TIER_READ_LATENCY_X_BASELINE] = tv.read_latency_seconds / max(base, 5e-5)
    busy = _rise(tv.busy_ratio, b.median((Kind.BUSY, tier)), 0.15)
    if busy is not None:
        f[F.DATA_TIER_BUSY_RATIO] = busy
    if tv.queue_depth is not None:
        base = b.median((Kind.QUEUE_DEPTH, tier))
        f[F.DATA_TIER_QUEUE_X_BASELINE] = tv.queue_depth / max(1.0 if base is None else base, 0.5)
    rd = tv.read_bytes_per_second
    peak = b.peak((Kind.READ_BYTES, tier), rd)
    base_rd = b.median((Kind.READ_BYTES, tier))
    if rd is not None and peak and peak > 1e6 and (base_rd is None or rd > 1.3 * base_rd):
        f[F.DATA_TIER_READ_PEAK_RATIO] = rd / peak
    if tv.throttled_ratio is not None:  # object-storage tiers only
        f[F.DATA_TIER_THROTTLED_RATIO] = tv.throttled_ratio
    return f


def _tier_stress(f: dict[str, float]) -> float:
    miss = 1.0
    for r in DATA_TIER_RULES:
        x = f.get(r.feature)
        if x is not None:
            miss *= 1.0 - r.weight * r.strength(x)
    return 1.0 - miss


def job_features(b: Baselines, view: NodeView, job_id: str, ev: Evidence) -> None:
    """Node- and job-level features (the same for every GPU of the job at this instant)."""
    jv = view.jobs.get(job_id) if job_id else None
    _data_tier_features(b, view, _tier_candidates(b, view, job_id, jv), ev)
    if jv is not None:
        _foreign_read_features(b, view, job_id, jv, ev)
    _checkpoint_features(b, view, jv, ev)
    _host_features(b, view, ev)
    _network_features(b, view, ev)
    if jv is not None:
        _sdk_features(jv, ev)
        _reads_no_tier(jv, ev)
        _cache_features(b, job_id, jv, ev)
        cw = _rise(
            jv.collective_wait_ratio,
            b.median((Kind.COLLECTIVE_WAIT, job_id)),
            COLLECTIVE_WAIT_RISE,
        )
        if cw is not None:
            ev.features[F.COLLECTIVE_WAIT_RATIO] = cw
            util = ev.features.get(F.NETWORK_UTILIZATION_RATIO)
            if util is not None and cw >= COLLECTIVE_WAIT_FOR_LINK:
                ev.features[F.NETWORK_BUSY_IN_COLLECTIVES_RATIO] = util
            _not_waiting_for_input(ev, cw)
        if jv.cpu_throttled_ratio is not None:
            ev.features[F.JOB_CPU_THROTTLED_RATIO] = jv.cpu_throttled_ratio
        _cpu_wait_features(b, job_id, jv, ev)
        _threads_asleep(b, job_id, jv, ev)
        if cw is not None and jv.phases_stand_still:
            _blocked_not_starved(ev, cw)
        wait_is_relative = b.median((Kind.JOB_CPU_WAIT, job_id)) is not None
        _data_outranks_unsettled_wait(ev, wait_is_relative)
        _input_wait_is_cpu(ev, wait_is_relative)


def job_cpu_wait_ratio(b: Baselines, job_id: str, jv: JobView) -> float | None:
    """The share of the time the job's threads waited for a CPU: on cgroup v2 its cgroup's
    CPU pressure (wall time with one of its tasks waiting); else their run-queue wait over
    the CPU time they want, taken as at least their healthy median and at least one thread's
    worth (ONE_THREAD_CPU), as the cgroup's pressure is a share of wall time. Threads that
    sleep on I/O or in their loader and wake briefly wait for a CPU at most wakeups on a
    loaded host: over their own runnable time alone a tier read limit looked like CPU
    starvation (the lab's short throttle scenario came out preprocessing), and so did a
    sleep in `__getitem__` before any healthy median (0.1 s/s runnable, 60% of it waiting, at
    load 8). Starved workers are runnable all the time: at least one thread's worth, most
    of it waiting; no healthy past is needed to tell them."""
    if jv.cpu_pressure_ratio is not None:
        return jv.cpu_pressure_ratio
    waiting, runnable = jv.cpu_waiting_per_second, jv.cpu_runnable_per_second
    if waiting is None or runnable is None:
        return None
    wants = max(runnable, b.median((Kind.JOB_CPU_RUNNABLE, job_id)) or 0.0)
    if wants < MIN_RUNNABLE_CPU:
        return None  # a few context switches would swing the share
    return min(max(waiting / max(wants, ONE_THREAD_CPU), 0.0), 1.0)


def _cpu_wait_features(b: Baselines, job_id: str, jv: JobView, ev: Evidence) -> None:
    """The job's threads waiting for a CPU, above their healthy share; not counted while
    the job says it does not wait for input (its stall is not in its input pipeline)."""
    ratio = job_cpu_wait_ratio(b, job_id, jv)
    base = b.median((Kind.JOB_CPU_WAIT, job_id))
    # a share that is near 1 in healthy time (a host at load 20: 0.87 in the lab) cannot
    # rise by JOB_CPU_WAIT_RISE: there half of its headroom is the rise that counts
    rise = JOB_CPU_WAIT_RISE if base is None else min(JOB_CPU_WAIT_RISE, (1.0 - base) / 2)
    w = _rise(ratio, base, rise)
    if w is None:
        return
    dw = ev.features.get(F.SDK_DATA_WAIT_SHARE)
    ev.features[F.JOB_CPU_WAIT_RATIO] = w if dw is None or dw >= DATA_WAIT_SHARE else 0.0


def _threads_asleep(b: Baselines, job_id: str, jv: JobView, ev: Evidence) -> None:
    """A job whose threads want far less CPU than in healthy time (run + run-queue wait
    under THREADS_ASLEEP_SHARE of their healthy median, or under MIN_RUNNABLE_CPU) and are
    not starved (no quota
    throttling, no raised run-queue wait) sleeps: on a lock, a remote fetch, a sleep in its
    loader, slow storage. Busy CPUs do not hold back threads that do not ask for them: the
    host's CPU busy and pressure are other work's and count as not raised (issue 23: a
    loader asleep in __getitem__ on a host other test suites kept 100% busy was called
    preprocessing, "the CPUs are saturated"). Starved workers stay runnable, CPU-bound
    ones run: neither falls this low. Before two minutes of healthy time the healthy
    buckets seen so far are the usual want (`Baselines.early`): a job stalled 75 s after it
    began, its one training thread's 1.0 s/s down to 0.1, sleeps (issue 23's sleep loader,
    called preprocessing on a busy host for want of a median)."""
    key = (Kind.JOB_CPU_RUNNABLE, job_id)
    want, usual = jv.cpu_runnable_per_second, b.median(key) or b.early(key)
    if want is None:
        return
    # under MIN_RUNNABLE_CPU they sleep whatever they usually want: before any healthy
    # bucket too, as in a live run that stalled 45 s after it began
    asleep = want < MIN_RUNNABLE_CPU or (
        usual is not None and usual >= MIN_RUNNABLE_CPU and want < THREADS_ASLEEP_SHARE * usual
    )
    f = ev.features
    starved = any(r.strength(f[r.feature]) > 0.0 for r in JOB_CPU_RULES if r.feature in f)
    if starved or not asleep:
        return
    for name in (F.CPU_BUSY_RATIO, F.CPU_PRESSURE_RATIO):
        if name in f:
            f[name] = 0.0


def _data_outranks_unsettled_wait(ev: Evidence, wait_is_relative: bool) -> None:
    """A run-queue wait with no healthy median to rise above is not the job's starvation
    where the data side has primary evidence of its own (the job's tier slow or piling up,
    or the node stalled on I/O while the job waits for input): threads that sleep on their
    reads and wake briefly wait for a CPU at most wakeups on a loaded host (0.76-0.97 in
    the lab's short throttle scenario at load 10, a blkio limit on the job's own tier), so
    before two minutes of healthy history a read limit looks like CPU starvation, and the
    job's CPU evidence, which outranks the host's I/O signals, would explain the job's own
    stalled reads away (preprocessing for most of that fault). Such a wait counts as not
    raised, as in `_input_wait_is_cpu`; quota throttling, and a wait against its healthy
    median, still decide (a starved job on a busy host)."""
    f = ev.features
    if wait_is_relative or not f.get(F.JOB_CPU_WAIT_RATIO):
        return
    if any(r.strength(f[r.feature]) >= 0.5 for r in DATA_STALL_RULES if r.feature in f):
        f[F.JOB_CPU_WAIT_RATIO] = 0.0


def _input_wait_is_cpu(ev: Evidence, wait_is_relative: bool) -> None:
    """Host-wide I/O pressure while the job waits for input says "storage" only where the
    job has no reason of its own: when its own threads starve for CPU (its quota throttles
    them, or they wait in the run queue far more than usual) its input wait is that, and
    the node's I/O pressure is other work's (lab scenario cpu-quota-heavy: a 0.05 CPU quota
    was named data_loading for the whole fault while another tenant's reads raised PSI io).
    The run-queue wait counts here only against a healthy median (`wait_is_relative`): on a
    host other work saturates the job's threads wait most of the time anyway, and before
    two minutes of healthy history (the lab's short throttle scenario) a tier read limit
    looked like that. The tier's own signals (latency, busy time, queue) still decide."""
    f = ev.features
    if F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT not in f:
        return
    starved = max(
        (
            r.strength(f[r.feature])
            for r in JOB_CPU_RULES
            if r.feature in f and (wait_is_relative or r.feature != F.JOB_CPU_WAIT_RATIO)
        ),
        default=0.0,
    )
    if starved >= 0.5:
        f[F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT] = 0.0


def _not_waiting_for_input(ev: Evidence, collective_wait: float) -> None:
    """The job says where its time goes: ranks that wait in collectives most of the time
    (the straggler rule's strong point) while the job hardly waits for input are held by a
    peer or their link, not by this host's busy CPUs (another tenant's load, or on a shared
    host another node's): the host's CPU readings count as not raised. The job's own CPU
    quota throttling still counts (it slows the rank's own compute)."""
    dw = ev.features.get(F.SDK_DATA_WAIT_SHARE)
    if collective_wait >= COLLECTIVE_WAIT_CLEAR and dw is not None and dw < INPUT_WAIT_NONE:
        for name in (F.CPU_BUSY_RATIO, F.CPU_PRESSURE_RATIO):
            if name in ev.features:
                ev.features[name] = 0.0


def _blocked_not_starved(ev: Evidence, collective_wait: float) -> None:
    """A job whose phases stand still while its ranks wait in a collective is blocked on a
    peer (the wait in flight, see sdk.Job.collective_begin), not starved of CPU: neither the
    host's busy CPUs nor its own threads' run-queue wait explain it (they hardly run, so
    what little they ask for waits behind the host's other work: 0.96-0.98 on the lab's
    loaded host while node 1's rank was stopped). Its own quota throttling still counts."""
    if collective_wait >= COLLECTIVE_WAIT_CLEAR:
        for name in (F.CPU_BUSY_RATIO, F.CPU_PRESSURE_RATIO, F.JOB_CPU_WAIT_RATIO):
            if name in ev.features:
                ev.features[name] = 0.0


def _reads_no_tier(jv: JobView, ev: Evidence) -> None:
    """A job whose own reads are accounted and come from no tier (it reads nothing, or only
    imports) does not wait for storage, whatever the host's I/O pressure: that pressure is
    other work's (contention on the host at most), so it does not say "storage" here."""
    f = ev.features
    reads_none = jv.tier_read_bytes_per_second and Ctx.DATA_TIER not in ev.context
    if reads_none and F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT in f:
        f[F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT] = 0.0
    if _reads_nothing(jv):
        for name in (*HOST_STORAGE_STALL_FEATURES, F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT):
            if name in f:
                f[name] = 0.0


def _reads_nothing(jv: JobView) -> bool:
    """Whether the job is shown to read nothing: every process whose I/O is summed for it
    counted, its input workers included (`JobView.reads_fully_counted`), and no tier gives
    it MIN_TIER_READ_BYTES. The host's I/O stall (PSI io, iowait) is then other work's and
    does not keep a wait inside its own pipeline from being told as that: a sleep in
    `__getitem__` beside a test suite (I/O pressure 56%) was `unknown` in all four feeds."""
    reads = jv.tier_read_bytes_per_second
    return (
        jv.reads_fully_counted
        and bool(reads)
        and all(r <= MIN_TIER_READ_BYTES for r in reads.values())
    )


def _tier_candidates(b: Baselines, view: NodeView, job_id: str, jv: JobView | None) -> list[str]:
    """Which tiers may feed this job. Where its reads are accounted (cgroup io per tier, or
    /proc/PID/io: "unattributed"), only the tiers it reads: a tier it reads nothing from
    (now, or in its healthy time) is someone else's, however slow other work makes it, and a
    job that reads no tier has none (a sleep in its loader, a dataset in memory: issue 23
    saw an idle job's imports blamed on the shared disk's latency). Without accounting, the
    tiers the node reads from in healthy time; before any healthy time, any tier reading."""
    if jv is not None and jv.tier_read_bytes_per_second:
        return _job_read_tiers(b, view, job_id, jv)
    cands = [
        t for t in view.tiers if (b.median((Kind.READ_BYTES, t)) or 0.0) > USUAL_TIER_READ_BYTES
    ]
    if not cands and _no_tier_baseline(b, view):
        cands = _reading_now(view)
    return cands


def _no_tier_baseline(b: Baselines, view: NodeView) -> bool:
    return all(b.median((Kind.READ_BYTES, t)) is None for t in view.tiers)


def _reading_now(view: NodeView) -> list[str]:
    return [
        t for t, tv in view.tiers.items() if (tv.read_bytes_per_second or 0.0) > MIN_TIER_READ_BYTES
    ]


def _job_read_tiers(b: Baselines, view: NodeView, job_id: str, jv: JobView) -> list[str]:
    """The tiers the job's own reads come from: those it reads now, else the one it reads
    most in healthy time. A tier from which it takes less than MIN_TIER_READ_BYTES (an
    import, a config file, a log) does not feed its input: a stalled input pipeline asks a
    tier for its next batch's bytes, far more than that. Unattributed bytes (/proc/PID/io
    names no device) are given to the node's tiers that can carry them (`_carrying`)."""
    now = jv.tier_read_bytes_per_second
    cands = [t for t, r in now.items() if r > MIN_TIER_READ_BYTES and t in view.tiers]
    loose = now.get(UNATTRIBUTED_TIER, 0.0)
    if loose > MIN_TIER_READ_BYTES:
        cands += [t for t in _carrying(b, view, job_id, jv, loose) if t not in cands]
    if cands:
        return cands
    rate, tier = max((b.median((Kind.JOB_READ, job_id, t)) or 0.0, t) for t in now)
    if rate <= MIN_TIER_READ_BYTES:
        unseen_workers = set(now) == {UNATTRIBUTED_TIER} and not jv.reads_fully_counted
        return _slowed_with_job(b, view) if unseen_workers else []
    if tier != UNATTRIBUTED_TIER:
        return [tier] if tier in view.tiers else []
    # it reads nothing now: the tiers that carried its usual reads in healthy time
    return [t for t in view.tiers if (b.median((Kind.READ_BYTES, t)) or 0.0) >= CARRY_SHARE * rate]


def _slowed_with_job(b: Baselines, view: NodeView) -> list[str]:
    """/proc/PID/io sums the processes the agent knows of, and the kernel adds a child's
    reads to its parent's only when it reaps it: input workers the agent was not told of
    (DataLoader workers of an older `gpufeed run`) read their batches unseen until they
    exit (the lab's mn2-tier-throttle fixture: 0 B/s counted while its tier read 3 MB/s,
    122 MB at the end; an agent that sums them says so, `JobView.reads_fully_counted`, and
    this is not asked). So counting nothing there does not show that the job reads no tier:
    a tier the node's jobs usually read whose reads fell below CARRY_SHARE of its healthy
    median while the job stalls has slowed with it (a read limit, a slow device), and may
    feed it. A tier another tenant loads keeps or raises its reads: never a candidate.
    Before a median (no level to fall from): the tiers reading now that read in the
    healthy time seen so far too, or, with none seen at all, any tier reading now (as for
    a job without accounting): a tier another tenant began to read at the stall read
    nothing in the job's healthy seconds, and is not the job's (tests/test_data_tier_real.py).
    Never the `unassigned` bag (the host's own disks and other tenants' mounts): its
    reads rise and fall with whatever else runs, and a job counted reading nothing is
    not shown to read there (a loader asleep in `__getitem__` beside a test suite was
    called "waits for data from the unassigned tier", issue 23); a job whose counted
    bytes an unassigned device carries is found by `_carrying`."""
    return [t for t in _slowed_tiers(b, view) if t != UNASSIGNED_TIER]


def _slowed_tiers(b: Baselines, view: NodeView) -> list[str]:
    if _no_tier_baseline(b, view):
        now = _reading_now(view)
        seen = {t: b.early((Kind.READ_BYTES, t)) for t in now}
        if all(v is None for v in seen.values()):
            return now
        return [t for t in now if (seen[t] or 0.0) > MIN_TIER_READ_BYTES]
    return [
        t
        for t, tv in view.tiers.items()
        if (m := b.median((Kind.READ_BYTES, t)) or 0.0) > USUAL_TIER_READ_BYTES
        and (tv.read_bytes_per_second or 0.0) < CARRY_SHARE * m
    ]


def _carrying(b: Baselines, view: NodeView, job_id: str, jv: JobView, rate: float) -> list[str]:
    """The node's tier that most likely holds the job's unattributed reads at `rate`: of
    the tiers that read at least CARRY_SHARE of it now (what /proc/PID/io counts as read was
    fetched from a device; the share allows for rate windows that do not line up), those
    the job has files open on, else those that carried its usual reads in healthy time,
    else all; of these the one that reads the least, the fewest bytes that are not the
    job's: a tier another tenant reads hard carries the job's bytes no more than a quieter
    one that reads as much as the job does."""
    fits = [
        t for t, tv in view.tiers.items() if (tv.read_bytes_per_second or 0.0) >= CARRY_SHARE * rate
    ]
    if len(fits) < 2:
        return fits
    usual = b.median((Kind.JOB_READ, job_id, UNATTRIBUTED_TIER)) or 0.0
    carried = [
        t
        for t in fits
        if usual > 0 and (b.median((Kind.READ_BYTES, t)) or 0.0) >= CARRY_SHARE * usual
    ]
    pool = [t for t in fits if jv.open_bytes.get(t, 0.0) > 0] or carried or fits
    return [min(pool, key=lambda t: view.tiers[t].read_bytes_per_second or 0.0)]


def _data_tier_features(b: Baselines, view: NodeView, cands: list[str], ev: Evidence) -> None:
    """The data tier is the candidate under most stress (ties: the busiest); its features."""
    best: tuple[float, float, str, dict[str, float]] | None = None
    for tier in cands:
        tf = _tier_features(b, tier, view)
        key = (_tier_stress(tf), view.tiers[tier].read_bytes_per_second or 0.0, tier, tf)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is not None:
        ev.features.update(best[3])
        ev.context[Ctx.DATA_TIER] = best[2]
        tv = view.tiers[best[2]]
        lat, target = tv.read_latency_seconds, tv.read_latency_target_seconds
        if lat is not None and target and lat > target:
            ev.features[F.TIER_READ_LATENCY_X_TARGET] = lat / target
    _gds_features(view, ev)


def _gds_features(view: NodeView, ev: Evidence) -> None:
    """GPUDirect Storage reads on this node (nvidia-fs): their latency and failures explain
    a data stall of a job that reads storage straight into GPU memory, whose bytes the tier's
    block devices may not see (a remote GDS target); descriptive (ACCOMPANYING)."""
    if (view.gds_reads_per_second or 0.0) <= 0.0:
        return
    if view.gds_read_latency_seconds is not None:
        ev.features[F.GDS_READ_LATENCY_SECONDS] = view.gds_read_latency_seconds
    if view.gds_read_errors_per_second:
        ev.features[F.GDS_READ_ERRORS_PER_SECOND] = view.gds_read_errors_per_second


def _cache_features(b: Baselines, job_id: str, jv: JobView, ev: Evidence) -> None:
    """Re-reads that stopped hitting the page cache (a dataset that outgrew memory): they
    explain why a data tier is loaded, they do not decide that it is (ACCOMPANYING)."""
    tier = ev.context.get(Ctx.DATA_TIER)
    evicted = jv.cache_evicted_ratio.get(tier) if tier else None
    if evicted is not None and evicted >= CACHE_EVICTED_MIN:
        ev.features[F.JOB_CACHE_EVICTED_RATIO] = evicted
    hit = jv.cache_hit_ratio
    if hit is None:
        return
    base = b.median((Kind.JOB_CACHE_HIT, job_id))
    dropped = base is not None and base - hit >= CACHE_HIT_DROP
    if dropped or F.JOB_CACHE_EVICTED_RATIO in ev.features:
        ev.features[F.JOB_CACHE_HIT_RATIO] = hit


def _foreign_share(view: NodeView, tier: str, job_rate: float) -> float | None:
    """The share of `tier`'s reads that are not the job's; None where it reads too little."""
    tv = view.tiers.get(tier)
    rate = tv.read_bytes_per_second if tv is not None else None
    if rate is None or rate < MIN_TIER_READ_BYTES:
        return None
    return min(max(1.0 - job_rate / rate, 0.0), 1.0)


def _foreign_read_features(
    b: Baselines, view: NodeView, job_id: str, jv: JobView, ev: Evidence
) -> None:
    """Another reader on the job's data tier: the tier reads much more than the job does
    (the job's own per-tier reads, cgroup accounting), above the usual share of others."""
    tier = ev.context.get(Ctx.DATA_TIER)
    job_rate = jv.tier_read_bytes_per_second.get(tier or "")
    if tier is None or job_rate is None:
        return
    share = _foreign_share(view, tier, job_rate)
    base = b.median((Kind.FOREIGN_READ, job_id, tier))
    x = _rise(share, base, FOREIGN_READ_RISE)
    if x is not None:
        ev.features[F.DATA_TIER_FOREIGN_READ_SHARE] = x


def _checkpoint_features(b: Baselines, view: NodeView, jv: JobView | None, ev: Evidence) -> None:
    """A write burst to a tier (the job's own writes where accounted)."""
    writes: dict[str, float] = {}
    if jv is not None and jv.tier_write_bytes_per_second:
        writes = _attribute_writes(jv.tier_write_bytes_per_second, view)
    else:
        writes = {t: tv.write_bytes_per_second or 0.0 for t, tv in view.tiers.items()}
    burst = 0.0
    for tier, wb in writes.items():
        if wb >= BURST_MIN_WRITE_BYTES:
            x = wb / max(b.median((Kind.WRITE_BYTES, tier)) or 0.0, WRITE_FLOOR_BYTES)
            if x > burst:
                burst = x
                ev.context[Ctx.CHECKPOINT_TIER] = tier
    if writes:
        ev.features[F.WRITE_BURST_X_BASELINE] = burst
    if jv is not None and jv.checkpoint_bytes_per_second is not None:
        ev.features[F.JOB_CHECKPOINT_WRITE_BYTES_PER_SECOND] = jv.checkpoint_bytes_per_second


def _attribute_writes(job_writes: dict[str, float], view: NodeView) -> dict[str, float]:
    """The job's write rates per tier, its unattributed bytes (/proc/PID/io: no device)
    given to the tier they went to: the node's tier writing the most now, if it wrote at
    least half as much as the job (the rest of the job's bytes are still in the page cache,
    or went to a tier gpufeed does not watch); otherwise they stay unattributed."""
    out = dict(job_writes)
    loose = out.get(UNATTRIBUTED_TIER)
    if not loose:
        return out
    tiers = [(tv.write_bytes_per_second or 0.0, t) for t, tv in view.tiers.items()]
    node_rate, tier = max(tiers, default=(0.0, ""))
    if tier and node_rate >= 0.5 * loose:
        del out[UNATTRIBUTED_TIER]
        out[tier] = out.get(tier, 0.0) + loose
    return out


def _host_features(b: Baselines, view: NodeView, ev: Evidence) -> None:
    """Host CPU and pressure, each counted only above its healthy median."""
    f = ev.features
    for name, value, kind, min_rise in (
        (F.CPU_BUSY_RATIO, view.cpu_busy_ratio, (Kind.CPU_BUSY,), 0.08),
        (F.CPU_PRESSURE_RATIO, view.psi_some.get("cpu"), (Kind.PRESSURE, "cpu"), 0.05),
        (F.IO_PRESSURE_RATIO, view.psi_some.get("io"), (Kind.PRESSURE, "io"), 0.05),
        (F.IOWAIT_RATIO, view.iowait_ratio, (Kind.IOWAIT,), 0.03),
    ):
        v = _rise(value, b.median(kind), min_rise)
        if v is not None:
            f[name] = v
    if view.cpu_idle_ratio is not None:
        f[F.HOST_CPU_IDLE_RATIO] = view.cpu_idle_ratio


def _network_features(b: Baselines, view: NodeView, ev: Evidence) -> None:
    """The fabric: saturation near link speed, congestion as transmit-wait above normal."""
    f, ctx = ev.features, ev.context
    util_best = -1.0
    wait_best = -1.0
    for net, nv in view.nets.items():
        u = _rise(nv.utilization_ratio, b.median((Kind.NETWORK_UTILIZATION, net)), 0.05)
        if u is not None and u > util_best:
            util_best = u
            if u > 0:
                ctx[Ctx.NETWORK_DEVICE] = net
        w = nv.transmit_wait_ratio
        if w is not None:
            x = w / max(b.median((Kind.TRANSMIT_WAIT, net)) or 0.0, 0.005) if w >= 0.02 else 0.0
            if x > wait_best:
                wait_best = x
                if x > 0:
                    ctx[Ctx.NETWORK_DEVICE] = net
                base = b.median((Kind.NETWORK_BYTES, net))
                if base and base > 1e6 and nv.bytes_per_second is not None:
                    f[F.NETWORK_THROUGHPUT_DROP_RATIO] = max(0.0, 1.0 - nv.bytes_per_second / base)
    if util_best >= 0:
        f[F.NETWORK_UTILIZATION_RATIO] = util_best
    if wait_best >= 0:
        f[F.NETWORK_TRANSMIT_WAIT_X_BASELINE] = wait_best
    _link_features(b, view, ev)


def _traffic_ports(b: Baselines, view: NodeView) -> list[str]:
    """The ports that carry the node's traffic (all of them until there is a baseline)."""
    usual = {net: b.median((Kind.NETWORK_BYTES, net)) for net in view.nets}
    top = max((u for u in usual.values() if u is not None), default=None)
    if not top:
        return list(view.nets)
    return [net for net, u in usual.items() if u is None or u >= TRAFFIC_PORT_SHARE * top]


def _link_features(b: Baselines, view: NodeView, ev: Evidence) -> None:
    """Faults and congestion counted by the traffic ports: flaps, a port down that is
    normally up, fault counters above their healthy rate, congestion packets above theirs."""
    best: dict[str, tuple[float, str]] = {}

    def keep(name: str, x: float | None, net: str) -> None:
        if x is not None and x > best.get(name, (-1.0, ""))[0]:
            best[name] = (x, net)

    for net in _traffic_ports(b, view):
        nv = view.nets[net]
        keep(F.NETWORK_LINK_FLAPS, nv.flaps, net)
        if nv.link_up is not None:
            usual = b.median((Kind.LINK_UP, net))
            keep(F.NETWORK_LINK_DOWN, 1.0 if nv.link_up < 0.5 and (usual or 0) >= 0.5 else 0.0, net)
        if nv.errors_per_second is not None:
            base = b.median((Kind.LINK_ERRORS, net)) or 0.0
            keep(F.NETWORK_LINK_ERRORS_PER_SECOND, max(0.0, nv.errors_per_second - base), net)
        c = nv.congestion_packets_per_second
        if c is not None:
            base = b.median((Kind.CONGESTION_PACKETS, net)) or 0.0
            x = c / max(base, CONGESTION_FLOOR_PACKETS) if c >= CONGESTION_MIN_PACKETS else 0.0
            keep(F.NETWORK_CONGESTION_PACKETS_X_BASELINE, x, net)
    for name, (x, net) in best.items():
        ev.features[name] = x
        if x > 0:
            ev.context[Ctx.NETWORK_DEVICE] = net


# The job's own account (SDK): phase -> the feature of its share of the reported time.
SDK_SHARES = (
    ("data_wait", F.SDK_DATA_WAIT_SHARE),
    ("checkpoint", F.SDK_CHECKPOINT_SHARE),
    ("communication", F.SDK_COMMUNICATION_SHARE),
    ("startup", F.SDK_STARTUP_SHARE),
)


def _sdk_features(jv: JobView, ev: Evidence) -> None:
    f = ev.features
    for phase, name in SDK_SHARES:
        if phase in jv.shares:
            f[name] = jv.shares[phase]
    dw, psi = f.get(F.SDK_DATA_WAIT_SHARE), f.get(F.IO_PRESSURE_RATIO)
    if dw is not None and psi is not None:
        f[F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT] = psi if dw >= DATA_WAIT_SHARE else 0.0
