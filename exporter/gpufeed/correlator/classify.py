"""Classifying one low sample of a unit: its features (node, job and GPU level) and the
rules' decision. Caches per instant what every unit of the node shares (the node's view,
each job's features, who holds which GPU, which GPUs throttle)."""

from __future__ import annotations

import math

from gpufeed.correlator.baseline import Baselines
from gpufeed.correlator.features import FATAL_XIDS, THROTTLE_REASONS, Evidence, job_features
from gpufeed.correlator.node import GpuColumns, NodeSeries
from gpufeed.correlator.rules import decide
from gpufeed.correlator.series import Series
from gpufeed.correlator.state import Mark, Unit
from gpufeed.correlator.view import NodeView, Timing, compute_view

STARTUP_MAX_SECONDS = 1800.0
FRESH_MEMORY_RATIO = 0.1  # below this share of GPU memory, a job's process has not loaded yet
XID_LOOKBACK_SECONDS = 300.0


class Classifier:
    """Per-sample causes for the units of one node."""

    def __init__(
        self, node: NodeSeries, timing: Timing, baselines: Baselines, units: dict[str, Unit]
    ) -> None:
        self.node = node
        self.timing = timing
        self.baselines = baselines
        self.units = units
        self.low_now: set[str] = set()  # GPUs (or unit keys) below the threshold right now
        self.ever_busy: set[tuple[str, str]] = set()  # (job, gpu) seen computing
        self.start: float | None = None  # first instant seen
        self._view_t: float | None = None
        self._view: NodeView | None = None
        self._jobev: dict[str, Evidence] = {}
        self._jobgpus_t: float | None = None
        self._jobgpus: dict[str, list[str]] = {}
        self._gpujob: dict[str, str] = {}
        self._throttle_t: float | None = None
        self._throttle: dict[str, list[str]] = {}

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
        node = self.node
        stale = self.timing.stale_seconds
        b = self.baselines
        job = self.gpu_jobs(t).get(u.gpu, "") if u.cols is not None else u.cpu_job
        if not job and u.cols is not None and node.job_info and not lost and not u.cols.xids:
            # no job holds the GPU: idle unless it failed; the node's signals do not matter
            d = decide({"no_job": 1.0})
            return Mark(t, util, d.cause, "", d.confidence, {"no_job": 1.0}, {})
        view = self.view_at(t)
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
            nv = self.nvlink(g, t)
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
                        1 for x in gpus if x in self.low_now or x == u.gpu
                    ) / len(gpus)
                f["job_not_yet_busy"] = self._not_yet_busy(job, u.gpu, t, u.fresh_at)
        elif job:
            f["job_not_yet_busy"] = self._not_yet_busy(job, "", t)
        d = decide(f)
        m = Mark(t, util, d.cause, job, d.confidence, f, ctx)
        m.lost = lost
        return m

    def _appeared_after(self) -> float:
        start = self.start if self.start is not None else math.inf
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
        if (job, gpu) in self.ever_busy:
            return 0.0
        first = node.first_seen.get((job, gpu))
        if first is None:
            s: Series | None = node.job_info.get((job, gpu))
            if s is None:
                j = node.jobs.get(job)
                s = next(iter(j.phases.values()), None) if j is not None else None
            first = s.first_time() if s is not None else None
        start = self.start
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
