"""The one-line, human summary of a window, built from the evidence that decided it."""

from __future__ import annotations

from collections.abc import Mapping

from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import JOB_WAIT_SHARES, SERVING_DESCRIPTION, BusyReference
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.vocabulary import UNATTRIBUTED_TIER, DataSource, NetworkReason

HEADLINES = {
    Cause.DATA_LOADING: "waits for data from storage",
    Cause.PREPROCESSING: "waits for input; the CPUs are saturated",
    Cause.CHECKPOINTING: "is stalled by a checkpoint",
    Cause.NETWORK: "is held back by the network",
    Cause.THROTTLING: "is slowed by clock throttling",
    Cause.STARTUP: "is starting up",
    Cause.IDLE: "is idle",
    Cause.GPU_ERROR: "has failed",
    Cause.STRAGGLER: "waits for a slower peer of its job",
    Cause.LOW_DEMAND: "is idle for lack of requests (low demand)",
    Cause.UNKNOWN: "is underutilized and no signal stands out",
}

# A data_loading window whose wait is in the job's own input pipeline (DataSource).
INPUT_PIPELINE_HEADLINE = (
    "waits for input inside its own input pipeline; no storage, CPU or other node signal "
    "explains the wait"
)


# The headline's words for a network window's sub-cause.
NETWORK_REASON_WORDS = {
    NetworkReason.SATURATED: "link saturated",
    NetworkReason.CONGESTION: "congestion",
    NetworkReason.LINK_ERRORS: "link errors",
    NetworkReason.PEER: "own links fine, waiting for a peer",
}


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _x(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x"


def _duration(x: float) -> str:
    if x >= 1.0:
        return f"{x:.1f} s"
    return f"{x * 1e3:.1f} ms" if x >= 1e-3 else f"{x * 1e6:.0f} us"


def _rate(x: float) -> str:
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if x >= div:
            return f"{x / div:.1f} {unit}"
    return f"{x:.0f} B/s"


def _bytes(x: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= div:
            return f"{x / div:.1f} {unit}"
    return f"{x:.0f} B"


def _headline(cause: Cause, evidence: Mapping[str, float], ctx: Mapping[str, str]) -> str:
    """The cause's headline, naming what the evidence pins down: the data tier a stalled
    job reads from (and that others read it too); a CPU stall that is the job's own CPU
    quota (the host has CPUs to spare) is not "the CPUs are saturated"."""
    if cause is Cause.DATA_LOADING and ctx.get(Ctx.DATA_SOURCE) == DataSource.INPUT_PIPELINE:
        return INPUT_PIPELINE_HEADLINE
    if cause is Cause.DATA_LOADING and ctx.get(Ctx.DATA_TIER):
        # contention is what an SRE acts on first (find the other reader), and its phrase
        # (a supporting feature) would often fall behind the three strongest
        shared = (
            ", shared with another reader" if F.DATA_TIER_FOREIGN_READ_SHARE in evidence else ""
        )
        return f"waits for data from the {ctx[Ctx.DATA_TIER]} tier{shared}"
    if cause is Cause.UNKNOWN and F.SM_ACTIVE_DROP_RATIO in evidence:
        return (
            "reads busy but its SMs are not working; no signal on this node says what it waits for"
        )
    if cause is Cause.PREPROCESSING and F.JOB_CPU_THROTTLED_RATIO in evidence:
        return "waits for input"  # the quota phrase that follows says why
    if cause is Cause.STARTUP and ctx.get(Ctx.LOAD_TIER):
        size = evidence.get(F.STARTUP_LOAD_BYTES)
        rate = evidence.get(F.STARTUP_READ_BYTES_PER_SECOND)
        what = f"loading {_bytes(size)}" if size else "loading"
        at = f" at {_rate(rate)}" if rate else ""
        return f"is starting up, {what} from the {ctx[Ctx.LOAD_TIER]} tier{at}"
    if cause is Cause.IDLE and F.JOB_RANK_LOST in evidence:
        return "runs nothing of its job any more"
    if cause is Cause.IDLE and F.JOB_STOPPED_SECONDS in evidence:
        return "is idle: its job has stopped working but holds its devices"
    return HEADLINES[cause]


# Phrases a more specific one makes redundant: (left out, when this one is there).
# CPU pressure counts the tasks a CPU quota throttles, so beside the quota it says nothing
# about the host's CPUs; "I/O pressure N% while the job waits" already says "I/O pressure N%".
_SUPERSEDED = (
    (F.IO_PRESSURE_RATIO, F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT),
    (F.CPU_PRESSURE_RATIO, F.JOB_CPU_THROTTLED_RATIO),
    (F.CPU_BUSY_RATIO, F.JOB_CPU_THROTTLED_RATIO),
)


_IN_STARTUP_HEADLINE = frozenset({F.STARTUP_LOAD_BYTES, F.STARTUP_READ_BYTES_PER_SECOND})


# what a busy GPU's SM activity was compared with (Context.BUSY_REFERENCE)
SM_REFERENCES = {
    BusyReference.JOB_GPUS: "its job's busiest GPU",
    BusyReference.RANK_WAIT: "what its rank's collective wait leaves",
    BusyReference.DEVICE_PEAK: "the device's SMs (physics: no healthy level needed)",
}


def _sm_reference(ctx: Mapping[str, str]) -> str:
    return SM_REFERENCES.get(ctx.get(Ctx.BUSY_REFERENCE, ""), "its healthy level")


def phrase(name: str, v: float, ctx: Mapping[str, str]) -> str | None:
    """The summary's words for feature `name` at value `v` (None: a name it does not know)."""
    tier = ctx.get(Ctx.DATA_TIER, "data")
    dev = ctx.get(Ctx.NETWORK_DEVICE, "the fabric")
    table = {
        F.DATA_TIER_READ_LATENCY_X_BASELINE: f"{tier} tier read latency {_x(v)} its 1-hour median",
        F.DATA_TIER_BUSY_RATIO: f"{tier} tier {_pct(v)} busy",
        F.DATA_TIER_QUEUE_X_BASELINE: f"{tier} tier queue depth {_x(v)} normal",
        F.DATA_TIER_READ_PEAK_RATIO: f"{tier} tier reads at {_pct(v)} of their peak",
        F.DATA_TIER_THROTTLED_RATIO: f"{tier} tier throttled {_pct(v)} of its requests",
        F.DATA_TIER_FOREIGN_READ_SHARE: f"{_pct(v)} of the {tier} tier's reads are not the job's",
        F.IO_PRESSURE_RATIO: f"I/O pressure {_pct(v)}",
        F.IOWAIT_RATIO: f"iowait {_pct(v)}",
        F.SDK_DATA_WAIT_SHARE: f"job waits for input {_pct(v)} of the time",
        F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT: f"I/O pressure {_pct(v)} while the job waits for input",
        F.TIER_READ_LATENCY_X_TARGET: f"{tier} tier read latency {_x(v)} its target",
        F.GDS_READ_LATENCY_SECONDS: f"GPUDirect Storage reads at {_duration(v)} (nvidia-fs)",
        F.GDS_READ_ERRORS_PER_SECOND: f"{v:.1f} GPUDirect Storage reads failing per second",
        F.JOB_CACHE_HIT_RATIO: (
            f"its re-reads stopped hitting the page cache ({_pct(v)} of its reads served from it)"
        ),
        F.JOB_CACHE_EVICTED_RATIO: (
            f"{_pct(v)} of its open files on the {tier} tier evicted from memory "
            "(the dataset outgrew the page cache)"
        ),
        F.CPU_BUSY_RATIO: f"CPUs {_pct(v)} busy",
        F.CPU_PRESSURE_RATIO: f"CPU pressure {_pct(v)}",
        F.JOB_CPU_THROTTLED_RATIO: (
            f"the job's CPU quota throttled it {_pct(v)} of periods (cgroup cpu.stat)"
        ),
        F.JOB_CPU_WAIT_RATIO: f"the job's threads waited for a CPU {_pct(v)} of the time",
        F.HOST_CPU_IDLE_RATIO: f"host {_pct(v)} idle",
        F.WRITE_BURST_X_BASELINE: _write_burst(v, ctx.get(Ctx.CHECKPOINT_TIER, "?")),
        F.JOB_CHECKPOINT_WRITE_BYTES_PER_SECOND: f"checkpoint writes {_rate(v)}",
        F.SDK_CHECKPOINT_SHARE: f"job in checkpoint {_pct(v)} of the time",
        F.JOB_GPUS_STALLED_RATIO: f"{_pct(v)} of the job's GPUs stalled together",
        F.NETWORK_UTILIZATION_RATIO: f"{dev} at {_pct(v)} of link speed",
        F.NETWORK_BUSY_IN_COLLECTIVES_RATIO: (
            f"{dev} at {_pct(v)} of what it can carry while the ranks wait in collectives"
        ),
        F.NETWORK_TRANSMIT_WAIT_X_BASELINE: f"{dev} transmit-wait {_x(v)} normal",
        F.NETWORK_THROUGHPUT_DROP_RATIO: f"throughput down {_pct(v)}",
        F.NVLINK_PEAK_RATIO: f"NVLink at {_pct(v)} of its peak",
        F.SDK_COMMUNICATION_SHARE: f"job in communication {_pct(v)} of the time",
        F.NETWORK_LINK_FLAPS: f"{dev} went down {v:.0f}x in the last minutes",
        F.NETWORK_LINK_DOWN: f"{dev} is down",
        F.NETWORK_LINK_ERRORS_PER_SECOND: f"{dev} link errors {v:.1f}/s above normal",
        F.NETWORK_CONGESTION_PACKETS_X_BASELINE: f"{dev} ECN/CNP packets {_x(v)} normal",
        F.CLOCK_EVENTS_ACTIVE: f"clock event reasons active ({ctx.get(Ctx.THROTTLE_REASONS, '?')})",
        F.JOB_PEER_CLOCK_EVENTS_ACTIVE: (
            f"waiting for throttled GPU {ctx.get(Ctx.THROTTLED_PEERS, '?')} of the same job"
            f" ({ctx.get(Ctx.THROTTLE_REASONS, '?')})"
        ),
        F.SM_CLOCK_DROP_RATIO: f"SM clock down {_pct(v)}",
        F.JOB_NOT_YET_BUSY: "the job has not computed since it (re)started",
        F.SDK_STARTUP_SHARE: f"job reports start-up {_pct(v)} of the time",
        F.STARTUP_READ_BYTES_PER_SECOND: (
            f"reads {_rate(v)} from the {ctx.get(Ctx.LOAD_TIER, '?')} tier"
        ),
        F.STARTUP_LOAD_BYTES: f"loads {_bytes(v)} of model weights",
        F.JOB_STOPPED_SECONDS: (
            f"no step, phase time or I/O for {v:.0f} s while its processes live"
        ),
        F.JOB_RANK_LOST: (
            f"its rank {ctx.get(Ctx.LOST_RANKS, '?')} here ended without closing the job"
        ),
        F.JOB_FAILED_IN_COLLECTIVE: (
            "its ranks here failed while they waited in a collective (the job was brought down)"
        ),
        F.NO_JOB: "no job holds the GPU",
        F.GPU_MEMORY_IDLE: "nothing is resident on the GPU",
        F.GPU_LOST: "the GPU is lost (gpufeed_gpu_up 0)",
        F.XID_FATAL_EVENTS: f"fatal XID {ctx.get(Ctx.XIDS, '?')}",
        F.COLLECTIVE_WAIT_RATIO: f"its ranks here wait in collectives {_pct(v)} of the time",
        F.JOB_WAIT_X_ALLOWANCE: (
            f"its job's ranks wait in collectives {v:.1f}x what the threshold allows over "
            "the last 10 minutes, this one with them (it gates some steps, waits in others)"
        ),
        F.SM_ACTIVE_DROP_RATIO: f"SM activity {_pct(v)} below {_sm_reference(ctx)}",
        F.JOB_PEER_GPU_ERROR: f"GPU {ctx.get(Ctx.FAILED_PEERS, '?')} of the same job has failed",
        F.SERVING_NO_DEMAND: "no request waiting in its serving queue",
        F.SERVING_REQUESTS_WAITING: f"{_requests(v)} waiting in its serving queue"
        + (
            f" (endpoint {down} down: its queue unknown)"
            if (down := ctx.get(Ctx.SERVING_DOWN))
            else ""
        ),
        F.SERVING_REQUESTS_RUNNING: f"{_requests(v)} running",
    }
    return table.get(name)


def _requests(v: float) -> str:
    return "1 request" if round(v) == 1 else f"{v:.0f} requests"


def _write_burst(v: float, tier: str) -> str:
    if tier == UNATTRIBUTED_TIER:  # no node tier's writes rose with the job's
        return f"the job's writes {_x(v)} normal (no tier's writes rose with them)"
    return f"write burst to the {tier} tier {_x(v)} normal"


def summarize(
    cause: Cause,
    gpu: str,
    job_id: str,
    evidence: Mapping[str, float],
    context: Mapping[str, str],
    limit: int = 3,
) -> str:
    who = f"GPU {gpu}" if gpu else "CPU job"
    if job_id:
        who += f" (job {job_id})"
    superseded = {gone for gone, by in _SUPERSEDED if by in evidence}
    if cause is Cause.STARTUP and context.get(Ctx.LOAD_TIER):
        superseded |= _IN_STARTUP_HEADLINE  # "loading 4.0 GB from the cold tier at ..."
    low = cause is Cause.LOW_DEMAND
    shown = (F.SERVING_REQUESTS_RUNNING,) if low else SERVING_DESCRIPTION
    serving = [
        p for name in shown if name in evidence and (p := phrase(name, evidence[name], context))
    ]
    phrases = [
        p
        for name, v in evidence.items()
        if name not in superseded
        and name not in SERVING_DESCRIPTION
        and (p := phrase(name, v, context))
    ]
    # a stalled inference server's queue first (what its users wait in); an idle one's
    # running requests after its empty queue
    phrases = [*phrases, *serving] if low else [*serving, *phrases]
    line = f"{who} {_headline(cause, evidence, context)}"
    reason = context.get(Ctx.NETWORK_REASON)
    if cause is Cause.NETWORK and reason in NETWORK_REASON_WORDS:
        line += f" ({NETWORK_REASON_WORDS[NetworkReason(reason)]})"
        moved = context.get(Ctx.NETWORK_COUNTERS)
        if moved:
            phrases.insert(0, moved)
        latency = context.get(Ctx.FABRIC_LATENCY)
        if latency:
            phrases.insert(1 if moved else 0, latency)
    backlog = context.get(Ctx.SCHEDULER_BACKLOG)
    if cause is Cause.IDLE and backlog:
        line += f" while GPU jobs wait ({backlog})"
        phrases.insert(0, context.get(Ctx.SCHEDULER_QUEUE, ""))
    shown_phrases = phrases[:limit]
    # the job's own wait shares are always told where the window's evidence has them (they
    # stand out): what the job says of its time is what its owner checks first
    for name in JOB_WAIT_SHARES:
        p = phrase(name, evidence[name], context) if name in evidence else None
        if p and p not in shown_phrases:
            shown_phrases.append(p)
    if shown_phrases:
        line += ": " + ", ".join(shown_phrases)
    return line
