"""Builds gpufeed's recording rules and alerts from a `RulesConfig`, as plain dicts.

Recording rules follow `level:metric:operations`; alerts carry `severity`, a static
`summary`, a templated `description` and a `runbook_url` that `_with_runbook` adds to every
alert, pointing at the alert's section in docs/runbooks.md.
"""

from __future__ import annotations

from typing import Any

from alerts.config import INPUT_PIPELINE_HINT, RulesConfig
from gpufeed.vocabulary import Cause, DataSource

Rule = dict[str, Any]

GPU_LABELS = "instance, gpu, uuid"
HELD_LABELS = "instance, gpu, uuid, job_id"


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


def held_utilization(cfg: RulesConfig) -> str:
    """Utilization of every GPU that a job holds, one series per (GPU, job_id).

    job_info is the "many" side so that a GPU shared by several jobs yields one series per
    job; a GPU no job holds has no job_info series and drops out (capacity, not incident).
    """
    return (
        f"max by ({HELD_LABELS}) (\n"
        f"  gpufeed_job_info{{{cfg.sel}}}\n"
        f"  * on ({GPU_LABELS}) group_left ()\n"
        f"  gpufeed_gpu_utilization_ratio{{{cfg.sel}}}\n"
        ")"
    )


HELD_RECORD = "instance_gpu_job_id:gpufeed_gpu_utilization_ratio:held"


def sustained_low(cfg: RulesConfig) -> str:
    """Held GPUs below the threshold now and at every evaluation of the last window, and
    held since the window began; no `cause` in it, so no cause change can reset it.

    The window is an `_over_time` over the held-utilization recording rule, not a `for:`:
    an alert's `for:` clock belongs to its label set, and the cause label must stay free to
    change. The current value is computed inline (rule groups run independently, so the
    recording rule may lag one evaluation), which also ends the alert as soon as the job
    releases the GPU or utilization recovers. `offset` requires the GPU to have been held
    when the window began: a job that started five minutes ago has not been slow for ten.
    """
    t, d = f"{cfg.utilization_threshold_ratio:g}", cfg.utilization_low_for
    return (
        f"(\n{_indent(held_utilization(cfg), 2)}\n) < {t}\n"
        f"and on ({HELD_LABELS}) max_over_time({HELD_RECORD}[{d}]) < {t}\n"
        f"and on ({HELD_LABELS}) {HELD_RECORD} offset {d}"
    )


def utilization_low_expr(cfg: RulesConfig) -> str:
    """Sustained low utilization on a held GPU, labelled with the correlator's current cause.

    While the correlator has a window open on the GPU, its `cause` is copied from
    gpufeed_gpu_underutilization_cause (topk picks one if two ever coexist, so the join
    cannot fail); before a window opens, or where no correlator runs, cause="unknown", so
    a GPU stays covered even when the correlator is down. The alert has no `for:` (the
    window is inside `sustained_low`): when the cause changes, the alert with the old cause
    resolves and the one with the new cause fires at the same evaluation. A data_loading
    window's `data_source` comes along (storage, or input_pipeline: the job's own loader),
    so Alertmanager sends the job's own input pipeline to its owner, not to storage.

    A job held back by a straggler pages once, as GpuJobHeldBack (the culprit and its
    cause), not once per GPU: its GPUs are left out while the fleet names its culprit, and
    GPUs whose own agent says they wait for a peer (`straggler`) are left out always.
    """
    low = sustained_low(cfg)
    cause = f"gpufeed_gpu_underutilization_cause{{{cfg.sel}}}"
    per_gpu = (
        f"(\n{_indent(low, 2)}\n)\n"
        f"* on ({HELD_LABELS}) group_left (cause, data_source)\n"
        f"topk by ({HELD_LABELS}) (1, {cause})\n"
        "or\n"
        "label_replace(\n"
        f"  (\n{_indent(low, 4)}\n  )\n"
        f"  unless on ({HELD_LABELS})\n"
        f"  {cause},\n"
        '  "cause", "unknown", "", ""\n'
        ")"
    )
    return (
        f"(\n{_indent(per_gpu, 2)}\n)\n"
        f"unless on (job_id)\n{job_culprit(cfg)}\n"
        f"unless on ({HELD_LABELS})\n"
        f'gpufeed_gpu_underutilization_cause{{{cfg.sel}, cause=~"{NOT_PAGING}"}}'
    )


# Causes GpuUtilizationLow leaves out: a straggler's GPUs page once as GpuJobHeldBack, and
# an inference server idle for lack of requests (low_demand) is not an incident at all
# (InferenceIdleNoDemand says so, informational).
NOT_PAGING = "straggler|low_demand"


def inference_saturated(cfg: RulesConfig) -> str:
    """Per node and serving job: more requests waiting than the threshold (summed over the
    job's endpoints) while the job's GPUs are busy: the server is at its capacity. An
    endpoint the config names by GPU (no job_id) is judged per GPU the same way."""
    s, t, b = cfg.sel, f"{cfg.inference_waiting_requests:g}", f"{cfg.inference_busy_ratio:g}"
    by_job = (
        f'sum by (instance, job_id) (gpufeed_serving_requests_waiting{{{s}, job_id!=""}})\n'
        f"  > {t}\n"
        "and on (instance, job_id)\n"
        f"avg by (instance, job_id) (\n{_indent(held_utilization(cfg), 2)}\n) >= {b}"
    )
    by_gpu = (
        "sum by (instance, gpu) (\n"
        f'  gpufeed_serving_requests_waiting{{{s}, job_id="", gpu!=""}}\n'
        f") > {t}\n"
        "and on (instance, gpu)\n"
        f"max by (instance, gpu) (gpufeed_gpu_utilization_ratio{{{s}}}) >= {b}"
    )
    return f"(\n{_indent(by_job, 2)}\n)\nor\n(\n{_indent(by_gpu, 2)}\n)"


CULPRIT_LABELS = "job_id, culprit_instance, culprit_gpu, culprit_rank, cause"


def job_culprit(cfg: RulesConfig) -> str:
    """One series per held-back job and culprit, however many fleet replicas export it."""
    return f"max by ({CULPRIT_LABELS}) (gpufeed_fleet_job_culprit_info{{{cfg.fleet_sel}}})"


IMBALANCE_LABELS = "job_id, reason, pipeline_stage"


def job_imbalance(cfg: RulesConfig) -> str:
    """One series per job that waits for its own imbalance, however many fleet replicas
    export it."""
    return f"max by ({IMBALANCE_LABELS}) (gpufeed_fleet_job_imbalance_info{{{cfg.fleet_sel}}})"


def imbalance_description() -> str:
    return (
        "Job {{ $labels.job_id }} waits for its own imbalance; no worker or node is at "
        'fault: {{ if eq $labels.reason "stage_imbalance" }}pipeline stage '
        "{{ $labels.pipeline_stage }} is the bottleneck on every replica: rebalance its "
        "layers across the stages{{ else }}the slowest data-parallel rank changes every "
        "step: input imbalance (sequence lengths), bucket or pack the batches{{ end }}. "
        "The job's owners decide; see the Job dashboard's collective wait by pipeline stage."
    )


def cause_description(cfg: RulesConfig) -> str:
    """A description template that says what to look at for the alert's cause."""
    head = (
        "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}, held by job "
        "{{ $labels.job_id }}, runs at {{ $value | humanizePercentage }} utilization; "
        "cause: {{ $labels.cause }}. "
    )
    return head + hint_by_cause(cfg)


def hint_by_cause(cfg: RulesConfig) -> str:
    """A template that picks the hint for the alert's `cause` label."""
    branches = []
    for i, (cause, hint) in enumerate((c, h) for c, h in cfg.cause_hints.items() if c != "unknown"):
        keyword = "if" if i == 0 else "else if"
        if cause == Cause.DATA_LOADING.value:
            # a data stall inside the job's own loader is not the storage owners' (issue 23)
            hint = (
                f'{{{{ if eq $labels.data_source "{DataSource.INPUT_PIPELINE}" }}}}'
                f"{INPUT_PIPELINE_HINT}{{{{ else }}}}{hint}{{{{ end }}}}"
            )
        branches.append(f'{{{{ {keyword} eq $labels.cause "{cause}" }}}}{hint}')
    fallback = cfg.cause_hints.get("unknown", "")
    return "".join(branches) + f"{{{{ else }}}}{fallback}{{{{ end }}}}"


def held_back_description(cfg: RulesConfig) -> str:
    return (
        "Job {{ $labels.job_id }} is held back by {{ $labels.culprit_instance }}"
        "{{ with $labels.culprit_gpu }} GPU {{ . }}{{ end }}"
        "{{ with $labels.culprit_rank }} (rank {{ . }}){{ end }}: its other GPUs wait for it "
        "in their collectives. The culprit's own cause: {{ $labels.cause }}. " + hint_by_cause(cfg)
    )


def io_latency(cfg: RulesConfig) -> str:
    """Mean I/O latency per mount, only where operations completed: an idle mount has no
    latency, and a NaN would poison the baseline that StorageTierLatencyHigh averages."""
    s, w = cfg.sel, cfg.rate_window
    return (
        "sum by (instance, tier, mountpoint) (\n"
        f"  rate(gpufeed_storage_read_time_seconds_total{{{s}}}[{w}])\n"
        f"  + rate(gpufeed_storage_write_time_seconds_total{{{s}}}[{w}])\n"
        ")\n/\n"
        "(\n"
        "  sum by (instance, tier, mountpoint) (\n"
        f"    rate(gpufeed_storage_reads_completed_total{{{s}}}[{w}])\n"
        f"    + rate(gpufeed_storage_writes_completed_total{{{s}}}[{w}])\n"
        "  ) > 0\n"
        ")"
    )


def tier_target_missed(cfg: RulesConfig) -> str:
    """Per node and tier: the read latency above its target, or the read throughput below
    its target while the tier is in use (label `target` says which), while the node's jobs
    wait for data."""
    s, w = cfg.sel, cfg.rate_window
    by = "sum by (instance, tier)"
    reads = f"{by} (rate(gpufeed_storage_read_bytes_total{{{s}}}[{w}]))"
    latency = (
        f"{by} (rate(gpufeed_storage_read_time_seconds_total{{{s}}}[{w}]))\n"
        f"  / ({by} (rate(gpufeed_storage_reads_completed_total{{{s}}}[{w}])) > 0)"
    )
    lat_target = (
        f"max by (instance, tier) (gpufeed_storage_tier_target_read_latency_seconds{{{s}}})"
    )
    bps_target = (
        f"max by (instance, tier) (gpufeed_storage_tier_target_read_bytes_per_second{{{s}}})"
    )
    waiting = (
        f'sum by (instance) (rate(gpufeed_job_phase_seconds_total{{{s}, phase="data_wait"}}[{w}]))'
        f"\n  / sum by (instance) (rate(gpufeed_job_phase_seconds_total{{{s}}}[{w}]))"
    )
    return (
        "(\n"
        "  label_replace(\n"
        f"    (\n{_indent(latency, 6)}\n    ) > on (instance, tier) {lat_target},\n"
        '    "target", "read_latency", "", ""\n'
        "  )\n"
        "  or\n"
        "  label_replace(\n"
        f"    ({reads} > {cfg.target_min_read_bytes_per_second:g})\n"
        f"    < on (instance, tier) {bps_target},\n"
        '    "target", "read_throughput", "", ""\n'
        "  )\n"
        ")\n"
        f"and on (instance) (\n{_indent(waiting, 2)}\n) > {cfg.target_data_wait_share:g}"
    )


def recording_rules(cfg: RulesConfig) -> list[Rule]:
    """Fleet aggregates the dashboards query (cheap to read over long ranges)."""
    s, w = cfg.sel, cfg.rate_window
    rules: list[Rule] = [
        {
            "record": "fleet:gpufeed_gpu_utilization_ratio:avg",
            "expr": f"avg(gpufeed_gpu_utilization_ratio{{{s}}})",
        },
        {"record": HELD_RECORD, "expr": held_utilization(cfg)},
        {
            # seconds lost per second = GPUs lost right now = GPU-hours lost per hour
            # low_demand is a serving GPU's spare capacity, not time lost to a bottleneck
            "record": f"cause:gpufeed_gpu_underutilized_seconds:rate{w}",
            "expr": (
                "sum by (cause) (rate(gpufeed_gpu_underutilized_seconds_total"
                f'{{{s}, cause!="low_demand"}}[{w}]))'
            ),
        },
        {
            "record": "cause:gpufeed_gpu_underutilization_windows_open:count",
            "expr": f"count by (cause) (gpufeed_gpu_underutilization_cause{{{s}}})",
        },
        {
            "record": "fleet:gpufeed_gpu_lost:count",
            "expr": f"count(gpufeed_gpu_up{{{s}}} == 0) or vector(0)",
        },
    ]
    for counter in (
        "read_bytes",
        "written_bytes",
        "reads_completed",
        "writes_completed",
        "read_time_seconds",
        "write_time_seconds",
        "io_time_weighted_seconds",
    ):
        rules.append(
            {
                "record": f"tier:gpufeed_storage_{counter}:rate{w}",
                "expr": f"sum by (tier) (rate(gpufeed_storage_{counter}_total{{{s}}}[{w}]))",
            }
        )
    # A network filesystem (no `device` label) is one filesystem however many nodes mount
    # it: counted once per tier and mount point, not once per node. Local devices add up.
    for gauge in ("capacity_bytes", "free_bytes"):
        rules.append(
            {
                "record": f"tier:gpufeed_storage_{gauge}:sum",
                "expr": (
                    f'sum by (tier) (\n  gpufeed_storage_{gauge}{{{s}, device!=""}}\n'
                    f'  or max by (tier, mountpoint) (gpufeed_storage_{gauge}{{{s}, device=""}})\n)'
                ),
            }
        )
    rules.append(
        {
            "record": f"instance_tier_mountpoint:gpufeed_storage_io_latency_seconds:mean{w}",
            "expr": io_latency(cfg),
        }
    )
    return rules


def alert_rules(cfg: RulesConfig) -> list[Rule]:
    s, w = cfg.sel, cfg.rate_window
    xids = "|".join(cfg.fatal_xids)
    xid_series = f'gpufeed_gpu_xid_errors_total{{{s}, xid=~"{xids}"}}'
    reasons = "|".join(cfg.throttle_reasons)
    latency = f"instance_tier_mountpoint:gpufeed_storage_io_latency_seconds:mean{w}"
    pct = f"{cfg.utilization_threshold_ratio:.0%}"
    return [
        {
            "alert": "GpuUtilizationLow",
            "expr": utilization_low_expr(cfg),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"A GPU held by a job has run below {pct} utilization for {cfg.utilization_low_for}.",
                "description": cause_description(cfg),
            },
        },
        {
            "alert": "GpuJobHeldBack",
            "expr": job_culprit(cfg),
            "for": cfg.job_held_back_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A multi-node job is held back by one straggler.",
                "description": held_back_description(cfg),
            },
        },
        {
            "alert": "GpuJobImbalanced",
            "expr": job_imbalance(cfg),
            "for": cfg.job_held_back_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A multi-rank job waits for its own imbalance (its stages or its batches).",
                "description": imbalance_description(),
            },
        },
        {
            "alert": "GpuJobRankLost",
            # a rank lost (exited without closing the job: killed, crashed) while the job
            # still has live processes on some node: its peers wait for a rank that is gone
            "expr": (
                f"max by (instance, job_id, rank) (gpufeed_job_rank_lost{{{s}}}) == 1\n"
                f"and on (job_id)\n"
                f"max by (job_id) (gpufeed_job_processes{{{s}}}) > 0"
            ),
            "for": cfg.rank_lost_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A rank of a running job exited without closing it (killed or crashed).",
                "description": (
                    "Rank {{ $labels.rank }} of job {{ $labels.job_id }} on "
                    "{{ $labels.instance }} exited without closing its job (SIGKILL, the "
                    "OOM killer, a crash) while the job's other ranks still run: they wait "
                    "for it in their collectives. gpufeed_job_rank_exit_status says how it "
                    "ended where `gpufeed run` launched it (137: SIGKILL); check the node's "
                    "kernel log (OOM killer) and the rank's own log."
                ),
            },
        },
        {
            "alert": "GpuFatalXid",
            # increase() cannot see the first sample of a new xid series, so a series that
            # did not exist one lookback ago counts too; sum without () drops __name__ so
            # both branches give the same label set and `or` keeps one of them.
            "expr": (
                f"increase({xid_series}[{cfg.fatal_xid_lookback}]) > 0\n"
                "or\n"
                "sum without () (\n"
                f"  {xid_series}\n"
                f"  unless {xid_series} offset {cfg.fatal_xid_lookback}\n"
                ") > 0"
            ),
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "A GPU reported an XID error that needs the GPU reset or the node drained.",
                "description": (
                    "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }} "
                    "reported XID {{ $labels.xid }} ({{ $value | humanize }} in the last "
                    f"{cfg.fatal_xid_lookback})."
                ),
            },
        },
        {
            "alert": "GpuLost",
            "expr": f"gpufeed_gpu_up{{{s}}} == 0",
            "for": cfg.gpu_lost_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "A GPU stopped answering (fallen off the bus or lost).",
                "description": (
                    "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }} "
                    f"has not answered for {cfg.gpu_lost_for}."
                ),
            },
        },
        {
            "alert": "GpuClockThrottled",
            "expr": (
                f"max by ({GPU_LABELS}, reason) (\n"
                f'  gpufeed_gpu_clock_event_active{{{s}, reason=~"{reasons}"}}\n'
                ") == 1"
            ),
            "for": cfg.throttling_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A GPU is held back by thermal or power throttling.",
                "description": (
                    "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }} "
                    f"has been throttled ({{{{ $labels.reason }}}}) for {cfg.throttling_for}."
                ),
            },
        },
        {
            "alert": "StorageTierSaturated",
            "expr": (
                "max by (instance, tier, mountpoint, device) (\n"
                f"  rate(gpufeed_storage_io_time_seconds_total{{{s}}}[{w}])\n"
                f") > {cfg.storage_busy_ratio:g}"
            ),
            "for": cfg.storage_saturated_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A storage tier's device is busy nearly all the time.",
                "description": (
                    "{{ $labels.device }} ({{ $labels.mountpoint }}, tier {{ $labels.tier }}) "
                    "on {{ $labels.instance }} has been busy {{ $value | humanizePercentage }} "
                    f"of the time for {cfg.storage_saturated_for}."
                ),
            },
        },
        {
            "alert": "StorageTierLatencyHigh",
            # The current latency is computed inline and only the baseline comes from the
            # recording rule: Prometheus evaluates rule groups independently, and an alert
            # that read the current value from another group would lag it by one round.
            "expr": (
                f"(\n{_indent(io_latency(cfg), 2)}\n)\n"
                f"> {cfg.latency_floor_seconds:g}\n"
                f"> {cfg.latency_factor:g} * avg_over_time({latency}[{cfg.latency_baseline}])"
            ),
            "for": cfg.latency_high_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A storage tier's I/O latency is far above its usual level.",
                "description": (
                    "Mean I/O latency on {{ $labels.mountpoint }} (tier {{ $labels.tier }}) on "
                    "{{ $labels.instance }} is {{ $value | humanizeDuration }}, more than "
                    f"{cfg.latency_factor:g} times its {cfg.latency_baseline} average, "
                    f"for {cfg.latency_high_for}."
                ),
            },
        },
        {
            "alert": "StorageTierMissesTarget",
            "expr": tier_target_missed(cfg),
            "for": cfg.tier_target_missed_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A storage tier misses its target while jobs wait for data.",
                "description": (
                    "Tier {{ $labels.tier }} on {{ $labels.instance }} misses its "
                    "{{ $labels.target }} target (now {{ $value | humanize }}) while the "
                    "node's jobs wait for data, for "
                    f"{cfg.tier_target_missed_for}."
                ),
            },
        },
        {
            "alert": "StorageTierFillingUp",
            # A network filesystem (no `device` label) is one filesystem on every node that
            # mounts it: one alert for it, without `instance`, not one per node.
            "expr": (
                "(\n"
                f'  gpufeed_storage_free_bytes{{{s}, device!=""}}\n'
                f'    / (gpufeed_storage_capacity_bytes{{{s}, device!=""}} > 0)\n'
                f"    < {cfg.fill_free_ratio_below:g}\n"
                "  and\n"
                f'  predict_linear(gpufeed_storage_free_bytes{{{s}, device!=""}}'
                f"[{cfg.fill_lookback}], {cfg.fill_horizon_seconds}) < 0\n"
                ")\n"
                "or\n"
                "(\n"
                "  max by (tier, mountpoint) (\n"
                f'    gpufeed_storage_free_bytes{{{s}, device=""}}\n'
                f'      / (gpufeed_storage_capacity_bytes{{{s}, device=""}} > 0)\n'
                f"  ) < {cfg.fill_free_ratio_below:g}\n"
                "  and\n"
                "  max by (tier, mountpoint) (\n"
                f'    predict_linear(gpufeed_storage_free_bytes{{{s}, device=""}}'
                f"[{cfg.fill_lookback}], {cfg.fill_horizon_seconds})\n"
                "  ) < 0\n"
                ")"
            ),
            "for": cfg.filling_up_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A storage tier will run out of space within a day.",
                "description": (
                    "{{ $labels.mountpoint }} (tier {{ $labels.tier }}) "
                    "{{ with $labels.instance }}on {{ . }}{{ else }}(a network filesystem, "
                    "every node that mounts it){{ end }} "
                    "has {{ $value | humanizePercentage }} free and, at the rate of the last "
                    f"{cfg.fill_lookback}, fills up within "
                    f"{cfg.fill_horizon_seconds // 3600} hours."
                ),
            },
        },
        {
            "alert": "StorageMountStuck",
            "expr": f"gpufeed_storage_mount_stuck{{{s}}} == 1",
            "for": cfg.mount_stuck_for,
            # Every process that touches a hung mount hangs with it, unkillable (D state):
            # the jobs on that node stop, and only the storage side can unblock them.
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "A storage mount has stopped answering; processes that touch it hang.",
                "description": (
                    "{{ $labels.mountpoint }} (tier {{ $labels.tier }}) on "
                    "{{ $labels.instance }} has not answered a statfs within the agent's "
                    f"time bound for {cfg.mount_stuck_for}; jobs reading or writing it hang."
                ),
            },
        },
        {
            "alert": "StorageTierPathMissing",
            "expr": f"gpufeed_storage_tier_path_missing{{{s}}} == 1",
            "for": cfg.tier_path_missing_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A path configured for a storage tier does not exist; the tier is not watched there.",
                "description": (
                    "Path {{ $labels.path }} of tier {{ $labels.tier }} on {{ $labels.instance }} "
                    f"has not existed for {cfg.tier_path_missing_for}: a typo in the agent's "
                    "config, or a mount that is missing."
                ),
            },
        },
        {
            "alert": "FabricCongested",
            "expr": (
                f"rate(gpufeed_network_transmit_wait_seconds_total{{{s}}}[{w}])"
                f" > {cfg.transmit_wait_ratio:g}"
            ),
            "for": cfg.fabric_congested_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A fabric port cannot send for a large part of the time (congestion).",
                "description": (
                    "{{ $labels.fabric }} port {{ $labels.device }}/{{ $labels.port }} on "
                    "{{ $labels.instance }} had data it could not send "
                    "{{ $value | humanizePercentage }} of the time for "
                    f"{cfg.fabric_congested_for}."
                ),
            },
        },
        {
            "alert": "FabricJitterHigh",
            # the node's series (no peer label): every GPU-job connection of the node
            "expr": (
                f'gpufeed_fabric_rtt_jitter_seconds{{{s}, peer=""}} > {cfg.fabric_jitter_seconds:g}'
            ),
            "for": cfg.fabric_jitter_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "The round-trip time of GPU jobs' connections varies widely (fabric jitter).",
                "description": (
                    "The TCP connections of GPU jobs on {{ $labels.instance }} have had a "
                    "round-trip variation of {{ $value | humanizeDuration }} for "
                    f"{cfg.fabric_jitter_for}: collectives wait for the slowest packet. Check "
                    "the Node dashboard's fabric panel for the peer with the most jitter."
                ),
            },
        },
        {
            "alert": "SchedulerBacklogWithIdleGpus",
            "expr": (
                "max by (reason) (\n"
                f"  gpufeed_scheduler_backlog_idle_gpus{{{cfg.scheduler_selector}}}\n"
                ") > 0"
            ),
            "for": cfg.scheduler_backlog_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "GPUs stay free while GPU jobs wait in the queue.",
                "description": (
                    "{{ $value }} GPUs have been free while eligible GPU jobs pend for "
                    f"{cfg.scheduler_backlog_for}, reason {{{{ $labels.reason }}}} "
                    "(fragmentation: no node has enough free GPUs for a pending request; "
                    "stall: a pending job would fit and still waits). See the Fleet "
                    "dashboard's queue panel."
                ),
            },
        },
        {
            "alert": "InferenceSaturated",
            "expr": inference_saturated(cfg),
            "for": cfg.inference_saturated_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "An inference server keeps requests waiting while its GPUs are busy.",
                "description": (
                    "{{ with $labels.job_id }}Job {{ . }}{{ else }}The server on GPU "
                    "{{ $labels.gpu }}{{ end }} on {{ $labels.instance }} has had more than "
                    f"{cfg.inference_waiting_requests:g} requests waiting while its GPUs run "
                    f"at {cfg.inference_busy_ratio:.0%} or more, for "
                    f"{cfg.inference_saturated_for}: demand exceeds what it serves. Add "
                    "replicas or GPUs; see the Job dashboard's serving row."
                ),
            },
        },
        {
            "alert": "InferenceIdleNoDemand",
            "expr": (
                "count by (instance, job_id) (\n"
                f'  gpufeed_gpu_underutilization_cause{{{s}, cause="low_demand"}}\n'
                ")"
            ),
            "for": cfg.inference_idle_for,
            "labels": {"severity": "info"},
            "annotations": {
                "summary": "Serving GPUs idle for lack of requests (informational, not a fault).",
                "description": (
                    "{{ $value }} GPUs of serving job {{ $labels.job_id }} on "
                    "{{ $labels.instance }} have been underused with no request waiting "
                    f"for {cfg.inference_idle_for}: more capacity than demand. Consider "
                    "fewer replicas or sharing the GPUs; nothing is broken."
                ),
            },
        },
        {
            "alert": "GpufeedAgentDown",
            "expr": f"up{{{s}}} == 0",
            "for": cfg.agent_down_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Prometheus cannot scrape a gpufeed agent; its GPUs are unwatched.",
                "description": (
                    "The gpufeed agent on {{ $labels.instance }} has not answered scrapes "
                    f"for {cfg.agent_down_for}; no GPU alert can fire for that node."
                ),
            },
        },
        {
            "alert": "GpufeedCollectorFailing",
            "expr": f"gpufeed_collector_success{{{s}}} == 0",
            "for": cfg.collector_failing_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A gpufeed collector keeps failing; its metrics are missing.",
                "description": (
                    "Collector {{ $labels.collector }} of the gpufeed agent on "
                    f"{{{{ $labels.instance }}}} has failed for {cfg.collector_failing_for}."
                ),
            },
        },
        {
            "alert": "GpufeedSamplerStalled",
            # /metrics serves the last snapshot at any age, so `up` stays 1 and every gauge
            # keeps its old value: only the snapshot's own timestamp shows the stall.
            "expr": (
                f"time() - gpufeed_snapshot_timestamp_seconds{{{s}}}"
                f" > {cfg.sampler_stale_after_seconds:g}"
            ),
            "for": cfg.sampler_stalled_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A gpufeed agent serves an old snapshot; its metrics are frozen.",
                "description": (
                    "The gpufeed agent on {{ $labels.instance }} serves a snapshot "
                    "{{ $value | humanizeDuration }} old: its sampler has stalled, so no GPU "
                    "or storage alert can fire for that node."
                ),
            },
        },
        {
            "alert": "GpufeedSdkMessagesDropped",
            "expr": (
                "sum by (instance, reason) (\n"
                f"  rate(gpufeed_sdk_messages_dropped_total{{{s}}}[{w}])\n"
                f") > {cfg.sdk_drop_rate_per_second:g}"
            ),
            "for": cfg.sdk_dropped_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A gpufeed agent keeps dropping SDK messages; job phases and steps are incomplete.",
                "description": (
                    "The gpufeed agent on {{ $labels.instance }} has dropped SDK messages "
                    '(reason {{ $labels.reason }}) at {{ printf "%.2f" $value }} per second for '
                    f"{cfg.sdk_dropped_for}."
                ),
            },
        },
        {
            "alert": "GpufeedWindowsLogFailing",
            "expr": (
                f"max by (instance) (gpufeed_windows_log_pending_windows{{{s}}}) > 0\n"
                "or\n"
                "sum by (instance) (\n"
                f"  increase(gpufeed_windows_log_write_errors_total{{{s}}}[{w}])\n"
                ") > 0"
            ),
            "for": cfg.windows_log_failing_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "A gpufeed agent cannot write its windows log; closed windows wait in memory.",
                "description": (
                    "The windows log of the gpufeed agent on {{ $labels.instance }} has failed "
                    f"writes or windows waiting for the disk for {cfg.windows_log_failing_for} "
                    "(disk full or I/O errors); the waiting windows are lost if the agent "
                    "stops before the disk takes them."
                ),
            },
        },
        {
            "alert": "GpufeedWindowsLogLinesSkipped",
            "expr": (
                "sum by (instance) (\n"
                f'  gpufeed_windows_log_skipped_lines_total{{{s}, reason!="not_simulated"}}\n'
                ") > 0"
            ),
            "for": cfg.windows_log_skipped_for,
            "labels": {"severity": "info"},
            "annotations": {
                "summary": "A gpufeed agent skipped unreadable lines of its windows log at start.",
                "description": (
                    "The gpufeed agent on {{ $labels.instance }} skipped {{ $value }} lines of "
                    "its windows log when it started (torn, corrupt, or written by a "
                    "simulated node); the windows on them are not shown. The count stays "
                    "until the agent restarts."
                ),
            },
        },
    ]


def _with_runbook(rule: Rule, cfg: RulesConfig) -> Rule:
    anchor = rule["alert"].lower()
    annotations = dict(rule["annotations"])
    annotations["runbook_url"] = f"{cfg.runbook_base_url}#{anchor}"
    return {**rule, "annotations": annotations}


def rule_groups(cfg: RulesConfig) -> dict[str, Any]:
    """The whole rule file, as Prometheus loads it."""
    return {
        "groups": [
            {"name": "gpufeed.rules", "rules": recording_rules(cfg)},
            {
                "name": "gpufeed.alerts",
                "rules": [_with_runbook(r, cfg) for r in alert_rules(cfg)],
            },
        ]
    }
