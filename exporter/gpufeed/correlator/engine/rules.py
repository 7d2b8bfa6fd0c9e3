"""The cause rules, as data: (cause, evidence feature, ramp, weight), and how they are scored.

A rule turns one feature into a strength in 0..1 with a linear ramp from `lo` (nothing
unusual) to `hi` (clearly abnormal). A cause's score is the noisy-OR of `weight * strength`
over its rules. Supporting rules (`primary=False`) cannot decide a cause alone: without a
primary rule at half strength the score is capped below the decision threshold. Inhibitions
encode "X is not the reason when Y explains it" (network yields to storage, preprocessing
to storage, everything to a lost GPU). The top cause wins if its score reaches
`DECIDE_SCORE`; otherwise the sample is `unknown`: the correlator never guesses.

Features are computed relative to the node's baselines where one exists (see features.py),
so "latency 6x its healthy median" means the same on NVMe and on NFS.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import DATA_TIER_FEATURES, JOB_CPU_FEATURES
from gpufeed.correlator.engine.names import Feature as F

DECIDE_SCORE = 0.5
SUPPORT_ONLY_CAP = 0.45


@dataclass(frozen=True, slots=True)
class Rule:
    cause: Cause
    feature: str
    lo: float
    hi: float
    weight: float
    primary: bool = True

    def strength(self, x: float) -> float:
        if x <= self.lo:
            return 0.0
        if x >= self.hi:
            return 1.0
        return (x - self.lo) / (self.hi - self.lo)


@dataclass(frozen=True, slots=True)
class Inhibit:
    """`target`'s score is multiplied by (1 - weight * score of `by`), where `by` has
    primary evidence: only by one of `by_features` where that is given; and not where
    `target` has primary evidence of its own from `unless_target` (it outranks `by`)."""

    target: Cause
    by: Cause
    weight: float
    by_features: frozenset[str] = frozenset()
    unless_target: frozenset[str] = frozenset()


C = Cause
RULES: tuple[Rule, ...] = (
    # a lost GPU or a fatal XID
    Rule(C.GPU_ERROR, F.GPU_LOST, 0.5, 1.0, 1.0),
    Rule(C.GPU_ERROR, F.XID_FATAL_EVENTS, 0.5, 1.0, 0.95),
    # another GPU of the same job is lost or failed: the job's collectives stall on it
    Rule(C.GPU_ERROR, F.JOB_PEER_GPU_ERROR, 0.5, 1.0, 0.9),
    # no job holds the GPU (or, without job data, nothing is resident on it)
    Rule(C.IDLE, F.NO_JOB, 0.5, 1.0, 0.95),
    Rule(C.IDLE, F.GPU_MEMORY_IDLE, 0.5, 1.0, 0.85),
    # the job holds its devices but has stopped working: its loop ended, its process lives
    Rule(C.IDLE, F.JOB_STOPPED_SECONDS, 5.0, 10.0, 0.9),
    # a rank here exited without closing the job (killed, crashed): nothing of it runs here
    Rule(C.IDLE, F.JOB_RANK_LOST, 0.5, 1.0, 0.95),
    # a job before its first steps
    Rule(C.STARTUP, F.JOB_NOT_YET_BUSY, 0.5, 1.0, 0.9),
    Rule(C.STARTUP, F.SDK_STARTUP_SHARE, 0.25, 0.55, 0.9),
    # clock event reasons on this GPU, or on a GPU of the same job that the others wait for
    Rule(C.THROTTLING, F.CLOCK_EVENTS_ACTIVE, 0.5, 1.0, 0.9),
    Rule(C.THROTTLING, F.JOB_PEER_CLOCK_EVENTS_ACTIVE, 0.5, 1.0, 0.85),
    Rule(C.THROTTLING, F.SM_CLOCK_DROP_RATIO, 0.15, 0.4, 0.4, primary=False),
    # a write burst, the SDK's checkpoint phase; GPUs of the job stalled together
    Rule(C.CHECKPOINTING, F.WRITE_BURST_X_BASELINE, 3.0, 8.0, 0.85),
    Rule(C.CHECKPOINTING, F.JOB_CHECKPOINT_WRITE_BYTES_PER_SECOND, 1e6, 5e7, 0.85),
    Rule(C.CHECKPOINTING, F.SDK_CHECKPOINT_SHARE, 0.25, 0.55, 0.9),
    Rule(C.CHECKPOINTING, F.JOB_GPUS_STALLED_RATIO, 0.7, 1.0, 0.3, primary=False),
    # the data tier saturated (busy, queue deep) or slow (latency far above normal)
    Rule(C.DATA_LOADING, F.DATA_TIER_READ_LATENCY_X_BASELINE, 2.5, 6.0, 0.9),
    Rule(C.DATA_LOADING, F.DATA_TIER_BUSY_RATIO, 0.85, 0.97, 0.8),
    Rule(C.DATA_LOADING, F.DATA_TIER_QUEUE_X_BASELINE, 3.0, 8.0, 0.8),
    Rule(C.DATA_LOADING, F.DATA_TIER_THROTTLED_RATIO, 0.05, 0.3, 0.85),
    Rule(C.DATA_LOADING, F.DATA_TIER_READ_PEAK_RATIO, 0.85, 0.97, 0.4, primary=False),
    # most of the tier's reads are someone else's: another tenant contends for the device
    Rule(C.DATA_LOADING, F.DATA_TIER_FOREIGN_READ_SHARE, 0.5, 0.9, 0.3, primary=False),
    Rule(C.DATA_LOADING, F.IO_PRESSURE_RATIO, 0.08, 0.35, 0.6, primary=False),
    Rule(C.DATA_LOADING, F.IOWAIT_RATIO, 0.05, 0.2, 0.4, primary=False),
    Rule(C.DATA_LOADING, F.SDK_DATA_WAIT_SHARE, 0.2, 0.5, 0.6, primary=False),
    # the job says it waits for input while the node is stalled on I/O: storage is why,
    # even where the tier's own counters say little (no latency or busy time for it)
    Rule(C.DATA_LOADING, F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT, 0.1, 0.3, 0.75),
    # input is late but storage is fine: the CPUs are saturated ...
    Rule(C.PREPROCESSING, F.CPU_BUSY_RATIO, 0.85, 0.95, 0.85),
    Rule(C.PREPROCESSING, F.CPU_PRESSURE_RATIO, 0.15, 0.45, 0.75),
    # ... or the job's own CPU quota (a Kubernetes limit, a cgroup cpu.max) throttles it
    # while the host has CPUs to spare: the share of quota periods it was throttled in
    Rule(C.PREPROCESSING, F.JOB_CPU_THROTTLED_RATIO, 0.1, 0.4, 0.85),
    # ... or the job's own threads wait for a CPU (a host other work saturates, where host
    # busy time and PSI hardly rise above their already high healthy level)
    Rule(C.PREPROCESSING, F.JOB_CPU_WAIT_RATIO, 0.35, 0.65, 0.85),
    Rule(C.PREPROCESSING, F.SDK_DATA_WAIT_SHARE, 0.2, 0.5, 0.6, primary=False),
    # the fabric saturated (near link speed) or congested (transmit-wait up, throughput down)
    Rule(C.NETWORK, F.NETWORK_UTILIZATION_RATIO, 0.8, 0.93, 0.85),
    # ... which is clear sooner while the ranks here wait in collectives: a link at 85% of
    # what it carries (a token bucket's rate, TCP's gaps between bursts) is the bottleneck
    # they wait on (measured: 80-90% under an 8 Mbit/s tbf in the fault lab)
    Rule(C.NETWORK, F.NETWORK_BUSY_IN_COLLECTIVES_RATIO, 0.7, 0.85, 0.95),
    Rule(C.NETWORK, F.NETWORK_TRANSMIT_WAIT_X_BASELINE, 3.0, 8.0, 0.85),
    Rule(C.NETWORK, F.NETWORK_THROUGHPUT_DROP_RATIO, 0.25, 0.6, 0.4, primary=False),
    Rule(C.NETWORK, F.NVLINK_PEAK_RATIO, 0.9, 0.98, 0.6),
    Rule(C.NETWORK, F.SDK_COMMUNICATION_SHARE, 0.25, 0.55, 0.6, primary=False),
    # the job's ranks here wait in collectives and nothing here explains it: a peer is late
    # (the job-level correlation, correlator/job/, names it); a GPU that reads busy while
    # its SM activity is far below its own healthy level spins in a collective kernel
    Rule(C.STRAGGLER, F.COLLECTIVE_WAIT_RATIO, 0.25, 0.55, 0.9),
    # its job is below the threshold on the whole and its ranks' waits take up what the
    # threshold allows, this one's with them (a rotating imbalance: it gates some steps and
    # waits in the others; the job-level join names the imbalance)
    Rule(C.STRAGGLER, F.JOB_WAIT_X_ALLOWANCE, 0.8, 1.1, 0.9),
    Rule(C.STRAGGLER, F.JOB_FAILED_IN_COLLECTIVE, 0.5, 1.0, 0.9),
    Rule(C.STRAGGLER, F.SM_ACTIVE_DROP_RATIO, 0.5, 0.8, 0.4, primary=False),
    # the link itself: it went down (flapped) in the last minutes, is down now, or counts
    # errors far above its healthy rate
    Rule(C.NETWORK, F.NETWORK_LINK_FLAPS, 0.0, 1.0, 0.85),
    Rule(C.NETWORK, F.NETWORK_LINK_DOWN, 0.5, 1.0, 0.85),
    Rule(C.NETWORK, F.NETWORK_LINK_ERRORS_PER_SECOND, 0.1, 2.0, 0.8),
    # RoCE congestion: ECN marks and CNPs far above their healthy rate
    Rule(C.NETWORK, F.NETWORK_CONGESTION_PACKETS_X_BASELINE, 3.0, 8.0, 0.85),
    # an inference server with no request waiting: the GPU has more capacity than demand
    Rule(C.LOW_DEMAND, F.SERVING_NO_DEMAND, 0.5, 1.0, 0.95),
)

INHIBITS: tuple[Inhibit, ...] = (
    *(Inhibit(c, C.GPU_ERROR, 1.0) for c in Cause if c not in (C.GPU_ERROR, C.UNKNOWN)),
    *(Inhibit(c, C.IDLE, 1.0) for c in Cause if c not in (C.GPU_ERROR, C.IDLE, C.UNKNOWN)),
    Inhibit(C.DATA_LOADING, C.STARTUP, 0.95),
    Inhibit(C.PREPROCESSING, C.STARTUP, 0.95),
    Inhibit(C.NETWORK, C.STARTUP, 0.95),
    Inhibit(C.CHECKPOINTING, C.STARTUP, 0.6),
    Inhibit(C.THROTTLING, C.STARTUP, 0.6),
    Inhibit(C.DATA_LOADING, C.CHECKPOINTING, 0.7),
    Inhibit(C.PREPROCESSING, C.CHECKPOINTING, 0.8),
    Inhibit(C.NETWORK, C.CHECKPOINTING, 0.95),
    Inhibit(C.NETWORK, C.DATA_LOADING, 0.95),
    # storage explains late input, unless the job's own CPU starvation does (its quota
    # throttles it, its threads wait for a CPU): then the tier's latency or the host's I/O
    # is other work's, and the job's starvation decides whatever the host's disks do (issue
    # 23: a quota-starved job on a host busy with installs and tests, named preprocessing
    # for 30% of the fault)
    Inhibit(C.PREPROCESSING, C.DATA_LOADING, 0.9, unless_target=JOB_CPU_FEATURES),
    Inhibit(C.DATA_LOADING, C.PREPROCESSING, 0.9, by_features=JOB_CPU_FEATURES),
    Inhibit(C.NETWORK, C.THROTTLING, 0.9),
    Inhibit(C.DATA_LOADING, C.THROTTLING, 0.4),
    Inhibit(C.PREPROCESSING, C.THROTTLING, 0.4),
    Inhibit(C.NETWORK, C.PREPROCESSING, 0.5),
    Inhibit(C.PREPROCESSING, C.NETWORK, 0.5),
    # waiting for a peer is what is left when this node has no reason of its own
    *(
        Inhibit(C.STRAGGLER, c, 0.95)
        for c in (C.STARTUP, C.CHECKPOINTING, C.DATA_LOADING, C.PREPROCESSING, C.THROTTLING)
    ),
    Inhibit(C.STRAGGLER, C.NETWORK, 0.9),
    # no request waits: nothing is held back, whatever the node's signals say (a busy
    # tier or CPU does not slow requests that are not there); a server still loading its
    # model is starting up
    *(
        Inhibit(c, C.LOW_DEMAND, 0.95)
        for c in (
            C.DATA_LOADING,
            C.PREPROCESSING,
            C.CHECKPOINTING,
            C.NETWORK,
            C.THROTTLING,
            C.STRAGGLER,
        )
    ),
    Inhibit(C.LOW_DEMAND, C.STARTUP, 0.95),
)

# The host's own storage stall, above its healthy median: the job's input may wait on it.
HOST_STORAGE_STALL_FEATURES = frozenset({F.IO_PRESSURE_RATIO, F.IOWAIT_RATIO})

# What is left when no node signal explains a stall: the job says it waits for its input
# most of the time (its SDK / `gpufeed run` data_wait share; strength 0.5 at half the
# time). Its input pipeline is slow for a reason no node counter shows (a remote fetch, a
# lock, a single-threaded decode): `data_loading` with DataSource.INPUT_PIPELINE, no tier.
# Scored only when no primary rule of any cause has any strength (`decide`), nor the host's
# storage stall, so storage, the CPUs, a quota or a start-up, however weak, never lose to it.
INPUT_PIPELINE_RULE = Rule(C.DATA_LOADING, F.SDK_DATA_WAIT_SHARE, 0.2, 0.8, 1.0)

RULES_BY_CAUSE: dict[Cause, tuple[Rule, ...]] = {
    c: tuple(r for r in RULES if r.cause is c) for c in Cause
}
DATA_TIER_RULES = tuple(
    r for r in RULES_BY_CAUSE[C.DATA_LOADING] if r.primary and r.feature in DATA_TIER_FEATURES
)
# The data side's own primary evidence: the tier's, and the node's I/O stall while the
# job waits for input (features.py: what an unsettled run-queue wait does not outrank)
DATA_STALL_RULES = (
    *DATA_TIER_RULES,
    *(
        r
        for r in RULES_BY_CAUSE[C.DATA_LOADING]
        if r.primary and r.feature == F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT
    ),
)
JOB_CPU_RULES = tuple(
    r for r in RULES_BY_CAUSE[C.PREPROCESSING] if r.primary and r.feature in JOB_CPU_FEATURES
)


@dataclass(frozen=True, slots=True)
class Decision:
    cause: Cause
    confidence: float
    scores: tuple[tuple[Cause, float], ...]
    # data_loading decided by INPUT_PIPELINE_RULE: the wait is inside the job's own pipeline
    input_pipeline: bool = False


def raw_scores(features: dict[str, float]) -> tuple[dict[Cause, float], dict[Cause, set[str]]]:
    """Scores per cause, and the causes that have primary evidence (the features of it)."""
    out: dict[Cause, float] = {}
    decided: dict[Cause, set[str]] = {}
    for cause, rules in RULES_BY_CAUSE.items():
        miss = 1.0
        primary: set[str] = set()
        for r in rules:
            x = features.get(r.feature)
            if x is None:
                continue
            s = r.strength(x)
            if s <= 0.0:
                continue
            miss *= 1.0 - r.weight * s
            if r.primary and s >= 0.5:
                primary.add(r.feature)
        score = 1.0 - miss
        if primary:
            decided[cause] = primary
        else:
            score = min(score, SUPPORT_ONLY_CAP)
        if score > 0.0:
            out[cause] = score
    return out, decided


def decide(features: dict[str, float]) -> Decision:
    raw, decided = raw_scores(features)
    final = dict(raw)
    for inh in INHIBITS:
        if _inhibits(inh, decided) and inh.target in final:
            final[inh.target] *= 1.0 - inh.weight * raw[inh.by]
    ranked = sorted(final.items(), key=lambda kv: kv[1], reverse=True)
    if not ranked or ranked[0][1] < DECIDE_SCORE:
        own = _input_pipeline(features, ranked)
        if own is not None:
            return own
        top = ranked[0][1] if ranked else 0.0
        # confidence that nothing stands out: high when no cause came close
        return Decision(C.UNKNOWN, round(1.0 - top, 4), tuple(ranked[:3]))
    cause, top = ranked[0]
    second = ranked[1][1] if len(ranked) > 1 else 0.0
    conf = top * (1.0 - 0.5 * second / top)
    return Decision(cause, conf, tuple(ranked[:3]))


def _inhibits(inh: Inhibit, decided: dict[Cause, set[str]]) -> bool:
    """Whether `inh` applies: only a cause with primary evidence (of the kind it names)
    explains the stall away from another, and not from one whose own evidence outranks it."""
    by = decided.get(inh.by)
    if not by or (inh.by_features and not by & inh.by_features):
        return False
    return not (inh.unless_target and decided.get(inh.target, set()) & inh.unless_target)


def _input_pipeline(
    features: dict[str, float], ranked: list[tuple[Cause, float]]
) -> Decision | None:
    """`data_loading` in the job's own input pipeline, where nothing else decided: the job
    waits for its input most of the time and no primary rule of any cause has any strength
    (no node signal explains the wait even in part), nor the host's storage stall signals
    (HOST_STORAGE_STALL_FEATURES, not primary): a wait they may explain is not told as one
    that "no storage signal explains"."""
    x = features.get(INPUT_PIPELINE_RULE.feature)
    if x is None:
        return None
    score = INPUT_PIPELINE_RULE.weight * INPUT_PIPELINE_RULE.strength(x)
    if score < DECIDE_SCORE:
        return None
    for r in RULES:
        v = features.get(r.feature)
        counts = r.primary or r.feature in HOST_STORAGE_STALL_FEATURES
        if counts and v is not None and r.strength(v) > 0.0:
            return None
    second = max((v for c, v in ranked if c is not INPUT_PIPELINE_RULE.cause), default=0.0)
    conf = score * (1.0 - 0.5 * min(second, score) / score)
    return Decision(C.DATA_LOADING, conf, tuple(ranked[:3]), input_pipeline=True)


def evidence_features(cause: Cause) -> tuple[str, ...]:
    return tuple(r.feature for r in RULES_BY_CAUSE[cause])
