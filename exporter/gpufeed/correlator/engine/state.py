"""A unit's run state: its samples (marks), the segment of the open window, and how a
segment becomes a `Window` with evidence, confidence and summary."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpufeed.correlator.engine.backlog import fabric_latency, scheduler_backlog
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import ACCOMPANYING, JOB_WAIT_SHARES, SERVING_DESCRIPTION
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.netreason import deciding_counters, network_reason
from gpufeed.correlator.engine.node import GpuColumns, NodeSeries
from gpufeed.correlator.engine.progress import Progress
from gpufeed.correlator.engine.rules import RULES_BY_CAUSE
from gpufeed.correlator.engine.summary import summarize
from gpufeed.correlator.engine.window import Window
from gpufeed.vocabulary import DataSource

# A share of its time the job reports waiting (for input, a checkpoint, its peers) that
# stands out: every window's evidence and summary state it, whatever the cause.
WAIT_SHARE_STANDS_OUT = 0.3


@dataclass(slots=True)
class Watch:
    """The node-wide state of a run of the engine that classification reads: the engine
    writes it, once per instant, before it classifies anything."""

    start: float | None = None  # the first instant seen (what was there before is unknown)
    low_now: set[str] = field(default_factory=set)  # GPUs (or unit keys) below the threshold
    ever_busy: set[tuple[str, str]] = field(default_factory=set)  # (job, gpu) seen computing
    # GPU -> the last instant it was busy outside a run (or when its run closed): whether a
    # job went on computing after a peer's fault (blips inside a run do not count)
    busy_at: dict[str, float] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)  # when each job last moved


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
    down: bool = False  # its job was brought down here (classify: a failed rank, no process)


@dataclass(slots=True)
class Segment:
    start: float
    cause: Cause
    job_id: str
    down: bool = False  # a brought-down job's episode: never merged with what came before
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
        for name in EVIDENCE_OF[self.cause]:
            x = m.features.get(name)
            if x is not None:
                self.feat_sum[name] = self.feat_sum.get(name, 0.0) + x * w
                self.feat_time[name] = self.feat_time.get(name, 0.0) + w
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
    wait_share: float | None = None  # a CPU-only job's collective-wait share at this sample
    prev_t: float | None = None
    run_start: float | None = None
    # how far before run_start the run really began (a CPU-only job's edge, see
    # NodeCorrelator._edge): that time counts toward the minimum window too
    run_lead: float = 0.0
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
    # the GPU memory share at the last sample the GPU was busy: a (re)start empties memory
    # below it; a job that never needs much memory does not look freshly started forever
    busy_mem_ratio: float | None = None
    last_mark: Mark | None = None  # the last classified sample of this run
    waiting: bool = False  # at the current sample: reads busy, but its SMs are not working
    # what said it waits where its own healthy level did not (engine: _peer_working)
    busy_reference: str = ""
    read_busy: bool = True  # its utilization read busy at the last sample (as far as known)
    # (t, utilization) over the job's last step, where a step spans several samples
    # (engine: _over_step)
    recent: deque[tuple[float, float]] = field(default_factory=deque)
    # the seconds its current sample was judged over (0: the sample alone): a recovery
    # shorter than that is one judged step high and does not end its window
    judged_seconds: float = 0.0
    # at the current sample: low because its job is below the threshold on the whole and it
    # shares the job's wait (engine: SHARED_WAIT_SECONDS): the job's wait over the allowance
    shared_wait_x_allowance: float | None = None


def segment_window(
    instance: str,
    u: Unit,
    seg: Segment,
    end: float,
    open_: bool,
    node: NodeSeries | None = None,
) -> Window:
    """The window a segment stands for, with its evidence averaged over agreeing samples.
    A network window also gets its sub-cause and the counters that moved (from `node`)."""
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
    ev: dict[str, float] = {}
    for _, name, x in scored:
        ev[name] = evidence_value(name, x)
        for extra, lead in ACCOMPANYING:
            ft = seg.feat_time.get(extra)
            if lead == name and ft:
                ev[extra] = evidence_value(extra, seg.feat_sum[extra] / ft)
    for name in SERVING_DESCRIPTION:
        ft = seg.feat_time.get(name)
        if ft:
            ev[name] = evidence_value(name, seg.feat_sum[name] / ft)
    for name in JOB_WAIT_SHARES:
        ft = seg.feat_time.get(name)
        if ft and name not in ev and seg.feat_sum[name] / ft >= WAIT_SHARE_STANDS_OUT:
            ev[name] = evidence_value(name, seg.feat_sum[name] / ft)
    ft = seg.feat_time.get(F.SM_ACTIVE_DROP_RATIO)
    if cause is Cause.UNKNOWN and ft:
        # nothing decided, but a GPU that reads busy while its SMs idle is waiting: say so
        ev[F.SM_ACTIVE_DROP_RATIO] = round(seg.feat_sum[F.SM_ACTIVE_DROP_RATIO] / ft, 4)
    ctx: dict[str, str] = {}
    best: dict[str, float] = {}
    for (k, v), w in seg.ctx_time.items():
        if w > best.get(k, -1.0):
            best[k] = w
            ctx[k] = v
    # a serving endpoint down is why the queue is unknown, whatever the cause
    relevant = (*CONTEXT_FOR.get(cause, ()), Ctx.SERVING_DOWN)
    ctx = {k: v for k, v in ctx.items() if k in relevant}
    if cause is Cause.DATA_LOADING:
        _data_source(seg, ctx)
    reason = ""
    if cause is Cause.NETWORK:
        nr = network_reason(ev)
        reason = nr.value
        ctx[Ctx.NETWORK_REASON] = reason
        if node is not None:
            device = ctx.get(Ctx.NETWORK_DEVICE, "")
            moved = deciding_counters(node, nr, seg.start, end, device)
            if moved:
                ctx[Ctx.NETWORK_COUNTERS] = moved
            latency = fabric_latency(node, seg.start, end)
            if latency:
                ctx[Ctx.FABRIC_LATENCY] = latency
    if cause is Cause.IDLE and node is not None:
        backlog = scheduler_backlog(node, seg.start, end)
        if backlog is not None:
            ctx[Ctx.SCHEDULER_BACKLOG], ctx[Ctx.SCHEDULER_QUEUE] = backlog
    summary = summarize(cause, u.gpu, seg.job_id, ev, ctx)
    evidence: tuple[tuple[str, float | str], ...] = (*ev.items(), *ctx.items())
    return Window(
        instance=instance,
        gpu=u.gpu,
        uuid=u.uuid,
        job_id=seg.job_id,
        start_seconds=seg.start,
        end_seconds=max(end, seg.start),
        cause=cause,
        confidence_ratio=round(min(max(conf, 0.0), 1.0), 3),  # as to_json writes it
        mean_utilization_ratio=round(mean_util, 4),
        evidence=evidence,
        summary=summary,
        open=open_,
        network_reason=reason,
    )


def data_source(seg: Segment) -> DataSource:
    """Where a data_loading segment's wait is: in the job's own input pipeline when its
    samples that said so held at least half of its agreeing time, else storage."""
    own = seg.ctx_time.get((Ctx.DATA_SOURCE, DataSource.INPUT_PIPELINE.value), 0.0)
    return DataSource.INPUT_PIPELINE if own >= 0.5 * seg.agree_time > 0 else DataSource.STORAGE


def _data_source(seg: Segment, ctx: dict[str, str]) -> None:
    """A data_loading window's context: an input-pipeline wait names no tier."""
    if data_source(seg) is DataSource.INPUT_PIPELINE:
        ctx.pop(Ctx.DATA_TIER, None)
        ctx[Ctx.DATA_SOURCE] = DataSource.INPUT_PIPELINE.value
    else:
        ctx.pop(Ctx.DATA_SOURCE, None)


# Byte counts and rates of bytes are whole units in a window's evidence: four decimals of a
# 4e11-byte model load are 16 significant digits, more than a TSDB keeps (VictoriaMetrics
# about 15), and `analyze --prometheus` must give the file analysis' windows byte for byte.
WHOLE_UNIT_FEATURES = frozenset({F.STARTUP_LOAD_BYTES, F.STARTUP_READ_BYTES_PER_SECOND})


def evidence_value(name: str, x: float) -> float:
    return float(round(x)) if name in WHOLE_UNIT_FEATURES else round(x, 4)


# The features a cause's windows average: its rules' features and what accompanies them.
# Nothing decides an `unknown` window, but a GPU that reads busy while its SMs idle is
# waiting for something this node does not show: its window says so (segment_window).
EVIDENCE_OF: dict[Cause, tuple[str, ...]] = {
    c: (
        *(r.feature for r in rules),
        *(extra for extra, lead in ACCOMPANYING if any(r.feature == lead for r in rules)),
        *((F.SM_ACTIVE_DROP_RATIO,) if c is Cause.UNKNOWN else ()),
        *SERVING_DESCRIPTION,
        *(w for w in JOB_WAIT_SHARES if all(r.feature != w for r in rules)),
    )
    for c, rules in RULES_BY_CAUSE.items()
}

CONTEXT_FOR: dict[Cause, tuple[str, ...]] = {
    Cause.DATA_LOADING: (Ctx.DATA_TIER, Ctx.DATA_SOURCE),
    Cause.CHECKPOINTING: (Ctx.CHECKPOINT_TIER,),
    Cause.STARTUP: (Ctx.LOAD_TIER,),
    Cause.NETWORK: (Ctx.NETWORK_DEVICE,),
    Cause.THROTTLING: (Ctx.THROTTLE_REASONS, Ctx.THROTTLED_PEERS),
    Cause.GPU_ERROR: (Ctx.XIDS, Ctx.FAILED_PEERS),
    Cause.IDLE: (Ctx.LOST_RANKS,),
    Cause.STRAGGLER: (Ctx.BUSY_REFERENCE,),
    Cause.UNKNOWN: (Ctx.BUSY_REFERENCE,),
}
