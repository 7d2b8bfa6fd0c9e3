"""Fleet: is the fleet busy, and where do GPU-hours go when it is not?"""

from dashboards.presets import (
    GPU_HOURS,
    GPU_HOURS_PER_HOUR,
    PER_SECOND,
    RATIO,
    SECONDS,
    build_dashboard,
    heatmap,
    instance_variable,
    stat,
    table,
    target,
    timeseries,
)

NODES = 'instance=~"$instance"'

dashboard = build_dashboard(
    title="gpufeed / Fleet",
    uid="gpufeed-fleet",
    description="Utilization of every GPU, GPU-hours lost by cause, the jobs losing most, "
    "open underutilization windows, XIDs and lost GPUs.",
    variables=[instance_variable()],
    rows=[
        (
            "Utilization",
            [
                heatmap(
                    "GPU utilization, every GPU",
                    [
                        target(
                            f"gpufeed_gpu_utilization_ratio{{{NODES}}}", "{{instance}} GPU {{gpu}}"
                        )
                    ],
                    description="One row per GPU; red is idle, green is busy.",
                ),
                timeseries(
                    "Mean GPU utilization",
                    [
                        target("fleet:gpufeed_gpu_utilization_ratio:avg", "whole fleet"),
                        target(f"avg(gpufeed_gpu_utilization_ratio{{{NODES}}})", "selected nodes"),
                    ],
                    RATIO,
                    max_value=1,
                ),
            ],
        ),
        (
            "GPU-hours lost to underutilization",
            [
                timeseries(
                    "GPU-hours lost per hour, by cause",
                    [target("cause:gpufeed_gpu_underutilized_seconds:rate5m", "{{cause}}")],
                    GPU_HOURS_PER_HOUR,
                    stacked=True,
                    by_cause=True,
                    description="Seconds of underutilization per second, fleet-wide: the "
                    "number of GPUs lost right now, i.e. GPU-hours lost per hour. Serving "
                    "GPUs idle for lack of requests (low_demand) are spare capacity and are "
                    "left out (the recording rule excludes them).",
                ),
                timeseries(
                    "Serving GPUs idle for lack of requests (low_demand)",
                    [
                        target(
                            "sum(rate(gpufeed_gpu_underutilized_seconds_total"
                            f'{{{NODES},cause="low_demand"}}[$__rate_interval]))',
                            "GPU-hours per hour",
                        ),
                        target(
                            f"sum(gpufeed_serving_requests_waiting{{{NODES}}})",
                            "requests waiting, all servers",
                        ),
                    ],
                    GPU_HOURS_PER_HOUR,
                    description="Inference servers underused with no request waiting: "
                    "spare capacity beyond demand, not lost time (docs/serving.md).",
                ),
                table(
                    "Jobs losing the most GPU-hours (time range)",
                    [
                        target(
                            "topk(10, sum by (job_id, cause) (increase("
                            "gpufeed_gpu_underutilized_seconds_total"
                            f'{{{NODES},job_id!="",cause!="low_demand"}}'
                            "[$__range]))) / 3600",
                            instant=True,
                            table=True,
                        )
                    ],
                    GPU_HOURS,
                    description="GPUs no job holds (cause idle, no job_id) are capacity, "
                    "not a job's loss, and are left out; so are serving GPUs idle for lack "
                    "of requests (low_demand).",
                    sort_by="Value",
                ),
            ],
        ),
        (
            "GPU-time ledger and held-back jobs (gpufeed fleet)",
            [
                timeseries(
                    "GPU-hours per hour by state, all jobs",
                    [
                        target(
                            "sum by (state) (max by (job_id, state, culprit_cause) (rate("
                            "gpufeed_fleet_job_gpu_seconds_total[$__rate_interval])))",
                            "{{state}}",
                        )
                    ],
                    GPU_HOURS_PER_HOUR,
                    stacked=True,
                    description="Every job's allocated GPUs split into productive time and "
                    "each cause (the fleet service's ledger; max over its replicas).",
                ),
                table(
                    "Cost by cause (time range)",
                    [
                        target(
                            "sum by (state, culprit_cause, currency) (max by (job_id, state, "
                            "culprit_cause, currency) (increase("
                            "gpufeed_fleet_job_cost_total[$__range])))",
                            instant=True,
                            table=True,
                        )
                    ],
                    PER_SECOND,
                    description="What each cause cost, in the fleet service's currency "
                    "(--ledger.price per GPU-hour): e.g. data_loading is what waiting for "
                    "storage cost; straggler time by its culprit's cause.",
                    sort_by="Value",
                ),
                table(
                    "Held-back jobs now",
                    [
                        target(
                            "max by (job_id, culprit_instance, culprit_gpu, culprit_rank, "
                            "cause) (gpufeed_fleet_job_culprit_info)",
                            instant=True,
                            table=True,
                        )
                    ],
                    PER_SECOND,
                    sort_by="job_id",
                ),
                stat(
                    "Fleet service behind by",
                    [target("max(gpufeed_fleet_lag_seconds)")],
                    "s",
                    description="0 when the fleet service is caught up; grows while the "
                    "TSDB is slow or down (the missed cycles run afterwards).",
                    red_above=300,
                ),
            ],
        ),
        (
            "Queue beside idle GPUs (gpufeed scheduler)",
            [
                timeseries(
                    "GPU queue beside idle GPUs",
                    [
                        target("sum(gpufeed_scheduler_pending_gpus)", "GPUs asked by pending jobs"),
                        target(
                            f"count(gpufeed_gpu_utilization_ratio{{{NODES}}} < 0.05) or vector(0)",
                            "idle GPUs (utilization < 5%)",
                        ),
                        target(
                            'max(gpufeed_scheduler_gpus{state="free"})', "free GPUs (scheduler)"
                        ),
                        target(
                            "max by (reason) (gpufeed_scheduler_backlog_idle_gpus)",
                            "free while jobs pend: {{reason}}",
                        ),
                    ],
                    PER_SECOND,
                    description="GPUs the pending GPU jobs ask for, beside the GPUs that sit "
                    "idle: free GPUs while jobs pend are fragmentation (no node has enough "
                    "for a request) or a stall (a job would fit and waits); see "
                    "docs/scheduler.md.",
                ),
                table(
                    "Pending GPU jobs by reason now",
                    [
                        target(
                            "sum by (queue, reason) (gpufeed_scheduler_pending_jobs)",
                            instant=True,
                            table=True,
                        )
                    ],
                    PER_SECOND,
                    sort_by="Value",
                ),
                stat(
                    "Longest wait of a pending GPU job",
                    [target("max(gpufeed_scheduler_pending_oldest_wait_seconds)")],
                    SECONDS,
                    red_above=3600,
                ),
                timeseries(
                    "Scheduler cycle time",
                    [target("max by (cycle) (gpufeed_scheduler_cycle_seconds)", "{{cycle}}")],
                    SECONDS,
                    description="The scheduler's last scheduling cycle (Slurm sdiag; "
                    "Kubernetes reports none here).",
                ),
            ],
        ),
        (
            "Windows and GPU health",
            [
                table(
                    "Open underutilization windows now",
                    [
                        target(
                            f"gpufeed_gpu_underutilization_cause{{{NODES}}}",
                            instant=True,
                            table=True,
                        )
                    ],
                    PER_SECOND,
                    sort_by="cause",
                ),
                timeseries(
                    "Open windows by cause",
                    [target("cause:gpufeed_gpu_underutilization_windows_open:count", "{{cause}}")],
                    PER_SECOND,
                    stacked=True,
                    by_cause=True,
                ),
                stat(
                    "XID errors (time range)",
                    [
                        target(
                            "sum(increase(gpufeed_gpu_xid_errors_total"
                            f"{{{NODES}}}[$__range])) or vector(0)"
                        )
                    ],
                    PER_SECOND,
                    red_above=1,
                ),
                stat(
                    "Lost GPUs now",
                    [target("fleet:gpufeed_gpu_lost:count")],
                    PER_SECOND,
                    red_above=1,
                ),
            ],
        ),
    ],
)
