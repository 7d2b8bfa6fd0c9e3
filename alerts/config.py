"""Every selector, threshold and duration the rules use, in one place (the mixin pattern).

The rules in `alerts.rules` are built from a `RulesConfig`; a site that wants other
thresholds builds its own config instead of editing generated YAML. Tests build a copy with
shorter `for:` durations through `RulesConfig.with_for_override`, so the shipped rules are
never edited to make a test fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpufeed import vocabulary
from gpufeed.vocabulary import Cause

RUNBOOK_BASE_URL = "https://github.com/gpufeed/gpufeed/blob/main/docs/runbooks.md"

# What on-call should look at first, per correlator cause (the `cause` label values of the
# metrics contract). The GpuUtilizationLow description picks one of these by template.
# GpuUtilizationLow's words for a data_loading alert with data_source="input_pipeline": the
# wait is in the job's own loader (no node signal explains it), the job owner's to look at.
INPUT_PIPELINE_HINT = (
    "The job waits for its input inside its own input pipeline (data_source: input_pipeline): "
    "no storage, CPU or other node signal explains the wait. Look at the job's loader: a "
    "remote fetch, a lock, a single-threaded decode, too few workers (its data_wait phase)."
)

CAUSE_HINTS: dict[str, str] = {
    Cause.DATA_LOADING.value: (
        "The job waits for its input data: open the Storage tiers dashboard and check the "
        "tier it reads (throughput against its usual level, latency, queue depth) and the "
        "job's data_wait phase."
    ),
    Cause.PREPROCESSING.value: (
        "The job's CPU-side preprocessing cannot keep up: check host CPU use and CPU pressure "
        "on the Node dashboard and the number of data-loader workers; the job's owners decide."
    ),
    Cause.CHECKPOINTING.value: (
        "The job is writing a checkpoint: compare checkpoint durations and bytes on the Job "
        "dashboard with the write throughput and latency of the checkpoint tier."
    ),
    Cause.STRAGGLER.value: (
        "The job waits for a slower peer: the window names the culprit (instance, GPU, rank) "
        "and the culprit's own cause; follow the culprit's node, not this one."
    ),
    Cause.NETWORK.value: (
        "The job waits for collective communication: check fabric throughput against link "
        "speed and transmit-wait on the Node dashboard, on this node and its peers."
    ),
    Cause.THROTTLING.value: (
        "The GPU runs at reduced clocks: check clock event reasons, temperature and power "
        "on the Node dashboard (cooling, power capping)."
    ),
    Cause.STARTUP.value: (
        "The job is still starting (loading the model, compiling): if this lasts, check the "
        "job's startup phase and the tier it loads from."
    ),
    Cause.IDLE.value: (
        "The job holds the GPU but runs nothing on it: check whether the job is hung or "
        "finished without releasing its allocation."
    ),
    Cause.GPU_ERROR.value: (
        "The GPU reported errors: check XIDs and whether the GPU is still up; drain the "
        "node if the XID is fatal."
    ),
    Cause.LOW_DEMAND.value: (
        "An inference server with no request waiting: the GPU waits for demand, nothing "
        "is stalled (this cause does not page); see InferenceIdleNoDemand."
    ),
    Cause.UNKNOWN.value: (
        "No cause is known yet (the correlator has not opened a window, or no evidence "
        "matched): check the Job dashboard's phase breakdown and the Node dashboard."
    ),
}

# The fatal XIDs, shared with the correlator: gpufeed.vocabulary says which and why.
FATAL_XIDS: tuple[str, ...] = vocabulary.FATAL_XIDS

# Clock event reasons that mean heat or power is holding the GPU back (gpufeed.vocabulary
# says why sw_power_cap is left out).
THROTTLE_REASONS: tuple[str, ...] = vocabulary.ALERTING_THROTTLE_REASONS


@dataclass(frozen=True, slots=True)
class RulesConfig:
    # Label matchers (PromQL, without braces) that pick the agents' series out of everything
    # Prometheus scrapes. The compose stack's scrape job is gpufeed; under Kubernetes it is
    # whatever the scrape config names it (alerts/config.example.yml).
    selector: str = 'job="gpufeed"'
    utilization_threshold_ratio: float = vocabulary.DEFAULT_THRESHOLD_RATIO  # the correlator's
    utilization_low_for: str = "10m"
    fatal_xid_lookback: str = "10m"
    gpu_lost_for: str = "1m"
    throttling_for: str = "10m"
    storage_busy_ratio: float = 0.9
    storage_saturated_for: str = "15m"
    latency_factor: float = 5.0  # "far above normal": this many times the baseline
    latency_floor_seconds: float = 0.005  # ignore slow-but-fine latencies below this
    latency_baseline: str = "1d"
    latency_high_for: str = "15m"
    # StorageTierMissesTarget: a tier misses a target of the agents' config (tier_targets)
    # while the node's jobs wait for data at least this share of their reported time (SDK and
    # `gpufeed run` phases); a throughput target counts only while the tier reads at least
    # target_min_read_bytes_per_second (an idle tier is not slow).
    target_data_wait_share: float = 0.2
    target_min_read_bytes_per_second: float = 1e6
    tier_target_missed_for: str = "10m"
    fill_lookback: str = "6h"
    fill_horizon_seconds: int = 24 * 3600
    fill_free_ratio_below: float = 0.15
    filling_up_for: str = "1h"
    transmit_wait_ratio: float = 0.1  # a port unable to send 10% of the time
    fabric_congested_for: str = "10m"
    # Mean RTT variation (tcp_info rttvar) of a node's GPU-job TCP connections; a healthy
    # data-centre fabric stays well under a millisecond.
    fabric_jitter_seconds: float = 0.002
    fabric_jitter_for: str = "10m"
    mount_stuck_for: str = "5m"
    tier_path_missing_for: str = "10m"
    agent_down_for: str = "5m"
    collector_failing_for: str = "10m"
    # The page is the sampler's snapshot; older than this (the agent's interval is 1 s by
    # default, a tick at most 5 intervals) means sampling has stalled.
    sampler_stale_after_seconds: float = 60.0
    sampler_stalled_for: str = "2m"
    sdk_drop_rate_per_second: float = 0.0  # any sustained drop
    sdk_dropped_for: str = "15m"
    windows_log_failing_for: str = "10m"  # windows waiting for the disk, or write errors
    windows_log_skipped_for: str = "5m"  # unreadable lines found at the agent's start
    rate_window: str = "5m"
    # The fleet service's series (`gpufeed fleet`, scraped under its own job name; any
    # number of replicas: the rules take the max over them).
    fleet_selector: str = 'job="gpufeed-fleet"'
    job_held_back_for: str = "2m"
    # GpuJobRankLost: a rank exited without closing its job while the job still runs
    # elsewhere (its peers wait for it); a cancelled job's ranks all go within seconds
    rank_lost_for: str = "2m"
    # The cluster scheduler exporter's series (`gpufeed scheduler`, one per cluster, under
    # its own job name).
    scheduler_selector: str = 'job="gpufeed-scheduler"'
    scheduler_backlog_for: str = "15m"
    # InferenceSaturated: an inference server (gpufeed_serving_*) keeps more than this many
    # requests waiting while the GPUs of its job run at least inference_busy_ratio
    inference_waiting_requests: float = 10.0
    inference_busy_ratio: float = vocabulary.DEFAULT_THRESHOLD_RATIO
    inference_saturated_for: str = "5m"
    # InferenceIdleNoDemand (informational): a serving GPU's window is low_demand this long
    inference_idle_for: str = "30m"
    fatal_xids: tuple[str, ...] = FATAL_XIDS
    throttle_reasons: tuple[str, ...] = THROTTLE_REASONS
    cause_hints: dict[str, str] = field(default_factory=lambda: dict(CAUSE_HINTS))
    runbook_base_url: str = RUNBOOK_BASE_URL
    # Where the Prometheus Operator's PrometheusRule goes and the labels its ruleSelector
    # matches (kube-prometheus-stack selects on `release: <helm release name>`).
    kubernetes_namespace: str = "monitoring"
    prometheus_rule_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "gpufeed-agent"}
    )

    @property
    def sel(self) -> str:
        """The label matchers every query puts on gpufeed series."""
        return self.selector

    @property
    def fleet_sel(self) -> str:
        """The label matchers of the fleet service's series."""
        return self.fleet_selector

    def with_for_override(self, duration: str) -> RulesConfig:
        """A copy with every `for:` set to `duration` (tests shorten them this way)."""
        changes: dict[str, Any] = {
            f.name: duration for f in dataclasses.fields(self) if f.name.endswith("_for")
        }
        return dataclasses.replace(self, **changes)
