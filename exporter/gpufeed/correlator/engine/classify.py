"""Classifying one low sample of a unit: its features (node, job and GPU level) and the
rules' decision. Caches per instant what every unit of the node shares (the node's view,
each job's features, who holds which GPU, which GPUs throttle)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpufeed.correlator.engine.baseline import Baselines, Kind
from gpufeed.correlator.engine.features import (
    COLLECTIVE_WAIT_RISE,
    FATAL_XIDS,
    THROTTLE_REASONS,
    Evidence,
    job_features,
)
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.node import GpuColumns, JobColumns, NodeSeries
from gpufeed.correlator.engine.rules import decide
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.state import Mark, Unit, Watch
from gpufeed.correlator.engine.view import COLLECTIVE_WAIT, NodeView, Timing, compute_view
from gpufeed.vocabulary import DataSource

STARTUP_MAX_SECONDS = 1800.0
FRESH_MEMORY_RATIO = 0.1  # below this share of GPU memory, a job's process has not loaded yet
RESTART_MEMORY_SHARE = 0.5  # ... and below this share of what it held while it computed
XID_LOOKBACK_SECONDS = 300.0
# A peer's fault (lost, failed, throttled) explains a stall of its job only if the stall
# begins with it: the fault began at most this long before the job's GPUs were last busy
# (or after). A job that went on computing after the fault is not held back by it.
PEER_FAULT_LEAD_SECONDS = 30.0


class Classifier:
    """Per-sample causes for the units of one node."""

    def __init__(
        self,
        node: NodeSeries,
        timing: Timing,
        baselines: Baselines,
        units: dict[str, Unit],
        watch: Watch,
    ) -> None:
        self.node = node
        self.timing = timing
        self.baselines = baselines
        self.units = units
        self.watch = watch  # the engine's; read only here
        self._view_t: float | None = None
        self._view: NodeView | None = None
        self._jobev: dict[str, Evidence] = {}
        self._jobgpus_t: float | None = None
        self._jobgpus: dict[str, list[str]] = {}
        self._gpujob: dict[str, str] = {}
        self._throttle_t: float | None = None
        self._throttle: dict[str, list[str]] = {}
        self._since_t: float | None = None
        self._since: dict[tuple[str, str], bool] = {}
        self._last_busy: dict[str, float] = {}

    def view_at(self, t: float) -> NodeView:
        if self._view_t != t or self._view is None:
            self._view = compute_view(self.node, t, self.timing)
            self._view_t = t
            self._jobev = {}
        return self._view

    def gpu_jobs(self, t: float) -> dict[str, str]:
        """gpu -> job holding it at t (from gpufeed_job_info)."""
        if self._jobgpus_t != t:
            # presence, not a value: job_info counts only in the snapshot that carries it,
            # so a job that ended is gone at once (a whole missed scrape has no step at all)
            stale = 0.5 * self.timing.interval_seconds
            gj: dict[str, str] = {}
            jg: dict[str, list[str]] = {}
            for (job, gpu), s in self.node.job_info.items():
                v = s.value_at(t, stale)
                if v is not None and v > 0 and gpu not in gj:
                    gj[gpu] = job
                    jg.setdefault(job, []).append(gpu)
            self._gpujob, self._jobgpus, self._jobgpus_t = gj, jg, t
        return self._gpujob

    def nvlink(self, g: GpuColumns, t: float) -> float | None:
        tm = self.timing
        best = None
        for name in ("nvlink_tx", "nvlink_rx"):
            s = g.fields.get(name)
            if s is not None:
                r = s.rate_at(t, tm.rate_window_seconds, tm.stale_seconds, tm.gap_seconds)
                if r is not None and (best is None or r > best):
                    best = r
        return best

    def memory_ratio(self, g: GpuColumns, t: float) -> float | None:
        """The share of the GPU's memory in use at t, or None."""
        stale = self.timing.stale_seconds
        used, total = g.fields.get("mem_used"), g.fields.get("mem_total")
        if used is None or total is None:
            return None
        uv, tv = used.value_at(t, stale), total.value_at(t, stale)
        return uv / tv if uv is not None and tv else None

    def observe_healthy_gpu(self, g: GpuColumns, t: float) -> None:
        """Feeds a busy GPU's baselines (its SM clock, its NVLink rate and peak): the ones
        this GPU's evidence is measured against, next to where they are read."""
        for name, kind in (("sm_clock", Kind.SM_CLOCK), ("sm_active", Kind.SM_ACTIVE)):
            s = g.fields.get(name)
            if s is not None:
                self.baselines.observe((kind, g.gpu), s.value_at(t, self.timing.stale_seconds))
        nv = self.nvlink(g, t)
        if nv is not None:
            self.baselines.observe((Kind.NVLINK, g.gpu), nv)
            self.baselines.peak((Kind.NVLINK, g.gpu), nv)

    def _throttled(self, g: GpuColumns, t: float) -> list[str]:
        if self._throttle_t != t:
            self._throttle_t = t
            self._throttle = {}
        got = self._throttle.get(g.gpu)
        if got is None:
            stale = self.timing.stale_seconds
            got = self._throttle[g.gpu] = sorted(
                r
                for r, s in g.clock_events.items()
                if r in THROTTLE_REASONS and (s.value_at(t, stale) or 0.0) >= 0.5
            )
        return got

    def classify(self, u: Unit, t: float, util: float, lost: bool) -> Mark:
        """The rules' decision for one low sample of `u`, with the evidence behind it."""
        job = self.gpu_jobs(t).get(u.gpu, "") if u.cols is not None else u.cpu_job
        if (
            not job
            and u.cols is not None
            and not self._serving_columns("", u.gpu)
            and _began_by(self.node.job_info.values(), t)
            and not lost
            and not _began_by(u.cols.xids.values(), t)
        ):
            # no job holds the GPU: idle unless it failed; the node's signals do not matter
            d = decide({F.NO_JOB: 1.0})
            return Mark(t, util, d.cause, "", d.confidence, {F.NO_JOB: 1.0}, {})
        down = self._brought_down(u, job, t)
        ev = down if down is not None else self.evidence(u, job, t, util, lost)
        d = decide(ev.features)
        m = Mark(t, util, d.cause, job, d.confidence, ev.features, _context(ev, d.input_pipeline))
        m.lost = lost
        m.down = down is not None
        return m

    def _brought_down(self, u: Unit, job: str, t: float) -> Evidence | None:
        """The evidence of a CPU-only job whose processes here are gone after a rank of it
        failed (`JobColumns.failed_at`): the node's signals do not matter any more. A rank
        lost here (killed, crashed) says the job was brought down here (`idle`); a rank
        that exited with an error after a peer's loss says nothing of its own (`unknown`:
        the job-level join names the lost peer). None for any other sample."""
        j = self.node.jobs.get(job) if u.cols is None and job else None
        if j is None or j.processes is None:
            return None
        stale = self.timing.stale_seconds
        alive = j.processes.value_at(t, stale)
        if alive is None or alive > 0 or not j.failed_at(t, stale):
            return None
        ev = Evidence()
        lost = j.lost_ranks_at(t, stale)
        if lost:
            ev.features[F.JOB_RANK_LOST] = 1.0
            ev.context[Ctx.LOST_RANKS] = ", ".join(
                f"{r} ({how})" for r, how in sorted(lost.items())
            )
        elif self._failed_waiting(j, t):
            ev.features[F.JOB_FAILED_IN_COLLECTIVE] = 1.0
        return ev

    def _failed_waiting(self, j: JobColumns, t: float) -> bool:
        """Whether the job's ranks here were blocked in a collective when its last process
        here ended (over the share window before: their wait, reported in flight, grew at
        least half a second per second per rank, faster than their compute): they failed
        waiting for a peer."""
        procs = j.processes
        if procs is None:
            return False
        i = procs.index_at(t)
        while i >= 0 and procs.vs[i] <= 0:
            i -= 1
        if i < 0:
            return False
        end, tm = procs.ts[i], self.timing
        win, stale, gap = tm.share_window_seconds, tm.stale_seconds, tm.gap_seconds
        waits = [s for (_, p), s in j.rank_phases.items() if p == COLLECTIVE_WAIT]
        waited = sum(r for s in waits if (r := s.rate_at(end, win, stale, gap)) is not None)
        compute = j.phases.get("compute")
        worked = compute.rate_at(end, win, stale, gap) if compute is not None else None
        return bool(waits) and waited >= 0.5 * len(waits) and waited > (worked or 0.0)

    # ---- evidence: the node's and the job's (features.py), then this GPU's --------------------
    def evidence(self, u: Unit, job: str, t: float, util: float, lost: bool) -> Evidence:
        """Every feature and context of one sample of `u`: the one path the rules read."""
        ev = self._job_evidence(job, t).copy()
        g = u.cols
        if g is None:
            if job:
                ev.features[F.JOB_NOT_YET_BUSY] = self._not_yet_busy(job, "", t)
                self._progress_evidence(job, t, ev)
            return ev
        ev.features[F.GPU_LOST] = 1.0 if lost else 0.0
        if g.xids:
            self._xid_evidence(u, g, t, ev)
        self._memory_evidence(u, g, job, t, util, ev)
        if g.clock_events:
            self._throttle_evidence(u, g, job, t, ev)
        self._clock_evidence(u, g, t, util, ev)
        self._nvlink_evidence(u, g, t, ev)
        if u.shared_wait_x_allowance is not None:
            ev.features[F.JOB_WAIT_X_ALLOWANCE] = u.shared_wait_x_allowance
        if job:
            self._job_gpus_evidence(u, job, t, ev)
            self._rank_evidence(u, job, ev)
            self._progress_evidence(job, t, ev)
        self._serving_evidence(u.gpu, job, t, ev)
        return ev

    def _serving_columns(self, job: str, gpu: str) -> list[tuple[str, dict[str, Series]]]:
        """(endpoint, columns) of the serving queues of the GPU: its job's endpoints (for
        this GPU or the whole job) and the endpoints the config names for this GPU."""
        return [
            (ep, cols)
            for (j, g, ep), cols in self.node.serving.items()
            if (j and j == job and (not g or g == gpu)) or (not j and g and g == gpu)
        ]

    def _serving_evidence(self, gpu: str, job: str, t: float, ev: Evidence) -> None:
        """An inference server's queue: no request waiting over the last readings at every
        endpoint is low demand (and then neither a start-up nor a stopped job: a server
        waits for requests); requests waiting say how many, whatever the cause. An endpoint
        down or stale over the lookback leaves the demand unknown: never low demand."""
        cols = self._serving_columns(job, gpu)
        if not cols:
            return
        stale, lookback = self.timing.stale_seconds, self.timing.rate_window_seconds
        waiting: float | None = None
        running: float | None = None
        recent = 0.0
        down: list[str] = []
        for ep, c in cols:
            w, up = c.get("waiting"), c.get("up")
            v = w.value_at(t, stale) if w is not None else None
            # up 0 at any reading of the lookback (or no reading): that queue is unknown
            ups = [] if up is None else [up.value_at(t, stale), *_values_since(up, t - lookback, t)]
            if w is None or v is None or any(x is None or x < 0.5 for x in ups):
                down.append(ep)
                continue
            waiting = (waiting or 0.0) + v
            recent = max(recent, v, *_values_since(w, t - lookback, t))
            r = c.get("running")
            rv = r.value_at(t, stale) if r is not None else None
            if rv is not None:
                running = (running or 0.0) + rv
        if down:
            ev.context[Ctx.SERVING_DOWN] = ", ".join(sorted(down))
        if waiting is None:
            return
        ev.features[F.SERVING_REQUESTS_WAITING] = waiting
        if running is not None:
            ev.features[F.SERVING_REQUESTS_RUNNING] = running
        if recent > 0.0:
            ev.features[F.SERVING_NO_DEMAND] = 0.0
        elif not down:  # every endpoint up and empty over the lookback
            ev.features[F.SERVING_NO_DEMAND] = 1.0
            for name in (F.JOB_NOT_YET_BUSY, F.JOB_STOPPED_SECONDS):
                if name in ev.features:
                    ev.features[name] = 0.0

    def _progress_evidence(self, job: str, t: float, ev: Evidence) -> None:
        """Whether the job has stopped working (`idle` while it holds its devices), and,
        for a job starting up, the tier it reads from and how fast (its model load)."""
        stale = self.timing.stale_seconds
        stopped = self.watch.progress.stopped_for(self.node, self.baselines, job, t, stale)
        if stopped is not None:
            ev.features[F.JOB_STOPPED_SECONDS] = stopped
        if ev.features.get(F.JOB_NOT_YET_BUSY, 0.0) < 0.5:
            return
        jv = self.view_at(t).jobs.get(job)
        reads = jv.tier_read_bytes_per_second if jv is not None else {}
        load = self._model_load(job, t)
        if load is not None:
            tier, nbytes, rate = load
            rate = reads.get(tier, rate) if rate is None else rate
            ev.features[F.STARTUP_LOAD_BYTES] = nbytes
        else:  # no load reported: what it reads, from its busiest tier
            rate, tier = max(((r, tr) for tr, r in reads.items()), default=(0.0, ""))
        if tier:
            ev.context[Ctx.LOAD_TIER] = tier
            if rate:
                ev.features[F.STARTUP_READ_BYTES_PER_SECOND] = rate

    def _model_load(self, job: str, t: float) -> tuple[str, float, float | None] | None:
        """(tier, bytes, bytes per second or None) of the job's model load: the one running
        now (its rate: the job's reads from that tier, where accounted), else the loads
        that ended in the start-up bound (bytes over their seconds)."""
        j = self.node.jobs.get(job)
        if j is None:
            return None
        stale = self.timing.stale_seconds
        running = [(s.value_at(t, stale) or 0.0, tier) for tier, s in j.loading_bytes.items()]
        nbytes, tier = max(running, default=(0.0, ""))
        if nbytes > 0:
            return tier, nbytes, None
        best: tuple[float, str, float] | None = None
        for tier, s in j.load_bytes.items():
            secs = j.load_seconds.get(tier)
            b = _increase(s, t, STARTUP_MAX_SECONDS, -math.inf)
            d = _increase(secs, t, STARTUP_MAX_SECONDS, -math.inf) if secs is not None else 0.0
            if b > 0 and (best is None or b > best[0]):
                best = (b, tier, d)
        if best is None:
            return None
        b, tier, d = best
        return tier, b, (b / d if d > 0 else None)

    def _rank_evidence(self, u: Unit, job: str, ev: Evidence) -> None:
        """The collective wait of the rank on this GPU, where a rank names it: a hung rank
        does not wait for its peers, they wait for it."""
        jv = self._view.jobs.get(job) if self._view is not None else None
        mine = jv.gpu_collective_wait_ratio.get(u.uuid) if jv is not None and u.uuid else None
        if mine is not None:
            base = self.baselines.median((Kind.COLLECTIVE_WAIT, job))
            ev.features[F.COLLECTIVE_WAIT_RATIO] = (
                mine if base is None or mine - base >= COLLECTIVE_WAIT_RISE else 0.0
            )

    def _job_evidence(self, job: str, t: float) -> Evidence:
        """Node- and job-level features, computed once per job and instant."""
        view = self.view_at(t)
        ev = self._jobev.get(job)
        if ev is None:
            ev = self._jobev[job] = Evidence()
            job_features(self.baselines, view, job, ev)
        return ev

    def _xid_evidence(self, u: Unit, g: GpuColumns, t: float, ev: Evidence) -> None:
        n = 0.0
        for x, s in g.xids.items():
            if x in FATAL_XIDS:
                inc = _increase(s, t, XID_LOOKBACK_SECONDS, self._appeared_after())
                if inc > 0:
                    n += inc
                    u.fatal_xids.add(x)
        # a fatal XID explains the stall for the rest of this run
        ev.features[F.XID_FATAL_EVENTS] = max(n, float(len(u.fatal_xids)))
        if u.fatal_xids:
            ev.context[Ctx.XIDS] = ",".join(sorted(u.fatal_xids))

    def _memory_evidence(
        self, u: Unit, g: GpuColumns, job: str, t: float, util: float, ev: Evidence
    ) -> None:
        """Whether a job holds the GPU (or, without job data, whether anything is resident
        on it), and whether the job's process has loaded yet."""
        mem_ratio = self.memory_ratio(g, t)
        if _began_by(self.node.job_info.values(), t):
            ev.features[F.NO_JOB] = 0.0 if job else 1.0
        elif mem_ratio is not None:
            ev.features[F.GPU_MEMORY_IDLE] = 1.0 if mem_ratio < 0.03 and util < 0.05 else 0.0
        # (Re)started: memory nearly empty, and well below what it held when it last
        # computed. A job that computes in a few hundred MB of an H200's 143 GB is not
        # "starting" whenever it stalls (seen on a real H200: bench/gpu_busy_waiting.py).
        fresh = (
            job
            and mem_ratio is not None
            and mem_ratio < FRESH_MEMORY_RATIO
            and (u.busy_mem_ratio is None or mem_ratio < RESTART_MEMORY_SHARE * u.busy_mem_ratio)
        )
        if fresh and u.fresh_at is None:
            u.fresh_at = t  # the job's process has (next to) nothing on the GPU: a (re)start

    def _throttle_evidence(self, u: Unit, g: GpuColumns, job: str, t: float, ev: Evidence) -> None:
        """Clock event reasons on this GPU, or on another GPU of its job that it waits for."""
        mine = self._throttled(g, t)
        if mine and not self._fault_is_new(job, u.gpu, "throttle", t):
            mine = []  # slowed for long while busy: not why it stalls now
        ev.features[F.CLOCK_EVENTS_ACTIVE] = 1.0 if mine else 0.0
        reasons = set(mine)
        if job:
            peers = []
            for other in self._jobgpus.get(job, ()):
                og = self.node.gpus.get(other)
                if other != u.gpu and og is not None:
                    th = self._throttled(og, t)
                    if th and self._fault_is_new(job, other, "throttle", t):
                        peers.append(other)
                        reasons.update(th)
            ev.features[F.JOB_PEER_CLOCK_EVENTS_ACTIVE] = 1.0 if peers else 0.0
            if peers:
                ev.context[Ctx.THROTTLED_PEERS] = ",".join(peers)
        if reasons:
            ev.context[Ctx.THROTTLE_REASONS] = ",".join(sorted(reasons))

    def _clock_evidence(self, u: Unit, g: GpuColumns, t: float, util: float, ev: Evidence) -> None:
        """SM clock against this GPU's healthy median; SM activity (GPM) too where the
        GPU reads busy but is waiting (engine: `Unit.waiting`). Where the rest of its job
        at the same instant said so (no healthy level did: `Unit.busy_reference`), the
        drop is against that reference (`util` is what it works at) and the evidence names
        the reference."""
        checks = [("sm_clock", Kind.SM_CLOCK, F.SM_CLOCK_DROP_RATIO)]
        if u.busy_reference:
            ev.features[F.SM_ACTIVE_DROP_RATIO] = max(0.0, 1.0 - util)
            ev.context[Ctx.BUSY_REFERENCE] = u.busy_reference
        elif u.waiting:
            checks.append(("sm_active", Kind.SM_ACTIVE, F.SM_ACTIVE_DROP_RATIO))
        for name, kind, feature in checks:
            s = g.fields.get(name)
            base = self.baselines.median((kind, u.gpu))
            if s is not None and base:
                c = s.value_at(t, self.timing.stale_seconds)
                if c is not None:
                    ev.features[feature] = max(0.0, 1.0 - c / base)

    def _nvlink_evidence(self, u: Unit, g: GpuColumns, t: float, ev: Evidence) -> None:
        nv = self.nvlink(g, t)
        if nv is not None:
            peak = self.baselines.peak((Kind.NVLINK, u.gpu), nv)
            nbase = self.baselines.median((Kind.NVLINK, u.gpu))
            if peak and peak > 1e8 and nbase is not None and nv > 1.3 * nbase:
                ev.features[F.NVLINK_PEAK_RATIO] = nv / peak

    def _job_gpus_evidence(self, u: Unit, job: str, t: float, ev: Evidence) -> None:
        """The job's other GPUs: failed ones it waits for, how many stalled together, and
        whether the job has computed yet."""
        gpus = self._jobgpus.get(job, [])
        failed = [
            x
            for x in gpus
            if x != u.gpu and self._gpu_failed(x, t) and self._fault_is_new(job, x, "fail", t)
        ]
        ev.features[F.JOB_PEER_GPU_ERROR] = 1.0 if failed else 0.0
        if failed:
            ev.context[Ctx.FAILED_PEERS] = ",".join(failed)
        if gpus:
            low_now = self.watch.low_now
            ev.features[F.JOB_GPUS_STALLED_RATIO] = sum(
                1 for x in gpus if x in low_now or x == u.gpu
            ) / len(gpus)
        ev.features[F.JOB_NOT_YET_BUSY] = self._not_yet_busy(job, u.gpu, t, u.fresh_at)

    def _appeared_after(self) -> float:
        start = self.watch.start if self.watch.start is not None else math.inf
        return start + 2 * self.timing.interval_seconds

    def _gpu_failed(self, gpu: str, t: float) -> bool:
        """Lost (gpu_up 0) or inside a run that a fatal XID explains."""
        g = self.node.gpus.get(gpu)
        if g is None:
            return False
        up = g.fields.get("up")
        v = up.value_at(t, self.timing.stale_seconds) if up is not None else None
        if v is not None and v < 0.5:
            return True
        u = self.units.get(gpu)
        return u is not None and bool(u.fatal_xids)

    def _fault_is_new(self, job: str, gpu: str, kind: str, t: float) -> bool:
        """Whether `gpu`'s fault (`kind` "fail" or "throttle", present at t) began at most
        PEER_FAULT_LEAD_SECONDS before the job's sound GPUs (neither throttled nor failed;
        without a job: this one) were last busy: a stall that begins with the fault, or a
        job that has not been busy since. One answer per GPU, kind and instant."""
        if self._since_t != t:
            self._since_t, self._since, self._last_busy = t, {}, {}
        key = (gpu, kind)
        got = self._since.get(key)
        if got is None:
            last = self._job_last_busy(job, t) if job else self.watch.busy_at.get(gpu, -math.inf)
            got = self._since[key] = last == -math.inf or (
                self._fault_onset(gpu, kind, t, last - PEER_FAULT_LEAD_SECONDS)
                >= last - PEER_FAULT_LEAD_SECONDS
            )
        return got

    def _job_last_busy(self, job: str, t: float) -> float:
        """When the job's sound GPUs were last busy (a slowed GPU stays busy while the
        others wait for it, so it does not count); called within one instant's cache."""
        last = self._last_busy.get(job)
        if last is None:
            busy = self.watch.busy_at
            last = self._last_busy[job] = max(
                (
                    busy.get(x, -math.inf)
                    for x in self._jobgpus.get(job, ())
                    if not self._gpu_failed(x, t)
                    and not (x in self.node.gpus and self._throttled(self.node.gpus[x], t))
                ),
                default=-math.inf,
            )
        return last

    def _fault_onset(self, gpu: str, kind: str, t: float, floor: float) -> float:
        """When `gpu`'s present fault began; -inf if it was already there before `floor`
        (the walk back stops there)."""
        g = self.node.gpus.get(gpu)
        if g is None:
            return -math.inf
        if kind == "throttle":
            starts = [
                _stretch_start(s, t, floor)
                for r, s in g.clock_events.items()
                if r in THROTTLE_REASONS
            ]
            return max((x for x in starts if x != math.inf), default=-math.inf)
        up = g.fields.get("up")
        v = up.value_at(t, self.timing.stale_seconds) if up is not None else None
        if up is not None and v is not None and v < 0.5:
            return _stretch_start(up, t, floor, lost=True)
        u = self.units.get(gpu)  # a fatal XID: its GPU's stall began with it
        if u is not None and u.run_start is not None:
            return u.run_start
        return -math.inf

    def _not_yet_busy(self, job: str, gpu: str, t: float, fresh_at: float | None = None) -> float:
        node = self.node
        j = node.jobs.get(job)
        steps = j.steps if j is not None else None
        # the GPU held (next to) nothing earlier in this run and has not computed since
        if (
            fresh_at is not None
            and t - fresh_at <= STARTUP_MAX_SECONDS
            and (steps is None or _increase(steps, t, t - fresh_at) <= 0)
        ):
            return 1.0
        counted = self._steps_say(job, gpu, steps, t)
        if counted is not None:
            return counted
        if (job, gpu) in self.watch.ever_busy:
            return 0.0
        first = self._first_seen(job, gpu)
        start = self.watch.start
        if first is None or start is None or first <= start + 2 * self.timing.interval_seconds:
            return 0.0  # the job was already there when we started watching: we cannot tell
        if t - first > STARTUP_MAX_SECONDS:
            return 0.0
        if steps is not None and _increase(steps, t, t - first) > 0:
            return 0.0  # a counter gone stale at t still says the job stepped
        return 1.0

    def _steps_say(self, job: str, gpu: str, steps: Series | None, t: float) -> float | None:
        """Whether the job is starting up by its own step counter (None without one that
        reads at t). The count is the job's since it started, in every feed alike: a job
        that has made a step is not starting up however little of its past a feed holds
        (a Prometheus range or a fleet cycle that begins mid-run, a trace whose first
        phase series appears late: issue 23, where `analyze` of the agent's own trace said
        `startup` for a job 4,420 steps in). One that has made none is, within the
        start-up bound of the counter's first sample, unless it has computed: its compute
        phase (also counted from its start) has moved or its GPU was seen busy. A first
        step can be long (46 s steps slowed 2.4x by one rank, issue 24): its victims
        computed and wait inside it, they are not loading."""
        if steps is None:
            return None
        n = steps.value_at(t, self.timing.stale_seconds)
        if n is None:
            return None
        if n > 0 or self._has_computed(job, t) or (job, gpu) in self.watch.ever_busy:
            return 0.0
        first_t = steps.first_time()
        return 1.0 if first_t is not None and t - first_t <= STARTUP_MAX_SECONDS else 0.0

    def _has_computed(self, job: str, t: float) -> bool:
        """Whether the job's own compute phase reads above 0 at t (seconds since its start)."""
        j = self.node.jobs.get(job)
        compute = j.phases.get("compute") if j is not None else None
        v = compute.value_at(t, self.timing.stale_seconds) if compute is not None else None
        return v is not None and v > 0

    def _first_seen(self, job: str, gpu: str) -> float | None:
        """When the job (on `gpu`; "" for a CPU-only job) was first seen: as the live feed
        noted it, else the earliest first sample of its series (its job_info for the GPU,
        or any of its phases: which phase a feed routed first is no answer)."""
        node = self.node
        first = node.first_seen.get((job, gpu))
        if first is not None:
            return first
        s: Series | None = node.job_info.get((job, gpu))
        if s is not None:
            return s.first_time()
        j = node.jobs.get(job)
        firsts = [
            x
            for p in (j.phases.values() if j is not None else ())
            if (x := p.first_time()) is not None
        ]
        return min(firsts, default=None)


def _context(ev: Evidence, input_pipeline: bool) -> dict[str, str]:
    """The sample's context; a wait inside the job's own input pipeline names no tier (the
    job reads none that is slow: no node signal explains it) and says where it is."""
    if not input_pipeline:
        return ev.context
    ctx = {k: v for k, v in ev.context.items() if k != Ctx.DATA_TIER}
    ctx[Ctx.DATA_SOURCE] = DataSource.INPUT_PIPELINE.value
    return ctx


def _stretch_start(s: Series, t: float, floor: float, lost: bool = False) -> float:
    """When the stretch of samples up to t that are on (>= 0.5; < 0.5 with `lost`, a
    gpu_up series) began: math.inf if the sample at t is off, -inf if it reaches back
    before `floor` (a stretch on since the data began started at its first sample)."""
    ts, vs = s.ts, s.vs
    i = s.index_at(t)
    start = math.inf
    while i >= 0 and ((vs[i] < 0.5) if lost else (vs[i] >= 0.5)):
        start = ts[i]
        if start < floor:
            return -math.inf
        i -= 1
    return start


def _values_since(s: Series, t0: float, t1: float) -> list[float]:
    i = max(s.index_at(t0), 0)
    return [v for tt, v in zip(s.ts[i:], s.vs[i:], strict=False) if t0 <= tt <= t1]


def _began_by(series: Iterable[Series], t: float) -> bool:
    """Whether any of `series` has a sample at or before `t`. A decision at `t` must not
    depend on a series that only begins later (an XID counter born with its first event,
    the first job on a node): offline the columns hold the whole range, live and streamed
    they end at `t`, and all three must decide alike."""
    return any(s.ts and s.ts[0] <= t for s in series)


def _increase(s: Series, t: float, lookback: float, appeared_after: float = math.inf) -> float:
    """Counter increase over (t - lookback, t]; a series born inside that span after
    `appeared_after` (an XID counter appears with its first event) counts from zero."""
    i = s.index_at(t)
    if i < 0:
        return 0.0
    j = s.index_at(t - lookback)
    inc = 0.0
    if j < 0:
        j = 0
        if s.ts[0] > appeared_after:
            inc = s.vs[0]
    vs = s.vs
    for k in range(j + 1, i + 1):
        d = vs[k] - vs[k - 1]
        inc += d if d >= 0 else vs[k]
    return inc
