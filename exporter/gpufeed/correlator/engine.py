"""The window engine: per unit (GPU, or CPU-only job) underutilization windows with causes.

Feed it a node's columns (`NodeSeries`) and call `step(t)` for each sample instant in
order. Per unit, a run starts at the first sample below the threshold (or a lost GPU);
high stretches shorter than the merge gap stay inside it; it becomes an open window once
it has lasted `min_window_seconds` with at least 3/4 of that time low, and closes at the
first high sample that stays high for the merge gap. Every low sample is classified by
the rules; a window splits when another (cause, job) holds for `split_seconds` (twice
that for `unknown`). Baselines learn from healthy buckets only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufeed.correlator.baseline import BUCKET_SECONDS, Baselines
from gpufeed.correlator.causes import Cause
from gpufeed.correlator.features import (
    FATAL_XIDS,
    THROTTLE_REASONS,
    Evidence,
    job_features,
    observe_healthy,
)
from gpufeed.correlator.node import GpuColumns, NodeSeries
from gpufeed.correlator.rules import RULES_BY_CAUSE, decide
from gpufeed.correlator.series import Series
from gpufeed.correlator.summary import summarize
from gpufeed.correlator.view import NodeView, Timing, compute_view
from gpufeed.correlator.window import Window

STARTUP_MAX_SECONDS = 1800.0
CLASSIFY_EVERY_SECONDS = 5.0
FRESH_MEMORY_RATIO = 0.1  # below this share of GPU memory, a job's process has not loaded yet
XID_LOOKBACK_SECONDS = 300.0
LOW_FRACTION_TO_OPEN = 0.75


@dataclass(frozen=True, slots=True)
class WindowParams:
    threshold_ratio: float = 0.8
    min_window_seconds: float = 60.0
    merge_gap_seconds: float = 30.0
    split_seconds: float = 30.0


@dataclass(slots=True)
class Mark:
    """One sample of a unit inside a run; `cause` None for a high sample (a merged blip)."""

    t: float
    util: float
    cause: Cause | None = None
    job_id: str = ""
    confidence: float = 0.0
    features: dict[str, float] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)
    dt: float = 0.0
    lost: bool = False


@dataclass(slots=True)
class Segment:
    start: float
    cause: Cause
    job_id: str
    time: float = 0.0
    util_time: float = 0.0
    agree_time: float = 0.0
    conf_time: float = 0.0
    feat_sum: dict[str, float] = field(default_factory=dict)
    feat_time: dict[str, float] = field(default_factory=dict)
    ctx_time: dict[tuple[str, str], float] = field(default_factory=dict)
    last_util: float = 0.0

    def add(self, m: Mark) -> None:
        dt = m.dt
        self.time += dt
        self.util_time += m.util * dt
        self.last_util = m.util
        if m.cause is not self.cause or m.job_id != self.job_id:
            return
        w = dt if dt > 0 else 1e-6  # a last sample still counts as evidence
        self.agree_time += w
        self.conf_time += m.confidence * w
        for r in RULES_BY_CAUSE[self.cause]:
            x = m.features.get(r.feature)
            if x is not None:
                self.feat_sum[r.feature] = self.feat_sum.get(r.feature, 0.0) + x * w
                self.feat_time[r.feature] = self.feat_time.get(r.feature, 0.0) + w
        for kv in m.context.items():
            self.ctx_time[kv] = self.ctx_time.get(kv, 0.0) + w

    def absorb(self, other: Segment) -> None:
        """A challenger that did not last: its time stays here, as disagreement."""
        self.time += other.time
        self.util_time += other.util_time


@dataclass(slots=True)
class Unit:
    key: str
    gpu: str
    uuid: str
    cols: GpuColumns | None = None
    cpu_job: str = ""  # a CPU-only job: its compute share stands in for utilization
    prev_t: float | None = None
    run_start: float | None = None
    high_since: float | None = None
    low_time: float = 0.0
    marks: list[Mark] = field(default_factory=list)
    blip: list[Mark] = field(default_factory=list)
    pending: Mark | None = None
    seg: Segment | None = None
    chal: Segment | None = None
    last_low_t: float = 0.0
    fatal_xids: set[str] = field(default_factory=set)
    fresh_at: float | None = None  # when, in this run, the job's GPU memory was nearly empty
    last_mark: Mark | None = None  # the last classified sample of this run


WindowSink = Callable[[Window], None]


class NodeCorrelator:
    """Windows for the units of one node."""

    def __init__(
        self,
        node: NodeSeries,
        timing: Timing,
        params: WindowParams | None = None,
        on_window: WindowSink | None = None,
        start_seconds: float | None = None,
    ) -> None:
        self.node = node
        self.timing = timing
        self.p = params or WindowParams()
        self.baselines = Baselines()
        self.windows: list[Window] = []
        self._sink = on_window or self.windows.append
        self.units: dict[str, Unit] = {}
        self._start = start_seconds
        self._next_bucket = -math.inf
        self._ever_busy: set[tuple[str, str]] = set()
        self._view_t: float | None = None
        self._view: NodeView | None = None
        self._jobev: dict[str, Evidence] = {}
        self._jobgpus_t: float | None = None
        self._jobgpus: dict[str, list[str]] = {}
        self._gpujob: dict[str, str] = {}
        self._low_now: set[str] = set()
        self._throttle_t: float | None = None
        self._throttle: dict[str, list[str]] = {}

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
                if key not in self.units and "compute" in j.phases:
                    self.units[key] = Unit(key, "", "", cpu_job=job_id)

    def timeline(self) -> list[float]:
        """Every instant at which some unit has a utilization (or up) sample."""
        ts: set[float] = set()
        for u in self.units.values():
            if u.cols is not None:
                for name in ("util", "up"):
                    s = u.cols.fields.get(name)
                    if s is not None:
                        ts.update(s.ts)
            else:
                ts.update(self.node.jobs[u.cpu_job].phases["compute"].ts)
        return sorted(ts)

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
            return v, False
        phases = self.node.jobs[u.cpu_job].phases
        tm = self.timing
        rates = [
            s.rate_at(t, tm.rate_window_seconds, tm.stale_seconds, tm.gap_seconds)
            for s in phases.values()
        ]
        comp = phases["compute"].rate_at(t, tm.rate_window_seconds, stale, tm.gap_seconds)
        total = sum(r for r in rates if r is not None)
        if comp is None or total <= 1e-9:
            return None, False
        return comp / total, False

    # ---- the main step -------------------------------------------------------------------
    def step(self, t: float) -> None:
        if self._start is None:
            self._start = t
        thr = self.p.threshold_ratio
        low_now = self._low_now
        low_now.clear()
        any_busy = False
        todo: list[tuple[Unit, float, bool, bool]] = []
        for u in self.units.values():
            v, lost = self._util(u, t)
            if v is None:
                self._no_data(u, t)
                continue
            low = lost or v < thr
            if not low:
                any_busy = True
                if u.run_start is None:
                    u.prev_t = t
                    continue
            else:
                low_now.add(u.gpu or u.key)
            todo.append((u, v, low, lost))
        for u, v, low, lost in todo:  # after every unit's state is known (peers matter)
            self._sample(u, t, v, low, lost)
        if t >= self._next_bucket and any_busy and self._healthy():
            self._next_bucket = t + BUCKET_SECONDS
            view = self._view_at(t)
            observe_healthy(self.baselines, view)
            self._observe_units(t)

    def _healthy(self) -> bool:
        for u in self.units.values():
            if (u.gpu or u.key) not in self._low_now:
                continue
            if u.seg is not None and u.seg.cause in (Cause.IDLE, Cause.GPU_ERROR):
                continue
            return False
        return True

    def _observe_units(self, t: float) -> None:
        stale = self.timing.stale_seconds
        gj = self._gpu_jobs(t)
        for u in self.units.values():
            if u.cols is None or u.gpu in self._low_now:
                continue
            clk = u.cols.fields.get("sm_clock")
            if clk is not None:
                self.baselines.observe(("clock", u.gpu), clk.value_at(t, stale))
            nv = self._nvlink(u.cols, t)
            if nv is not None:
                self.baselines.observe(("nvl", u.gpu), nv)
                self.baselines.peak(("nvl", u.gpu), nv)
            job = gj.get(u.gpu, "")
            if job:
                self._ever_busy.add((job, u.gpu))

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
        u.prev_t = t
        if low:
            if u.run_start is None:
                u.run_start = t
                u.low_time = 0.0
                u.marks = []
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
                m = self._classify(u, t, util, lost)
                u.last_mark = m
            u.pending = m
            u.last_low_t = t
            if u.seg is None:
                elapsed = t - u.run_start
                if elapsed >= p.min_window_seconds and u.low_time >= LOW_FRACTION_TO_OPEN * elapsed:
                    self._open(u)
            return
        # high sample inside a run
        if u.high_since is None:
            u.high_since = t
        if t - u.high_since >= p.merge_gap_seconds:
            self._close(u, u.high_since)
            if u.cols is not None:
                job = self._gpu_jobs(t).get(u.gpu, "")
                if job:
                    self._ever_busy.add((job, u.gpu))
            u.prev_t = t
            return
        u.pending = Mark(t, util)

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
        for m in marks:
            if m.cause is not None:
                k = (m.cause, m.job_id)
                tally[k] = tally.get(k, 0.0) + max(m.dt, 1e-6)
        known = {k: v for k, v in tally.items() if k[0] is not Cause.UNKNOWN}
        pick = known if known and sum(known.values()) >= 0.34 * sum(tally.values()) else tally
        cause, job = max(pick.items(), key=lambda kv: kv[1])[0]
        u.seg = Segment(u.run_start, cause, job)
        for m in u.marks:
            self._feed(u, m)
        u.marks = []

    def _feed(self, u: Unit, m: Mark) -> None:
        seg = u.seg
        assert seg is not None
        if m.cause is None:
            (u.chal or seg).add(m)
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
        need = self.p.split_seconds * (2.0 if chal.cause is Cause.UNKNOWN else 1.0)
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
        end = u.high_since if u.high_since is not None else u.last_low_t
        if u.seg is None and u.run_start is not None:
            elapsed = end - u.run_start
            if (
                elapsed >= self.p.min_window_seconds
                and u.low_time >= LOW_FRACTION_TO_OPEN * elapsed
            ):
                self._open(u)
        self._close(u, end)

    def _reset(self, u: Unit) -> None:
        u.run_start = None
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
        self._sink(self.segment_window(u, seg, end, open_=False))

    def segment_window(self, u: Unit, seg: Segment, end: float, open_: bool) -> Window:
        cause = seg.cause
        agree = seg.agree_time
        conf = seg.conf_time / agree if agree > 0 else 0.0
        if seg.time > 0:
            conf *= math.sqrt(min(1.0, agree / seg.time))
        mean_util = seg.util_time / seg.time if seg.time > 0 else seg.last_util
        scored: list[tuple[float, str, float]] = []
        for r in RULES_BY_CAUSE[cause]:
            ft = seg.feat_time.get(r.feature)
            if not ft:
                continue
            x = seg.feat_sum[r.feature] / ft
            s = r.strength(x)
            if s > 0:
                scored.append((r.weight * s, r.feature, x))
        scored.sort(reverse=True)
        ev: dict[str, float] = {name: round(x, 4) for _, name, x in scored}
        ctx: dict[str, str] = {}
        best: dict[str, float] = {}
        for (k, v), w in seg.ctx_time.items():
            if w > best.get(k, -1.0):
                best[k] = w
                ctx[k] = v
        relevant = _CONTEXT_FOR.get(cause, ())
        ctx = {k: v for k, v in ctx.items() if k in relevant}
        summary = summarize(cause, u.gpu, seg.job_id, ev, ctx)
        evidence: tuple[tuple[str, float | str], ...] = (*ev.items(), *ctx.items())
        return Window(
            instance=self.node.instance,
            gpu=u.gpu,
            uuid=u.uuid,
            job_id=seg.job_id,
            start_seconds=seg.start,
            end_seconds=max(end, seg.start),
            cause=cause,
            confidence_ratio=round(min(max(conf, 0.0), 1.0), 4),
            mean_utilization_ratio=round(mean_util, 4),
            evidence=evidence,
            summary=summary,
            open=open_,
        )

    def open_windows(self) -> list[Window]:
        out = []
        for u in self.units.values():
            if u.seg is not None:
                out.append(self.segment_window(u, u.seg, u.last_low_t, open_=True))
        return out

    # ---- classification ---------------------------------------------------------------------
    def _view_at(self, t: float) -> NodeView:
        if self._view_t != t or self._view is None:
            self._view = compute_view(self.node, t, self.timing)
            self._view_t = t
            self._jobev = {}
        return self._view

    def _gpu_jobs(self, t: float) -> dict[str, str]:
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

    def _nvlink(self, g: GpuColumns, t: float) -> float | None:
        tm = self.timing
        best = None
        for name in ("nvlink_tx", "nvlink_rx"):
            s = g.fields.get(name)
            if s is not None:
                r = s.rate_at(t, tm.rate_window_seconds, tm.stale_seconds, tm.gap_seconds)
                if r is not None and (best is None or r > best):
                    best = r
        return best

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

    def _classify(self, u: Unit, t: float, util: float, lost: bool) -> Mark:
        node = self.node
        stale = self.timing.stale_seconds
        b = self.baselines
        job = self._gpu_jobs(t).get(u.gpu, "") if u.cols is not None else u.cpu_job
        if not job and u.cols is not None and node.job_info and not lost and not u.cols.xids:
            # no job holds the GPU: idle unless it failed; the node's signals do not matter
            d = decide({"no_job": 1.0})
            return Mark(t, util, d.cause, "", d.confidence, {"no_job": 1.0}, {})
        view = self._view_at(t)
        ev = self._jobev.get(job)
        if ev is None:
            ev = self._jobev[job] = Evidence()
            job_features(b, view, job, ev)
        f = dict(ev.features)
        ctx = dict(ev.context)
        if u.cols is not None:
            g = u.cols
            f["gpu_lost"] = 1.0 if lost else 0.0
            if g.xids:
                n = 0.0
                for x, s in g.xids.items():
                    if x in FATAL_XIDS:
                        inc = _increase(s, t, XID_LOOKBACK_SECONDS, self._appeared_after())
                        if inc > 0:
                            n += inc
                            u.fatal_xids.add(x)
                # a fatal XID explains the stall for the rest of this run
                f["xid_fatal_events"] = max(n, float(len(u.fatal_xids)))
                if u.fatal_xids:
                    ctx["xids"] = ",".join(sorted(u.fatal_xids))
            mem_ratio = None
            used, total = g.fields.get("mem_used"), g.fields.get("mem_total")
            if used is not None and total is not None:
                uv, tv = used.value_at(t, stale), total.value_at(t, stale)
                if uv is not None and tv:
                    mem_ratio = uv / tv
            if node.job_info:
                f["no_job"] = 0.0 if job else 1.0
            elif mem_ratio is not None:
                f["gpu_memory_idle"] = 1.0 if mem_ratio < 0.03 and util < 0.05 else 0.0
            fresh = job and mem_ratio is not None and mem_ratio < FRESH_MEMORY_RATIO
            if fresh and u.fresh_at is None:
                u.fresh_at = t  # the job's process has (next to) nothing on the GPU: a (re)start
            if g.clock_events:
                mine = self._throttled(g, t)
                f["clock_events_active"] = 1.0 if mine else 0.0
                reasons = set(mine)
                if job:
                    peers = []
                    for other in self._jobgpus.get(job, ()):
                        og = node.gpus.get(other)
                        if other != u.gpu and og is not None:
                            th = self._throttled(og, t)
                            if th:
                                peers.append(other)
                                reasons.update(th)
                    f["job_peer_clock_events_active"] = 1.0 if peers else 0.0
                    if peers:
                        ctx["throttled_peers"] = ",".join(peers)
                if reasons:
                    ctx["throttle_reasons"] = ",".join(sorted(reasons))
            clk = g.fields.get("sm_clock")
            base = b.median(("clock", u.gpu))
            if clk is not None and base:
                c = clk.value_at(t, stale)
                if c is not None:
                    f["sm_clock_drop_ratio"] = max(0.0, 1.0 - c / base)
            nv = self._nvlink(g, t)
            if nv is not None:
                peak = b.peak(("nvl", u.gpu), nv)
                nbase = b.median(("nvl", u.gpu))
                if peak and peak > 1e8 and nbase is not None and nv > 1.3 * nbase:
                    f["nvlink_peak_ratio"] = nv / peak
            if job:
                gpus = self._jobgpus.get(job, [])
                failed = [x for x in gpus if x != u.gpu and self._gpu_failed(x, t)]
                f["job_peer_gpu_error"] = 1.0 if failed else 0.0
                if failed:
                    ctx["failed_peers"] = ",".join(failed)
                if gpus:
                    f["job_gpus_stalled_ratio"] = sum(
                        1 for x in gpus if x in self._low_now or x == u.gpu
                    ) / len(gpus)
                f["job_not_yet_busy"] = self._not_yet_busy(job, u.gpu, t, u.fresh_at)
        elif job:
            f["job_not_yet_busy"] = self._not_yet_busy(job, "", t)
        d = decide(f)
        m = Mark(t, util, d.cause, job, d.confidence, f, ctx)
        m.lost = lost
        return m

    def _appeared_after(self) -> float:
        start = self._start if self._start is not None else math.inf
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

    def _not_yet_busy(self, job: str, gpu: str, t: float, fresh_at: float | None = None) -> float:
        node = self.node
        j = node.jobs.get(job)
        # the GPU held (next to) nothing earlier in this run and has not computed since
        if (
            fresh_at is not None
            and t - fresh_at <= STARTUP_MAX_SECONDS
            and (j is None or j.steps is None or _increase(j.steps, t, t - fresh_at) <= 0)
        ):
            return 1.0
        if (job, gpu) in self._ever_busy:
            return 0.0
        first = node.first_seen.get((job, gpu))
        if first is None:
            s: Series | None = node.job_info.get((job, gpu))
            if s is None:
                j = node.jobs.get(job)
                s = next(iter(j.phases.values()), None) if j is not None else None
            first = s.first_time() if s is not None else None
        start = self._start
        if first is None or start is None or first <= start + 2 * self.timing.interval_seconds:
            return 0.0  # the job was already there when we started watching: we cannot tell
        if t - first > STARTUP_MAX_SECONDS:
            return 0.0
        if j is not None and j.steps is not None and _increase(j.steps, t, t - first) > 0:
            return 0.0
        return 1.0


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


_CONTEXT_FOR: dict[Cause, tuple[str, ...]] = {
    Cause.DATA_LOADING: ("data_tier",),
    Cause.CHECKPOINTING: ("checkpoint_tier",),
    Cause.NETWORK: ("network_device",),
    Cause.THROTTLING: ("throttle_reasons", "throttled_peers"),
    Cause.GPU_ERROR: ("xids", "failed_peers"),
}
