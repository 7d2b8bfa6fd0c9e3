"""The window engine: per unit (GPU, or CPU-only job) underutilization windows with causes.

Feed it a node's columns (`NodeSeries`) and call `step(t)` for each sample instant in
order. Per unit, a run starts at the first sample below the threshold (or a lost GPU;
judged over the job's last step where a step spans several samples: _over_step);
high stretches shorter than the merge gap stay inside it; it becomes an open window once
it has lasted `min_window_seconds` with at least 3/4 of that time low, and closes at the
first high sample that stays high for the merge gap (or for the span it was judged over,
if longer: one high step of a long-step job does not end its window). Every low sample is classified by
the rules; a window splits when another (cause, job) holds for `split_seconds` (twice
that for `unknown`). Baselines learn from healthy buckets only.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpufeed import vocabulary
from gpufeed.correlator.engine.baseline import BUCKET_SECONDS, Baselines, Kind
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.classify import Classifier
from gpufeed.correlator.engine.features import COLLECTIVE_WAIT_RISE, observe_healthy
from gpufeed.correlator.engine.names import BusyReference, Feature
from gpufeed.correlator.engine.node import JobColumns, NodeSeries
from gpufeed.correlator.engine.peers import (
    STARTUP,
    JobPeers,
    cpu_shares,
    cpu_wait_share,
    gpu_collective_wait,
    ranks_collective_wait,
)
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.state import (
    Mark,
    Segment,
    Unit,
    Watch,
    data_source,
    segment_window,
)
from gpufeed.correlator.engine.view import Timing
from gpufeed.correlator.engine.window import Window

CLASSIFY_EVERY_SECONDS = 5.0
JOB_STOPPED_SECONDS = Feature.JOB_STOPPED_SECONDS
LOW_FRACTION_TO_OPEN = 0.75
# A run that has not opened a window keeps its samples (they become the window's evidence
# if it opens); a GPU that flaps, dipping for less than the minimum window and recovering
# for less than the merge gap, would keep them for ever. So a run not yet open looks back
# this far at most (or twice the minimum window, if longer), trimmed every TRIM_SLACK.
RUN_HISTORY_SECONDS = 600.0
RUN_TRIM_SLACK_SECONDS = 60.0
# A busy GPU whose SM activity is below this share of its own healthy median is waiting,
# not working: it counts as underutilized at that share (what it really does).
SM_WAITING_RATIO = 0.6
MIN_SM_ACTIVE_BASELINE = 0.02  # below this, the healthy level itself is noise
# Where no healthy level says a busy GPU waits, the rest of its job at the same instant or
# its rank's own collective wait may (_peer_working); the window's evidence names which
# (Context.BUSY_REFERENCE).
JOB_GPUS_REFERENCE = BusyReference.JOB_GPUS
RANK_WAIT_REFERENCE = BusyReference.RANK_WAIT
DEVICE_PEAK_REFERENCE = BusyReference.DEVICE_PEAK
# A GPU that reads busy while under this share of its SMs is active runs a kernel that
# does next to nothing: a collective spinning for a peer (0.008 on the real H200 run,
# docs/benchmarks.md), never the compute of a training step. Physics needs no healthy
# past and no other GPU: a job whose every GPU spins alike from its first step has no
# busier GPU to be compared with.
DEVICE_IDLE_SM_RATIO = 0.05


# A job judged by its steps as a whole (issue 24): where its GPUs here work below the
# threshold on the whole now (the mean of what each is judged at), and its ranks waited in
# collectives at least 1 - threshold of their time over the last SHARED_WAIT_SECONDS, a
# rank that waited at least SHARED_WAIT_SHARE of their mean there is low even while it
# works: it gates some steps and waits in others (a rotating input imbalance), and the
# job's exposed wait is its too. A rank that gates every step (a slow worker, a slow
# stage) waits only its all-reduce and keeps its own reading.
SHARED_WAIT_SECONDS = 600.0
SHARED_WAIT_SHARE = 0.5

# A GPU is judged over its job's steps where a step is longer than a sample: over the
# fewest whole steps that span this many samples (_over_step); a step longer than
# STEP_MAX_X_MIN_WINDOW minimum windows is judged over that long.
STEP_SAMPLES = 2.0
STEP_MAX_X_MIN_WINDOW = 2.0
# How far back a job's step counter is read for its seconds per step (step_seconds), and
# after how many of those steps without a move the pace is no longer the job's (a step
# runs a little longer than the last one now and then; a restart's start-up far longer).
STEP_LOOKBACK_SECONDS = 600.0
STALE_STEPS = 1.5


def step_seconds(j: JobColumns, t: float, timing: Timing) -> float | None:
    """A job's seconds per step at t, from its step counter here: the time between the
    last two samples at which it moved (within STEP_LOOKBACK_SECONDS), over the steps in
    between: its latest steps, so a job that recovers is judged by its fast steps again at
    once (over the last 10 minutes, a recovered job was judged over its slow steps and its
    windows ended a step late). Moves, not the lookback's start: a step in progress would
    lengthen it. A counter that began at 0 within reach, before its second move, counts
    from its first sample, so a job slow from its first step is judged by that step; not
    where the job reports its start-up phase (its first step begins after it: those
    seconds were no step). None without a step in reach. `gpufeed_job_steps_total` sums
    the steps of every process of the job here, so the count is shared out over its live
    processes (else its ranks here; else one: a shorter step than the truth only judges
    the GPU over less time, as before)."""
    s = j.steps
    if s is None:
        return None
    ts, vs = s.ts, s.vs
    i = s.index_at(t)
    lo = bisect_right(ts, t - STEP_LOOKBACK_SECONDS)
    while i > lo and vs[i - 1] == vs[i]:  # back to the sample at which it last moved
        i -= 1
    if i <= lo:
        return None
    k = i - 1
    while k > lo and vs[k - 1] == vs[k]:  # back to the move before
        k -= 1
    # moves are seen at sample instants only: a step of 9 s read between two adjacent
    # moves 5 s apart read 5 s, then 10 s, flipping the GPU between judged per sample
    # and over its step; it is read over moves STEP_SAMPLES samples apart at least (a
    # step that long already was: read as before)
    while ts[i] - ts[k] < STEP_SAMPLES * timing.interval_seconds and k > lo:
        m = k - 1
        while m > lo and vs[m - 1] == vs[m]:
            m -= 1
        if not (m > lo and vs[m - 1] < vs[m] <= vs[k]):
            break  # no earlier move in reach since the counter (re)started
        k = m
    # k is the move before, or where the counter began (at 0, in reach) or was reset: the
    # start of the first step, which counts only where no start-up phase came before it
    if k > lo and vs[k] >= vs[k - 1]:
        pass  # a step ended at k
    elif (k > lo or (lo == 0 and vs[0] == 0)) and STARTUP not in j.phases:
        pass  # the counter (re)started at k
    else:
        return None
    if vs[i] <= vs[k]:
        return None  # a reset since
    per = step_counters(j, t, timing.stale_seconds)
    done = (vs[i] - vs[k]) / per
    if done < 1.0:
        return None
    # the steps that ended in the last interval alone: d of them fit d - 1 whole steps in
    # it, whatever the pause before (a restart's start-up, a checkpoint): a job that
    # steps fast again is judged by its fast steps at once
    last = (vs[i] - vs[i - 1]) / per
    gap = ts[i] - ts[i - 1]
    fast = gap / (last - 1.0) if last >= 2.0 else math.inf
    step = min((ts[i] - ts[k]) / done, fast)
    # still for one and a half such steps: it does not step at that pace now (stopped,
    # restarting, checkpointing), and what it did before says nothing of how to judge it
    return None if t - ts[i] > STALE_STEPS * step else step


def step_counters(j: JobColumns, t: float, stale_seconds: float) -> float:
    """How many processes' steps `gpufeed_job_steps_total` sums here at t: each process
    (rank) of the job counts its own steps (jobs/aggregate.py), so a step of the job moves
    the counter once per process; its live processes, else its ranks here, else one."""
    procs = j.processes.value_at(t, stale_seconds) if j.processes is not None else None
    return procs if procs is not None and procs >= 1 else float(max(len(j.rank_info), 1))


# Causes of a stretch that waits for a peer (its node cannot say why): a job brought down
# after it is one episode; the job-level join reads such windows as waiting (job/culprit.py).
WAITING_CAUSES = frozenset((Cause.STRAGGLER, Cause.UNKNOWN))


def _stopped_at(marks: list[Mark]) -> float | None:
    """When the job stopped working, from the idle marks that say how long it has stood
    still (`job_stopped_seconds`); None where none says so."""
    times = [
        m.t - v
        for m in marks
        if m.cause is Cause.IDLE and (v := m.features.get(JOB_STOPPED_SECONDS, 0.0)) > 0
    ]
    return min(times) if times else None


@dataclass(frozen=True, slots=True)
class WindowParams:
    threshold_ratio: float = vocabulary.DEFAULT_THRESHOLD_RATIO
    min_window_seconds: float = vocabulary.DEFAULT_MIN_WINDOW_SECONDS
    merge_gap_seconds: float = vocabulary.DEFAULT_MERGE_GAP_SECONDS
    split_seconds: float = vocabulary.DEFAULT_SPLIT_SECONDS


WindowSink = Callable[[Window], None]
OpenKey = tuple[str, str, str, str]  # (gpu, uuid, job_id, cause) of an open window


class NodeCorrelator:
    """Windows for the units of one node."""

    def __init__(
        self,
        node: NodeSeries,
        timing: Timing,
        params: WindowParams | None = None,
        on_window: WindowSink | None = None,
        start_seconds: float | None = None,
        peers: JobPeers | None = None,
    ) -> None:
        self.node = node
        # the job's GPUs and ranks this engine may compare with (its own node by default)
        self.peers = peers if peers is not None else JobPeers.of_node(node)
        self._steps: dict[str, float | None] = {}  # job -> seconds per step at _steps_t
        self._steps_t = -math.inf
        self.timing = timing
        self.p = params or WindowParams()
        self.baselines = Baselines()
        self.windows: list[Window] = []
        self._sink = on_window or self.windows.append
        self.units: dict[str, Unit] = {}
        self._next_bucket = -math.inf
        self.watch = Watch(start_seconds)
        self._classifier = Classifier(node, timing, self.baselines, self.units, self.watch)

    # ---- units -------------------------------------------------------------------------
    def refresh_units(self) -> None:
        """Creates units for GPUs (or CPU-only jobs) that appeared in the columns."""
        node = self.node
        for idx, g in node.gpus.items():
            if idx not in self.units and ("util" in g.fields or "up" in g.fields):
                self.units[idx] = Unit(idx, idx, g.uuid, cols=g)
            elif idx in self.units and not self.units[idx].uuid:
                self.units[idx].uuid = g.uuid
        if not any(u.cols is not None for u in self.units.values()):
            for job_id, j in node.jobs.items():
                key = "job:" + job_id
                if key not in self.units and ("compute" in j.phases or j.processes is not None):
                    self.units[key] = Unit(key, "", "", cpu_job=job_id)

    def timeline(self) -> list[float]:
        """Every instant at which some unit has a utilization (or up) sample."""
        ts: set[float] = set()
        for u in self.units.values():
            for s in self._pace_series(u):
                ts.update(s.ts)
        return sorted(ts)

    def on_timeline(self, t: float) -> bool:
        """Whether t, the newest instant, is one of `timeline`'s: the live feed steps at
        those only, as every other feed does. Stepping at every snapshot, it also stepped
        where the agent's snapshot lacked every unit's series (a CPU-only job's phases
        missing from one sample: the lab's loaded two-node run), so the live engine
        learned a job's usual collective wait one sample sooner than its own trace's
        analysis and the two gave different windows (issue 23)."""
        return any(
            s.ts and s.ts[-1] == t for u in self.units.values() for s in self._pace_series(u)
        )

    def _pace_series(self, u: Unit) -> list[Series]:
        """The series whose samples are a unit's instants: a GPU's utilization and up, a
        CPU-only job's compute phase and process count."""
        if u.cols is not None:
            got = (u.cols.fields.get("util"), u.cols.fields.get("up"))
        else:
            j = self.node.jobs[u.cpu_job]
            got = (j.phases.get("compute"), j.processes)
        return [s for s in got if s is not None]

    def _util(self, u: Unit, t: float) -> tuple[float | None, bool]:
        """(utilization, lost) at t; utilization None when there is no current value."""
        stale = self.timing.stale_seconds
        if u.cols is not None:
            f = u.cols.fields
            s = f.get("util")
            v = None
            fresh = False
            if s is not None:
                i = s.index_at(t)
                if i >= 0 and t - s.ts[i] <= stale:
                    v = s.vs[i]
                    fresh = s.ts[i] == t
            up_s = f.get("up")
            # a carried-forward utilization may belong to a GPU that has just been lost
            if (v is None or not fresh or v < self.p.threshold_ratio) and up_s is not None:
                up = up_s.value_at(t, stale)
                if up is not None and up < 0.5:
                    return 0.0, True
            u.waiting = False
            u.busy_reference = ""
            busy_before, u.read_busy = u.read_busy, v is not None and v >= self.p.threshold_ratio
            if v is not None and v >= self.p.threshold_ratio:
                working = self._working_ratio(u, t)
                if working is not None and working < SM_WAITING_RATIO:
                    u.waiting = True  # busy, but not working: it waits (see below)
                    return working, False
                peer = self._peer_working(u, t, busy_before)
                if peer is not None and peer[0] < self.p.threshold_ratio:
                    u.waiting = True  # busy while the rest of its job works: it waits
                    u.busy_reference = peer[1]
                    return peer[0], False
                if peer is not None:
                    # what it works at, below the threshold or not: judged over its
                    # step (_over_step), a busy-reading sample counts what it works
                    return min(v, peer[0]), False
            return v, False
        return self._cpu_share(u, t), False

    def _cpu_share(self, u: Unit, t: float) -> float | None:
        """A CPU-only job's stand-in for utilization: its compute share of the phase time,
        less the collective wait above its healthy level. A rank waiting in a gloo
        collective for a slow peer waits inside its `compute` phase, so the plain compute
        share of a victim never drops. Only the wait above the job's healthy median share
        (Kind.CPU_JOB_WAIT) is taken off: a healthy job waits some of every step (0.17 of
        it on the lab's two-node run), and taking all of it off would open windows in
        healthy time. Before that baseline exists nothing is taken off.

        A job whose processes are alive (gpufeed_job_processes > 0) but whose phases do not
        move is 0% busy, not absent: it has registered and not stepped yet (loading its
        model: `startup`), or its loop has ended and it holds its devices (`idle`), the
        way NVML reads a GPU whose job has not launched a kernel. Once its processes are
        gone (the agent's grace period) it is absent.

        The start-up phase is left out: the SDK reports it in one piece at the first batch
        (the process's age then), so as a rate it lands in the seconds after the first step,
        when the job is already computing; the time before is the 0% of a job that has not
        stepped yet."""
        share, u.wait_share = self._cpu_share_over(u, t, self.timing.share_window_seconds)
        return share

    def _cpu_share_over(
        self, u: Unit, t: float, window: float
    ) -> tuple[float | None, float | None]:
        """(compute share, collective-wait share) of a CPU-only job over about the last
        `window` seconds before t (one sample interval when `window` is shorter)."""
        j = self.node.jobs[u.cpu_job]
        tm = self.timing
        stale = tm.stale_seconds
        alive = j.processes.value_at(t, stale) if j.processes is not None else None
        if alive is not None and alive <= 0 and j.failed_at(t, stale):
            return 0.0, None  # brought down: at once, not as its rates run out
        shares = cpu_shares(j, t, window, tm)
        comp, total = shares.compute_per_second, shares.phases_per_second
        if comp is None or total <= 1e-9:
            if sum(shares.collective_wait_per_second) > 1e-9:
                # blocked in a collective for a peer that does not arrive (its wait is
                # reported as it grows): its phases stand still, it works not at all
                return 0.0, 1.0
            return self._not_stepping(u, t), None
        wait_share = cpu_wait_share(shares)
        if wait_share is not None:
            base = self._usual_cpu_wait(u.cpu_job, t, window)
            if base is not None and wait_share > base:
                comp = max(comp - (wait_share - base) * total, 0.0)
        return comp / total, wait_share

    def _usual_cpu_wait(self, job: str, t: float, window: float) -> float | None:
        """The collective-wait share a CPU-only job pays in a healthy step: the lower of
        its healthy median here and, where this engine sees several nodes of the job
        (`gpufeed analyze` and `gpufeed fleet`; the live agent sees its own node, and the
        job-level view decides), the least any of them waits at the same instant plus
        COLLECTIVE_WAIT_RISE. A job slow from its first step (issue 24) has no healthy past:
        its first samples look healthy (nothing is taken off yet), and the victim's own
        wait became its median (0.76 on the lab's mn2-slow-from-start). The node that
        waits least arrives last and pays the collective's own cost; the rise is the
        turns healthy nodes take arriving last (their waits 0.13-0.34 on the lab's two
        nodes: taking the difference off opened windows in healthy time). Where the job
        does have a healthy past and a job-wide stall slows every node alike, its median
        is the lower one."""
        usual = self.baselines.median((Kind.CPU_JOB_WAIT, job))
        least = self.peers.least_cpu_wait_share(job, t, window, self.timing)
        if least is None:
            return usual
        peers = least + COLLECTIVE_WAIT_RISE
        return peers if usual is None else min(usual, peers)

    def _not_stepping(self, u: Unit, t: float) -> float | None:
        """The stand-in of a CPU-only job whose phases do not move: 0 while its processes
        live, unless it has stepped and is quiet for less than a few of its steps (in the
        middle of a long one, reported when it ends: not judged); None once they are gone,
        unless a rank of the job here failed (`JobColumns.failed_at`): a job brought down has not
        finished, and it is 0% busy for as long as its series stay (issue 13: the join
        names the lost rank behind it)."""
        j = self.node.jobs[u.cpu_job]
        stale = self.timing.stale_seconds
        alive = j.processes.value_at(t, stale) if j.processes is not None else None
        if alive is None:
            return None
        if alive <= 0:
            return 0.0 if j.failed_at(t, stale) else None
        stopped = self.watch.progress.stopped_for(self.node, self.baselines, u.cpu_job, t, stale)
        stepped = j.steps is not None and bool(j.steps.value_at(t, stale))
        return None if stopped == 0.0 and stepped else 0.0

    def _edge(self, u: Unit, t: float, recovered: bool) -> float:
        """When a CPU-only job really went below the threshold (`recovered` False: t is
        its first low sample) or really came back above it (True: t is its first high
        sample). Its stand-in utilization is a share over the last `share_window_seconds`,
        which crosses the threshold seconds after the job did: measured in the fault lab,
        every window of a CPU job began 2-3 s after its stall and ended 3-6 s after its
        recovery, and those seconds were most of the healthy time inside a window. So the
        edge moves back, at most one share window, to where the job's single sample
        intervals change sides: the instant that leaves the least share on the wrong side
        of the threshold (old-side intervals after it, new-side ones before it). One
        interval is noisy on a loaded host (a healthy job's share over one second ranges
        0.55-0.98 in the lab), so a single interval just on the old side does not hold the
        edge where a stop at the first one would: in the lab an interval at 0.79 held a
        window's end 2 s after the job had recovered. A GPU's utilization is a gauge over
        about the last second: its edges stay where they are."""
        if not u.cpu_job or u.cpu_job not in self.node.jobs:
            return t
        compute = self.node.jobs[u.cpu_job].phases.get("compute")
        if compute is None:  # registered, not stepped yet: no share to look back over
            return t
        ts = compute.ts
        thr = self.p.threshold_ratio
        i = bisect_right(ts, t) - 1
        earliest = t - self.timing.share_window_seconds
        # a recovery is looked for as far back as the share at t reached: the last sample
        # at or before the share window's start (Series.rate_at), which a sample a few ms
        # late puts one interval further back (the busy-disk recording's 5 s TSDB feed: the
        # share over 15 s still read the ended stall, and a recovery looked for from the
        # window's nominal start ended the window 10 s late)
        k = bisect_right(ts, earliest) - 1
        if recovered and k >= 0:
            earliest = ts[k]
        # (start, signed margin x length) of each interval back from t: > 0 on the new side
        spans: list[tuple[float, float]] = []
        while i >= 1 and ts[i - 1] >= earliest:
            share, _ = self._cpu_share_over(u, ts[i], 0.0)  # the interval (ts[i-1], ts[i]]
            side = 0.0 if share is None else (share - thr) * (1.0 if recovered else -1.0)
            spans.append((ts[i - 1], side * (ts[i] - ts[i - 1])))
            i -= 1
        # an edge at t puts every interval before it; each step back moves one after it
        cost = sum(m for _, m in spans if m > 0)
        edge, best = t, cost
        for start, m in spans:
            cost -= m
            if cost < best:
                edge, best = start, cost
        return edge

    def _working_ratio(self, u: Unit, t: float) -> float | None:
        """SM activity (GPM, Hopper and newer) over this GPU's own healthy median. NVML
        utilization reads 1.0 whenever any kernel runs, including a collective kernel that
        spins while it waits for a slow peer; SM activity then falls far below the level
        the job keeps while it computes. Judged against the GPU's own level, so a healthy
        job that never keeps more than a third of its SMs busy is not paged."""
        assert u.cols is not None
        s = u.cols.fields.get("sm_active")
        if s is None:
            return None
        base = self.baselines.median((Kind.SM_ACTIVE, u.gpu))
        if base is None or base < MIN_SM_ACTIVE_BASELINE:
            return None
        sm = s.value_at(t, self.timing.stale_seconds)
        return None if sm is None else min(sm / base, 1.0)

    def _over_step(self, u: Unit, t: float, v: float) -> float:
        """A GPU's utilization judged over its job's last steps where a step is longer
        than a sample: the mean of its samples over the fewest trailing whole steps
        (`step_seconds`) that span STEP_SAMPLES samples, else the sample itself. A window needs 3/4 of its first minute low; a job whose steps
        take 30-60 s works and waits in stretches of tens of seconds, so whether a GPU
        waiting 58% of each 46 s step reached 3/4 low depended on where its first minute
        fell, and one low 61% of the time opened a window while one low 58% never did
        (issue 24). Over a whole step the share it works is the same wherever the step
        begins: a step below the threshold is a low step, for 1 s steps and 60 s alike.
        Samples from before a gap are not averaged in."""
        recent = u.recent
        u.judged_seconds = 0.0
        job = self._classifier.gpu_jobs(t).get(u.gpu, "")
        j = self.node.jobs.get(job) if job else None
        if j is None or j.steps is None:  # no step counter: judged sample by sample
            recent.clear()
            return v
        period = self._step_seconds(job, j, t)
        iv = self.timing.interval_seconds
        if period is not None and period <= iv:  # each sample holds a step or more
            recent.clear()
            return v
        longest = STEP_MAX_X_MIN_WINDOW * self.p.min_window_seconds
        if recent and t - recent[-1][0] > self.timing.gap_seconds:
            recent.clear()
        # kept while the step is not known yet: the first step's samples count once it
        # has ended (a job slow from its first step is judged by that step too)
        recent.append((t, v))
        while recent[0][0] <= t - longest:
            recent.popleft()
        if period is None:
            return v
        # whole steps that span STEP_SAMPLES samples or more: a step between one and two
        # samples long, read sample by sample, beats with the sampling (a victim working
        # 58% of each 8.5 s step read 0.4-1.0 from one 5 s sample to the next, above the
        # threshold in a third of them, and never opened a window)
        span = period * math.ceil(STEP_SAMPLES * iv / period)
        u.judged_seconds = min(span, longest)
        since = t - u.judged_seconds
        got = [x for ts, x in recent if ts > since]
        return sum(got) / len(got)

    def _step_seconds(self, job: str, j: JobColumns, t: float) -> float | None:
        """step_seconds, once per job and instant (every GPU of the job asks)."""
        if self._steps_t != t:
            self._steps_t = t
            self._steps.clear()
        if job not in self._steps:
            self._steps[job] = step_seconds(j, t, self.timing)
        return self._steps[job]

    def _peer_working(self, u: Unit, t: float, busy_before: bool) -> tuple[float, str] | None:
        """How much a GPU that reads busy works, by what needs no healthy past, so a job
        slow from its first step is judged like one that slowed down (issue 24). Two
        readings, the lower one decides, each with the reference it came from:

        - its SM activity over the job's busiest GPU's now (`job_gpus`, engine/peers.py),
          a share below SM_WAITING_RATIO counting as the share it works at (as against
          its own level);
        - its SM activity itself where under DEVICE_IDLE_SM_RATIO of the device's SMs
          (`device_peak`): a kernel that keeps almost no SM busy is not computing, even
          where every GPU of the job spins alike and none is busier;
        - one minus its rank's collective-wait share (`rank_wait`): time the rank spends
          blocked in a collective is time it does no work, whatever NVML's utilization
          says (NCCL's kernel spins) and whatever the job's other ranks do, as a
          compute-only utilization would read it. No allowance is taken off for the
          collective's own cost: what the product calls underutilized is work below the
          threshold, so a healthy job whose exposed communication stays under
          1 - threshold (the all-reduce left after overlap) is not low, and one above it
          is low on NCCL as it already was on gloo. Before, the allowance was the least
          any rank of the job waited at the same instant; in a rotating imbalance every
          rank gates some of a sample's steps, every rank waits alike over the sample,
          and nothing was seen (0.000 of the waiting time in windows at 1 s steps).

        The SM reference counts only the job's own GPUs that this engine is given: the
        live agent sees its node (a culprit on another node leaves every GPU here alike),
        `gpufeed analyze` and `gpufeed fleet` every node of the job. The rank's own wait is
        the same in every feed; the job-level view names whom it waits for."""
        assert u.cols is not None
        job = self._classifier.gpu_jobs(t).get(u.gpu, "")
        if not job:
            return None
        tm = self.timing
        best: tuple[float, str] | None = None
        s = u.cols.fields.get("sm_active")
        busiest = self.peers.busiest_sm_active(job, t, tm) if s is not None else None
        sm = s.value_at(t, tm.stale_seconds) if s is not None else None
        if sm is not None and busiest is not None and busiest >= MIN_SM_ACTIVE_BASELINE:
            ratio = min(sm / busiest, 1.0)
            if ratio < SM_WAITING_RATIO:
                best = (ratio, JOB_GPUS_REFERENCE)
        if sm is not None and sm < DEVICE_IDLE_SM_RATIO and (best is None or sm < best[0]):
            best = (sm, DEVICE_PEAK_REFERENCE)
        # the wait of the interval since the last sample hides in a busy reading only if the
        # GPU read busy at both ends: one that read idle showed its wait itself (gloo), and
        # counting it again held a window one sample past the recovery
        j = self.node.jobs.get(job) if busy_before else None
        mine = gpu_collective_wait(j, u.uuid, t, tm) if j is not None else None
        if mine is not None:
            working = 1.0 - mine
            if best is None or working < best[0]:
                best = (working, RANK_WAIT_REFERENCE)
        return best

    # ---- the main step -------------------------------------------------------------------
    def step(self, t: float) -> None:
        if self.watch.start is None:
            self.watch.start = t
        self.watch.progress.update(self.node, t, self.timing.stale_seconds)
        thr = self.p.threshold_ratio
        low_now = self.watch.low_now
        low_now.clear()
        any_busy = False
        todo: list[tuple[Unit, float, bool, bool]] = []
        judged_now: list[tuple[Unit, float, float, bool]] = []
        for u in self.units.values():
            v, lost = self._util(u, t)
            if v is None:
                self._no_data(u, t)
                continue
            # judged over its job's step; its samples keep what they read (the window's
            # mean utilization is theirs)
            judged = self._over_step(u, t, v) if u.cols is not None and not lost else v
            judged_now.append((u, v, judged, lost))
        below = self._jobs_below(judged_now, t)
        for u, v, judged, lost in judged_now:
            u.shared_wait_x_allowance = None
            if not (lost or judged < thr):
                u.shared_wait_x_allowance = self._shared_job_wait(u, below, t)
            low = lost or judged < thr or u.shared_wait_x_allowance is not None
            learning = self._learn_wait(u)
            if not low:
                any_busy = True
                if u.run_start is None:
                    if u.wait_share is not None and not learning:  # the job's usual wait
                        self.baselines.observe((Kind.CPU_JOB_WAIT, u.cpu_job), u.wait_share)
                    u.prev_t = t
                    self.watch.busy_at[u.gpu or u.key] = t
                    continue
            else:
                low_now.add(u.gpu or u.key)
            todo.append((u, v, low, lost))
        for u, v, low, lost in todo:  # after every unit's state is known (peers matter)
            self._sample(u, t, v, low, lost)
        if t >= self._next_bucket and any_busy and self._healthy():
            self._next_bucket = t + BUCKET_SECONDS
            view = self._classifier.view_at(t)
            observe_healthy(self.baselines, view)
            self._observe_units(t)

    def _jobs_below(self, judged: list[tuple[Unit, float, float, bool]], t: float) -> set[str]:
        """The jobs with two GPUs or more here whose GPUs' judged utilization averages
        below the threshold at t (SHARED_WAIT_SECONDS)."""
        per_job: dict[str, list[float]] = {}
        jobs = self._classifier.gpu_jobs(t)
        for u, _, x, lost in judged:
            job = jobs.get(u.gpu, "") if u.cols is not None and not lost else ""
            if job:
                per_job.setdefault(job, []).append(x)
        thr = self.p.threshold_ratio
        return {j for j, xs in per_job.items() if len(xs) >= 2 and sum(xs) / len(xs) < thr}

    def _shared_job_wait(self, u: Unit, below: set[str], t: float) -> float | None:
        """Where a GPU of a job in `below` shares the job's exposed wait over the long run
        (SHARED_WAIT_SECONDS), and is low then even at an instant it works flat out: the
        job's ranks' wait there over what the threshold allows; else None."""
        if not below or u.cols is None:
            return None
        job = self._classifier.gpu_jobs(t).get(u.gpu, "")
        j = self.node.jobs.get(job) if job in below else None
        if j is None:
            return None
        tm, window = self.timing, SHARED_WAIT_SECONDS
        mine = gpu_collective_wait(j, u.uuid, t, tm, window)
        if mine is None:
            return None
        waits = ranks_collective_wait(j, t, window, tm)
        mean, allowance = sum(waits) / len(waits), 1.0 - self.p.threshold_ratio
        if allowance <= 0.0 or mean < allowance or mine < SHARED_WAIT_SHARE * mean:
            return None
        return round(mean / allowance, 4)

    def _learn_wait(self, u: Unit) -> bool:
        """Until a CPU-only job's usual collective wait is known, learns it from every
        sample in which it steps outside a window (True while learning). Learning only from
        samples above the threshold would pick the samples in which it waits most: its wait
        sits inside its compute share, and before the baseline exists nothing is taken off,
        so the more it waits the busier it looks. Measured in the lab (two nodes, loaded
        host): healthy waits of 0.32-0.66 read 0.63-0.81, so only the fault's own samples
        (waits 0.8-1.0) were learned, as the usual wait 0.93, and the victim of the starved
        node never looked underutilized."""
        if u.wait_share is None:
            return False
        key = (Kind.CPU_JOB_WAIT, u.cpu_job)
        if self.baselines.median(key) is not None:
            return False
        if u.seg is None:
            self.baselines.observe(key, u.wait_share)
        return True

    def _healthy(self) -> bool:
        for u in self.units.values():
            if (u.gpu or u.key) not in self.watch.low_now:
                continue
            if u.seg is not None and u.seg.cause in (Cause.IDLE, Cause.GPU_ERROR):
                continue
            return False
        return True

    def _observe_units(self, t: float) -> None:
        gj = self._classifier.gpu_jobs(t)
        for u in self.units.values():
            if u.cols is None or u.gpu in self.watch.low_now:
                continue
            self._classifier.observe_healthy_gpu(u.cols, t)
            u.busy_mem_ratio = self._classifier.memory_ratio(u.cols, t)
            job = gj.get(u.gpu, "")
            if job:
                self.watch.ever_busy.add((job, u.gpu))

    def _no_data(self, u: Unit, t: float) -> None:
        if (
            u.run_start is not None
            and u.prev_t is not None
            and t - u.prev_t > self.timing.gap_seconds
        ):
            self._finish(u)

    def _sample(self, u: Unit, t: float, util: float, low: bool, lost: bool) -> None:
        p = self.p
        if u.prev_t is not None and t - u.prev_t > self.timing.gap_seconds:
            self._finish(u)  # a hole in the data: never stretch a window across it
        if u.pending is not None:
            u.pending.dt = t - u.pending.t
            self._commit(u, u.pending)
            u.pending = None
        prev, u.prev_t = u.prev_t, t
        if low:
            if u.run_start is None:
                u.run_start = t
                u.run_lead = t - self._edge(u, t, recovered=False)
                u.low_time = 0.0
                u.marks = []
            elif (
                u.seg is None
                and u.high_since is not None
                and (t - u.high_since > u.low_time or self._stale_run(u, t, prev))
            ):
                self._restart_run(u, t)
            elif u.high_since is not None:
                for m in u.blip:  # the recovery did not last: the blip joins the window
                    self._commit_in_run(u, m)
                u.blip = []
                u.high_since = None
            last = u.last_mark
            if last is not None and t - last.t < CLASSIFY_EVERY_SECONDS and last.lost == lost:
                # sampled faster than causes change: reuse the last decision (live at 1 s)
                m = Mark(
                    t, util, last.cause, last.job_id, last.confidence, last.features, last.context
                )
                m.lost = lost
            else:
                m = self._classifier.classify(u, t, util, lost)
                u.last_mark = m
            u.pending = m
            u.last_low_t = t
            if u.seg is None:
                self._bound_run(u, t)
                if self._long_enough(u, t):
                    self._open(u)
            return
        # high sample inside a run
        if u.high_since is None:
            u.high_since = t
        if t - u.high_since >= max(p.merge_gap_seconds, u.judged_seconds):
            self._close(u, self._edge(u, u.high_since, recovered=True))
            self.watch.busy_at[u.gpu or u.key] = t
            if u.cols is not None:
                job = self._classifier.gpu_jobs(t).get(u.gpu, "")
                if job:
                    self.watch.ever_busy.add((job, u.gpu))
            u.prev_t = t
            return
        u.pending = Mark(t, util)

    def _restart_run(self, u: Unit, t: float) -> None:
        """A run that has not opened, low again after a recovery longer than all its low
        time so far: what came before was a dip, not the start of this stall, and the run
        begins again at t. The merge gap is for short recoveries inside a stall; measured
        in the fault lab, one low sample 29 s before CPU hogs bit was merged into their
        run, and the window began 28 s before the fault (17% of the healthy time inside a
        window). A run this rule restarts was low for less than half its time when it
        resumed: the dip only delayed its opening (it needs 3/4 of its time low)."""
        u.run_start = t
        u.run_lead = t - self._edge(u, t, recovered=False)
        u.low_time = 0.0
        u.marks = []
        u.blip = []
        u.high_since = None

    def _bound_run(self, u: Unit, t: float) -> None:
        """Forgets the start of a run that has not opened, so that it looks back at most
        the run history: its low fraction is then that of its recent past."""
        assert u.run_start is not None
        keep = max(RUN_HISTORY_SECONDS, 2.0 * self.p.min_window_seconds)
        if t - u.run_start <= keep + RUN_TRIM_SLACK_SECONDS:
            return
        marks = u.marks
        i = 0
        # drop what is too old, then any high samples at the front: a run starts low
        while i < len(marks) and (marks[i].t < t - keep or marks[i].cause is None):
            i += 1
        del marks[:i]
        u.low_time = sum(m.dt for m in marks if m.cause is not None)
        u.run_start = marks[0].t if marks else t
        u.run_lead = 0.0

    def _commit(self, u: Unit, m: Mark) -> None:
        if m.cause is None:
            u.blip.append(m)  # held back until we know whether the recovery lasts
            return
        self._commit_in_run(u, m)

    def _commit_in_run(self, u: Unit, m: Mark) -> None:
        if m.cause is not None:
            u.low_time += m.dt
        if u.seg is None:
            u.marks.append(m)
        else:
            self._feed(u, m)

    def _open(self, u: Unit) -> None:
        assert u.run_start is not None
        tally: dict[tuple[Cause, str], float] = {}
        marks = [*u.marks]
        if u.pending is not None and u.pending.cause is not None:
            marks.append(u.pending)
        # The job went down inside this run (a failed rank, its processes gone): what came
        # before with a cause of its own (a dip the host's load made) is another episode,
        # too short for a window of its own, and must not lend the brought-down job its
        # cause; a wait for a peer before it (blocked, then failed) is the same episode.
        down_at = next((m.t for m in marks if m.down), None)
        if down_at is not None and all(
            m.cause in WAITING_CAUSES for m in marks if m.t < down_at and m.cause is not None
        ):
            down_at = None
        if down_at is not None:
            marks = [m for m in marks if m.t >= down_at]
            u.marks = [m for m in u.marks if m.t >= down_at]
        for m in marks:
            if m.cause is not None:
                k = (m.cause, m.job_id)
                tally[k] = tally.get(k, 0.0) + max(m.dt, 1e-6)
        known = {k: v for k, v in tally.items() if k[0] is not Cause.UNKNOWN}
        pick = known if known and sum(known.values()) >= 0.34 * sum(tally.values()) else tally
        cause, job = max(pick.items(), key=lambda kv: kv[1])[0]
        start = self._edge(u, u.run_start, recovered=False) if down_at is None else down_at
        stopped = _stopped_at(marks) if cause is Cause.IDLE and down_at is None else None
        if stopped is not None and stopped > start:
            # a job that stopped working is idle from when it stopped: a dip shortly before
            # (merged into this run by the merge gap) was the job still working
            start = stopped
            u.marks = [m for m in u.marks if m.t >= stopped]
        u.seg = Segment(start, cause, job, down=any(m.down for m in marks))
        for m in u.marks:
            self._feed(u, m)
        u.marks = []

    def _feed(self, u: Unit, m: Mark) -> None:
        seg = u.seg
        assert seg is not None
        if m.cause is None:
            (u.chal or seg).add(m)
            return
        if m.down and not seg.down and seg.cause not in WAITING_CAUSES:
            # the job went down: a new episode from here on (see _open)
            if u.chal is not None:
                seg.absorb(u.chal)
                u.chal = None
            self._emit(u, seg, m.t)
            u.seg = Segment(m.t, m.cause, m.job_id, down=True)
            u.seg.add(m)
            return
        if m.cause is seg.cause and m.job_id == seg.job_id:
            if u.chal is not None:
                seg.absorb(u.chal)
                u.chal = None
            seg.add(m)
            return
        chal = u.chal
        if chal is None or chal.cause is not m.cause or chal.job_id != m.job_id:
            if chal is not None:
                seg.absorb(chal)
            chal = u.chal = Segment(m.t, m.cause, m.job_id)
        chal.add(m)
        # A cause that holds as long as a window needs to open is a window of its own: with a
        # minimum window shorter than the split time (the lab's 15 s), a 25 s stall that
        # follows a window of another cause within the merge gap would otherwise never split
        # off, and its victims' `straggler` stayed inside a start-up or input window that
        # the job-level join does not read as waiting.
        split = min(self.p.split_seconds, self.p.min_window_seconds)
        need = split * (2.0 if chal.cause is Cause.UNKNOWN else 1.0)
        if chal.time >= need:
            self._emit(u, seg, chal.start)
            u.seg = chal
            u.chal = None

    def _close(self, u: Unit, end: float) -> None:
        if u.seg is not None:
            if u.chal is not None:
                u.seg.absorb(u.chal)
                u.chal = None
            self._emit(u, u.seg, end)
        self._reset(u)

    def _finish(self, u: Unit) -> None:
        """The data ends (or pauses): close at the last sample we have."""
        if u.pending is not None:
            u.pending.dt = 0.0
            self._commit(u, u.pending)
            u.pending = None
        end = self._end_so_far(u)
        if u.seg is None and u.run_start is not None and self._long_enough(u, end):
            self._open(u)
        self._close(u, end)

    def _stale_run(self, u: Unit, t: float, prev: float | None) -> bool:
        """A low sample after a recovery shorter than the merge gap, in a run that has not
        opened, starts a run of its own where the run so far is not low enough to open
        and the recovery lasted longer than the dip before it. Otherwise a dip long ago
        keeps the run's start back there, and the low fraction over all that healthy time
        keeps the stall that follows from opening (the lab's link fault on a loaded host:
        dips of 1-2 s in the 20 s before a 25 s stall held it shut). A stall that flickers
        (its recoveries shorter than its dips) keeps its run. Only right after a healthy
        sample: a job that goes quiet after its loop (no data until it counts as stopped)
        keeps its run, whose window begins where it stopped."""
        if u.seg is not None or u.high_since is None or u.run_start is None:
            return False
        if prev is None or t - prev > self.timing.stale_seconds:
            return False
        elapsed = t - u.run_start + u.run_lead
        if u.low_time + u.run_lead >= LOW_FRACTION_TO_OPEN * elapsed:
            return False
        dip_start = u.high_since
        for m in reversed(u.marks):  # the low marks just before the recovery
            if m.cause is None:
                break
            dip_start = m.t
        return prev - u.high_since > u.high_since - dip_start

    def _long_enough(self, u: Unit, t: float) -> bool:
        """Whether the run, low at least LOW_FRACTION_TO_OPEN of its time, has lasted the
        minimum window by `t`. A CPU-only job's run is measured from its edge (its first low
        sample shows the stall seconds late, see _edge), where its window will begin: from
        the first low sample its window opened up to a share window later than a GPU's,
        which the live fleet's naming time paid in full (issue 13: 30 s after the onset)."""
        assert u.run_start is not None
        elapsed = t - u.run_start + u.run_lead
        low = u.low_time + u.run_lead
        return elapsed >= self.p.min_window_seconds and low >= LOW_FRACTION_TO_OPEN * elapsed

    def _reset(self, u: Unit) -> None:
        u.run_start = None
        u.run_lead = 0.0
        u.high_since = None
        u.seg = None
        u.chal = None
        u.marks = []
        u.blip = []
        u.pending = None
        u.low_time = 0.0
        u.fatal_xids = set()
        u.fresh_at = None
        u.last_mark = None

    def finish(self) -> None:
        """End of the data: close every run."""
        for u in self.units.values():
            if u.run_start is not None:
                self._finish(u)

    # ---- windows -------------------------------------------------------------------------
    def _emit(self, u: Unit, seg: Segment, end: float) -> None:
        self._sink(segment_window(self.node.instance, u, seg, end, open_=False, node=self.node))

    def _end_so_far(self, u: Unit) -> float:
        """Where a run that stops here ends: at the recovery it is in (not yet held for
        the merge gap), else at its last low sample."""
        if u.high_since is not None:
            return self._edge(u, u.high_since, recovered=True)
        return u.last_low_t

    def open_windows(self) -> list[Window]:
        """The windows open now, each ending where `finish` would close it: the live
        agent logs these when it stops, and they must be the windows its own trace's
        analysis closes at the end of the data (they ended at the last low sample, after
        the recovery the analysis ends them at: 4 s later on a lab run; issue 23)."""
        out = []
        for u in self.units.values():
            if u.seg is not None:
                seg, end = u.seg, self._end_so_far(u)
                if u.chal is not None:  # as `_close` absorbs it: its time is disagreement
                    seg = replace(
                        seg, time=seg.time + u.chal.time, util_time=seg.util_time + u.chal.util_time
                    )
                out.append(
                    segment_window(self.node.instance, u, seg, end, open_=True, node=self.node)
                )
        return out

    # ---- what a live feed needs to know and to forget ---------------------------------------
    def open_window_keys(self) -> frozenset[tuple[str, str, str, float]]:
        """(gpu, uuid, job, start) of every open window: changes when one opens or splits."""
        return frozenset(
            (u.gpu, u.uuid, u.seg.job_id, round(u.seg.start, 3))
            for u in self.units.values()
            if u.seg is not None
        )

    def open_window_seconds(self) -> list[tuple[OpenKey, float]]:
        """Per open window, ((gpu, uuid, job, cause), seconds of it so far): up to its last
        low sample, or to where a challenger that may still split it off began."""
        out = []
        for u in self.units.values():
            seg = u.seg
            if seg is None:
                continue
            end = u.last_low_t if u.chal is None else min(u.last_low_t, u.chal.start)
            out.append(((u.gpu, u.uuid, seg.job_id, seg.cause.value), max(0.0, end - seg.start)))
        return out

    def open_input_pipeline_windows(self) -> set[OpenKey]:
        """The open data_loading windows whose wait is in the job's own input pipeline
        (DataSource.INPUT_PIPELINE): their alert goes to the job's owner, not to storage."""
        return {
            (u.gpu, u.uuid, seg.job_id, seg.cause.value)
            for u in self.units.values()
            if (seg := u.seg) is not None
            and seg.cause is Cause.DATA_LOADING
            and data_source(seg) is vocabulary.DataSource.INPUT_PIPELINE
        }

    def jobs_in_runs(self) -> set[str]:
        """Jobs a window (or its challenger) or a CPU-only job's run still refers to."""
        units = self.units.values()
        busy = {seg.job_id for u in units for seg in (u.seg, u.chal) if seg is not None}
        busy.update(u.cpu_job for u in units if u.cpu_job and u.run_start is not None)
        return busy

    def forget_jobs(self, ended: set[str]) -> None:
        """Drops what the engine keeps per job for jobs that have ended: their baselines,
        CPU-only units and busy marks. The caller drops their series from the node."""
        for job_id in ended:
            self.baselines.forget_prefix((Kind.JOB_READ, job_id))
            self.baselines.forget_prefix((Kind.COLLECTIVE_WAIT, job_id))
            self.baselines.forget_prefix((Kind.JOB_CPU_WAIT, job_id))
            self.baselines.forget_prefix((Kind.JOB_CPU_RUNNABLE, job_id))
            self.baselines.forget_prefix((Kind.FOREIGN_READ, job_id))
            self.baselines.forget_prefix((Kind.CPU_JOB_WAIT, job_id))
            self.baselines.forget_prefix((Kind.JOB_CACHE_HIT, job_id))
            self.baselines.forget_prefix((Kind.STEP_SECONDS, job_id))
            self.watch.progress.forget(job_id)
            self.units.pop("job:" + job_id, None)
            self.watch.busy_at.pop("job:" + job_id, None)
        self.watch.ever_busy = {k for k in self.watch.ever_busy if k[0] not in ended}
