"""The names the correlator's parts share: evidence features and context keys.

Features (numbers) are what the rules score (rules.py), what features.py and classify.py
compute, what a window's evidence lists (state.py) and what its summary phrases
(summary.py); context keys (strings: which tier, which device) travel beside them. Each
name is written once, here; tests/test_correlator_names.py checks that every rule's
feature is one of these, that every feature has a rule and a summary phrase, and that the
engine computes every feature a rule reads.
"""

from __future__ import annotations

from typing import Final


class Feature:
    """Evidence feature names (the keys of a window's `evidence`)."""

    # gpu_error
    GPU_LOST: Final = "gpu_lost"
    XID_FATAL_EVENTS: Final = "xid_fatal_events"
    JOB_PEER_GPU_ERROR: Final = "job_peer_gpu_error"
    # idle
    NO_JOB: Final = "no_job"
    GPU_MEMORY_IDLE: Final = "gpu_memory_idle"
    # seconds the job's counters (steps, phases, tier I/O) have stood still after it had
    # stepped, while its processes live; 0 while within a few of its steps (progress.py)
    JOB_STOPPED_SECONDS: Final = "job_stopped_seconds"
    # a rank of the job here exited without closing it (gpufeed_job_rank_lost 1: killed,
    # crashed) and none of its processes lives: the job was brought down here (issue 13)
    JOB_RANK_LOST: Final = "job_rank_lost"
    # straggler: the job's ranks here failed (exited with an error, none lives) while they
    # waited in a collective: a peer brought the job down (gloo: "Connection reset by peer")
    JOB_FAILED_IN_COLLECTIVE: Final = "job_failed_in_collective"
    # startup
    JOB_NOT_YET_BUSY: Final = "job_not_yet_busy"
    SDK_STARTUP_SHARE: Final = "sdk_startup_share"
    # what a job that has not stepped yet reads (its model load where it reports one, else
    # its busiest tier), and the bytes of that load (describe)
    STARTUP_READ_BYTES_PER_SECOND: Final = "startup_read_bytes_per_second"
    STARTUP_LOAD_BYTES: Final = "startup_load_bytes"
    # throttling
    CLOCK_EVENTS_ACTIVE: Final = "clock_events_active"
    JOB_PEER_CLOCK_EVENTS_ACTIVE: Final = "job_peer_clock_events_active"
    SM_CLOCK_DROP_RATIO: Final = "sm_clock_drop_ratio"
    # checkpointing
    WRITE_BURST_X_BASELINE: Final = "write_burst_x_baseline"
    JOB_CHECKPOINT_WRITE_BYTES_PER_SECOND: Final = "job_checkpoint_write_bytes_per_second"
    SDK_CHECKPOINT_SHARE: Final = "sdk_checkpoint_share"
    JOB_GPUS_STALLED_RATIO: Final = "job_gpus_stalled_ratio"
    # data_loading (the data tier's own features first)
    DATA_TIER_READ_LATENCY_X_BASELINE: Final = "data_tier_read_latency_x_baseline"
    DATA_TIER_BUSY_RATIO: Final = "data_tier_busy_ratio"
    DATA_TIER_QUEUE_X_BASELINE: Final = "data_tier_queue_x_baseline"
    DATA_TIER_READ_PEAK_RATIO: Final = "data_tier_read_peak_ratio"
    # an object-storage tier refusing requests as too many (503 SlowDown, 429): the job's
    # client backs off and retries, so the time shows as data wait, not as request latency
    DATA_TIER_THROTTLED_RATIO: Final = "data_tier_throttled_ratio"
    # the share of the data tier's reads that are not the job's (another tenant reading
    # the same device), counted only above its healthy median
    DATA_TIER_FOREIGN_READ_SHARE: Final = "data_tier_foreign_read_share"
    IO_PRESSURE_RATIO: Final = "io_pressure_ratio"
    IOWAIT_RATIO: Final = "iowait_ratio"
    SDK_DATA_WAIT_SHARE: Final = "sdk_data_wait_share"
    IO_PRESSURE_WHILE_WAITING_FOR_INPUT: Final = "io_pressure_while_waiting_for_input"
    # the job's page cache: its hit ratio, told when it fell well below its healthy level,
    # and the share of its open files on the data tier that reclaim evicted (describe only)
    JOB_CACHE_HIT_RATIO: Final = "job_cache_hit_ratio"
    JOB_CACHE_EVICTED_RATIO: Final = "job_cache_evicted_ratio"
    # the data tier's read latency over its configured target (tier_targets; describe only)
    TIER_READ_LATENCY_X_TARGET: Final = "tier_read_latency_x_target"
    GDS_READ_LATENCY_SECONDS: Final = "gds_read_latency_seconds"
    GDS_READ_ERRORS_PER_SECOND: Final = "gds_read_errors_per_second"
    # preprocessing
    CPU_BUSY_RATIO: Final = "cpu_busy_ratio"
    CPU_PRESSURE_RATIO: Final = "cpu_pressure_ratio"
    JOB_CPU_THROTTLED_RATIO: Final = "job_cpu_throttled_ratio"  # cgroup cpu.stat periods
    # the share of their runnable time the job's threads waited for a CPU (schedstat; v2:
    # the job cgroup's cpu.pressure), counted only above its healthy median
    JOB_CPU_WAIT_RATIO: Final = "job_cpu_wait_ratio"
    HOST_CPU_IDLE_RATIO: Final = "host_cpu_idle_ratio"  # describes, decides nothing
    # network
    NETWORK_UTILIZATION_RATIO: Final = "network_utilization_ratio"
    NETWORK_TRANSMIT_WAIT_X_BASELINE: Final = "network_transmit_wait_x_baseline"
    NETWORK_THROUGHPUT_DROP_RATIO: Final = "network_throughput_drop_ratio"
    NETWORK_LINK_FLAPS: Final = "network_link_flaps"  # link downs in the last minutes
    NETWORK_LINK_DOWN: Final = "network_link_down"  # a port that is normally up is down
    NETWORK_LINK_ERRORS_PER_SECOND: Final = "network_link_errors_per_second"
    NETWORK_CONGESTION_PACKETS_X_BASELINE: Final = "network_congestion_packets_x_baseline"
    NVLINK_PEAK_RATIO: Final = "nvlink_peak_ratio"
    SDK_COMMUNICATION_SHARE: Final = "sdk_communication_share"
    # the busiest link's utilization while the job's ranks here wait in collectives: they
    # wait for their own link's transfers (a peer's lateness leaves the link idle)
    NETWORK_BUSY_IN_COLLECTIVES_RATIO: Final = "network_busy_in_collectives_ratio"
    # straggler: the job's ranks here wait in collectives (seconds per second per rank,
    # counted 0.15 above its healthy median); the GPU reads busy but its SM activity is
    # far below its own healthy level (a collective kernel spinning for a peer)
    COLLECTIVE_WAIT_RATIO: Final = "collective_wait_ratio"
    # a GPU of a job below the threshold on the whole whose rank shares the job's exposed
    # wait (engine: SHARED_WAIT_SECONDS): the job's ranks' collective wait over that span,
    # over what the threshold allows (1 - threshold); set only where that made it low
    JOB_WAIT_X_ALLOWANCE: Final = "job_collective_wait_x_allowance"
    SM_ACTIVE_DROP_RATIO: Final = "sm_active_drop_ratio"
    # low_demand: the GPU's serving job (an inference server) has had no request waiting
    # in its queue over the last readings (1; 0 while requests wait)
    SERVING_NO_DEMAND: Final = "serving_no_demand"
    # the serving queue beside whatever cause decides (describe only): requests waiting and
    # running, summed over the endpoints of the GPU's serving job
    SERVING_REQUESTS_WAITING: Final = "serving_requests_waiting"
    SERVING_REQUESTS_RUNNING: Final = "serving_requests_running"


class Context:
    """Context keys: strings beside the features (the window's evidence lists them too)."""

    DATA_TIER: Final = "data_tier"
    # a data_loading window whose wait is inside the job's own input pipeline (no node
    # signal explains it): vocabulary.DataSource.INPUT_PIPELINE; absent for storage
    DATA_SOURCE: Final = "data_source"
    CHECKPOINT_TIER: Final = "checkpoint_tier"
    LOAD_TIER: Final = "load_tier"  # the tier a job starting up reads from
    NETWORK_DEVICE: Final = "network_device"
    # a network window's sub-cause (vocabulary.NetworkReason) and the counters that decided
    # it over the window ("link_downed +3, symbol_error +1200 on mlx5_0/1")
    NETWORK_REASON: Final = "network_reason"
    NETWORK_COUNTERS: Final = "network_counters"
    # round trips of the job's TCP connections over a network window (engine/backlog.py)
    FABRIC_LATENCY: Final = "fabric_latency"
    # an idle GPU while GPU jobs pend: fragmentation or stall, and the queue (backlog.py)
    SCHEDULER_BACKLOG: Final = "scheduler_backlog"
    SCHEDULER_QUEUE: Final = "scheduler_queue"
    THROTTLE_REASONS: Final = "throttle_reasons"
    THROTTLED_PEERS: Final = "throttled_peers"
    XIDS: Final = "xids"
    FAILED_PEERS: Final = "failed_peers"
    # the job's ranks here that were lost, and how each ended ("1 (killed by signal 9)")
    LOST_RANKS: Final = "lost_ranks"
    # serving endpoints of the GPU down or stale: its demand is unknown, never low demand
    SERVING_DOWN: Final = "serving_down"
    # what said a GPU that reads busy waits, where its own healthy level could not: the
    # job's busiest GPU now (`job_gpus`), its rank's own collective wait (`rank_wait`), or
    # the device's SMs (`device_peak`: almost none active) (engine._peer_working); the
    # job-level view names whom it waits for
    BUSY_REFERENCE: Final = "busy_reference"


# Features that decide nothing: they describe the situation beside the feature they
# accompany, and a window lists them only where that feature is in its evidence.
# (accompanying feature, the feature it accompanies)
ACCOMPANYING: Final[tuple[tuple[str, str], ...]] = (
    # "throttled by its quota while the host is N% idle": the quota, not the host, is short
    (Feature.HOST_CPU_IDLE_RATIO, Feature.JOB_CPU_THROTTLED_RATIO),
    # "re-reads stopped hitting the page cache": why the data tier is loaded, wherever the
    # storage side of a data stall decides it (not the job's own wait share: that one also
    # decides preprocessing)
    # ... and how far the data tier's latency is over the target its owners set for it,
    # and how GPUDirect Storage reads fare (nvidia-fs)
    *(
        (cache, lead)
        for cache in (
            Feature.JOB_CACHE_HIT_RATIO,
            Feature.JOB_CACHE_EVICTED_RATIO,
            Feature.TIER_READ_LATENCY_X_TARGET,
            Feature.GDS_READ_LATENCY_SECONDS,
            Feature.GDS_READ_ERRORS_PER_SECOND,
        )
        for lead in (
            Feature.DATA_TIER_READ_LATENCY_X_BASELINE,
            Feature.DATA_TIER_BUSY_RATIO,
            Feature.DATA_TIER_QUEUE_X_BASELINE,
            Feature.DATA_TIER_READ_PEAK_RATIO,
            Feature.IO_PRESSURE_RATIO,
            Feature.IOWAIT_RATIO,
            Feature.IO_PRESSURE_WHILE_WAITING_FOR_INPUT,
        )
    ),
    # "loading from the cold tier at 1.0 MB/s": why the start-up takes long
    (Feature.STARTUP_READ_BYTES_PER_SECOND, Feature.JOB_NOT_YET_BUSY),
    (Feature.STARTUP_LOAD_BYTES, Feature.JOB_NOT_YET_BUSY),
)


def _values(namespace: type) -> frozenset[str]:
    return frozenset(v for k, v in vars(namespace).items() if k.isupper())


FEATURES: Final[frozenset[str]] = _values(Feature)
CONTEXT_KEYS: Final[frozenset[str]] = _values(Context)
# The serving queue: carried by a window of any cause on a serving GPU (a stall with
# requests waiting says how many), deciding nothing.
SERVING_DESCRIPTION: Final[tuple[str, ...]] = (
    Feature.SERVING_REQUESTS_WAITING,
    Feature.SERVING_REQUESTS_RUNNING,
)
DESCRIPTIVE_FEATURES: Final[frozenset[str]] = frozenset(
    (*(f for f, _ in ACCOMPANYING), *SERVING_DESCRIPTION)
)
# The job's own account of where its time goes (SDK phase shares): a window of any cause
# states them where they stand out (the job waits for input most of the time).
JOB_WAIT_SHARES: Final[tuple[str, ...]] = (
    Feature.SDK_DATA_WAIT_SHARE,
    Feature.SDK_CHECKPOINT_SHARE,
    Feature.SDK_COMMUNICATION_SHARE,
)
# The job's own CPU starvation: its quota throttling it, its threads waiting for a CPU.
JOB_CPU_FEATURES: Final[frozenset[str]] = frozenset(
    (Feature.JOB_CPU_THROTTLED_RATIO, Feature.JOB_CPU_WAIT_RATIO)
)
# The data tier's own features: the ones that pick which tier feeds a job (features.py).
DATA_TIER_FEATURES: Final[frozenset[str]] = frozenset(
    f for f in FEATURES if f.startswith("data_tier_")
)


class BusyReference:
    """The values of Context.BUSY_REFERENCE: what said a GPU that reads busy waits."""

    JOB_GPUS: Final = "job_gpus"  # SM activity against the job's busiest GPU now
    RANK_WAIT: Final = "rank_wait"  # the share of its time the rank waits in collectives
    DEVICE_PEAK: Final = "device_peak"  # SM activity against all of the device's SMs
