"""Job: one job's GPUs, windows and causes, phases, steps, checkpoints, I/O, and for an
inference server its queue."""

from dashboards.presets import (
    BYTES_PER_SECOND,
    GPU_HOURS,
    GPU_HOURS_PER_HOUR,
    PER_SECOND,
    RATIO,
    SECONDS,
    build_dashboard,
    instance_variable,
    job_id_variable,
    state_timeline,
    table,
    target,
    timeseries,
    window_annotation,
)

JOB = 'job_id=~"$job_id"'
RI = "[$__rate_interval]"


def quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{{{JOB}}}{RI})))"


def mean(histogram: str) -> str:
    return f"sum(rate({histogram}_sum{{{JOB}}}{RI})) / sum(rate({histogram}_count{{{JOB}}}{RI}))"


dashboard = build_dashboard(
    title="gpufeed / Job",
    uid="gpufeed-job",
    description="One job: its GPUs with their underutilization windows and causes, the "
    "phases it reports, step rate, checkpoints, epochs and its I/O per tier.",
    variables=[instance_variable(), job_id_variable(multi=False)],
    annotations=[window_annotation(JOB)],
    rows=[
        (
            "GPUs and underutilization windows",
            [
                timeseries(
                    "Utilization of the job's GPUs",
                    [
                        target(
                            f"instance_gpu_job_id:gpufeed_gpu_utilization_ratio:held{{{JOB}}}",
                            "{{instance}} GPU {{gpu}}",
                        )
                    ],
                    RATIO,
                    max_value=1,
                ),
                state_timeline(
                    "Windows and causes per GPU",
                    [
                        target(
                            "max by (instance, gpu, cause) "
                            f"(gpufeed_gpu_underutilization_cause{{{JOB}}})",
                            "{{instance}} GPU {{gpu}} {{cause}}",
                        )
                    ],
                    description="A band while a window is open, coloured by its cause.",
                ),
                timeseries(
                    "GPU-hours lost per hour, by cause",
                    [
                        target(
                            "sum by (cause) (rate(gpufeed_gpu_underutilized_seconds_total"
                            f'{{{JOB}, cause!="low_demand"}}{RI}))',
                            "{{cause}}",
                        )
                    ],
                    GPU_HOURS_PER_HOUR,
                    stacked=True,
                    by_cause=True,
                    description="low_demand (a serving GPU with no request waiting) is spare "
                    "capacity, not lost time: it is in the Serving row.",
                ),
            ],
        ),
        (
            "Serving (inference: vLLM, Triton, TGI)",
            [
                timeseries(
                    "Requests waiting and running",
                    [
                        target(
                            f"sum by (instance) (gpufeed_serving_requests_waiting{{{JOB}}})",
                            "{{instance}} waiting",
                        ),
                        target(
                            f"sum by (instance) (gpufeed_serving_requests_running{{{JOB}}})",
                            "{{instance}} running",
                        ),
                    ],
                    PER_SECOND,
                    description="The serving stack's own queue (docs/serving.md): waiting "
                    "requests while the GPUs are busy is saturation (InferenceSaturated); "
                    "none waiting while they idle is low demand.",
                ),
                timeseries(
                    "KV-cache usage",
                    [
                        target(
                            "max by (instance, endpoint) "
                            f"(gpufeed_serving_kv_cache_usage_ratio{{{JOB}}})",
                            "{{instance}} {{endpoint}}",
                        )
                    ],
                    RATIO,
                    max_value=1,
                    description="vLLM only (Triton and TGI do not export it).",
                ),
                timeseries(
                    "Requests completed per second",
                    [
                        target(
                            "sum by (instance) (rate("
                            f"gpufeed_serving_requests_completed_total{{{JOB}}}{RI}))",
                            "{{instance}}",
                        )
                    ],
                    PER_SECOND,
                ),
                timeseries(
                    "GPU-hours idle for lack of demand (low_demand)",
                    [
                        target(
                            "sum by (instance) (rate(gpufeed_gpu_underutilized_seconds_total"
                            f'{{{JOB}, cause="low_demand"}}{RI}))',
                            "{{instance}}",
                        ),
                        target(
                            f"max by (instance, endpoint) (gpufeed_serving_up{{{JOB}}})",
                            "{{instance}} {{endpoint}} up",
                        ),
                    ],
                    GPU_HOURS_PER_HOUR,
                    description="Serving GPUs underused with no request waiting: capacity "
                    "beyond demand (InferenceIdleNoDemand), not a fault. `up` 0: the agent "
                    "cannot read the server's metrics (its demand is unknown, not zero).",
                ),
            ],
        ),
        (
            "Phases and progress",
            [
                timeseries(
                    "Phase breakdown",
                    [
                        target(
                            f"sum by (phase) (rate(gpufeed_job_phase_seconds_total{{{JOB}}}{RI}))",
                            "{{phase}}",
                        )
                    ],
                    RATIO,
                    percent=True,
                    description="Share of time in each phase the job's SDK reports "
                    "(compute, data_wait, checkpoint, communication, ...).",
                ),
                timeseries(
                    "Step rate",
                    [
                        target(
                            f"max by (job_id) (rate(gpufeed_job_steps_total{{{JOB}}}{RI}))",
                            "{{job_id}}",
                        )
                    ],
                    PER_SECOND,
                    description="Steps per second on the job's busiest node. The agent "
                    "adds up the steps of every process of the job on a node, so with N "
                    "data-parallel ranks per node one global step counts N times.",
                ),
            ],
        ),
        (
            "Checkpoints and epochs",
            [
                timeseries(
                    "Checkpoint duration",
                    [
                        target(mean("gpufeed_job_checkpoint_seconds"), "mean"),
                        target(quantile(0.95, "gpufeed_job_checkpoint_seconds"), "p95"),
                    ],
                    SECONDS,
                ),
                timeseries(
                    "Checkpoint bytes written",
                    [
                        target(
                            "sum by (job_id) (rate("
                            f"gpufeed_job_checkpoint_written_bytes_total{{{JOB}}}{RI}))",
                            "{{job_id}}",
                        )
                    ],
                    BYTES_PER_SECOND,
                ),
                timeseries(
                    "Epoch duration",
                    [
                        target(mean("gpufeed_job_epoch_seconds"), "mean"),
                        target(quantile(0.5, "gpufeed_job_epoch_seconds"), "p50"),
                    ],
                    SECONDS,
                ),
            ],
        ),
        (
            "GPU-time ledger (gpufeed fleet)",
            [
                timeseries(
                    "GPU-hours per hour by state",
                    [
                        target(
                            "sum by (state) (max by (job_id, state, culprit_cause) (rate("
                            f"gpufeed_fleet_job_gpu_seconds_total{{{JOB}}}{RI})))",
                            "{{state}}",
                        )
                    ],
                    GPU_HOURS_PER_HOUR,
                    stacked=True,
                    description="The job's allocated GPUs split into productive time and "
                    "each cause (the fleet service's ledger; max over its replicas). The "
                    "stack's top is the job's allocation.",
                ),
                table(
                    "GPU-hours and cost by state (time range)",
                    [
                        target(
                            "sum by (state, culprit_cause) (max by (job_id, state, "
                            "culprit_cause) (increase("
                            f"gpufeed_fleet_job_gpu_seconds_total{{{JOB}}}[$__range]))) / 3600",
                            instant=True,
                            table=True,
                        ),
                        target(
                            "sum by (state, culprit_cause, currency) (max by (job_id, state, "
                            "culprit_cause, currency) (increase("
                            f"gpufeed_fleet_job_cost_total{{{JOB}}}[$__range])))",
                            instant=True,
                            table=True,
                        ),
                    ],
                    GPU_HOURS,
                    description="Straggler time names the culprit's cause; the cost needs "
                    "a price per GPU-hour in the fleet service (--ledger.price).",
                    sort_by="Value #A",
                ),
                table(
                    "Held back by",
                    [
                        target(
                            "max by (job_id, culprit_instance, culprit_gpu, culprit_rank, "
                            f"cause) (gpufeed_fleet_job_culprit_info{{{JOB}}})",
                            instant=True,
                            table=True,
                        )
                    ],
                    PER_SECOND,
                    description="The culprit the fleet service names while the job waits "
                    "for one of its GPUs or nodes, and the culprit's own cause.",
                    sort_by="cause",
                ),
                table(
                    "Imbalance (no worker at fault)",
                    [
                        target(
                            "max by (job_id, reason, pipeline_stage) "
                            f"(gpufeed_fleet_job_imbalance_info{{{JOB}}})",
                            instant=True,
                            table=True,
                        )
                    ],
                    PER_SECOND,
                    description="The job waits for its own imbalance: a pipeline stage "
                    "slower on every replica (stage_imbalance: rebalance its layers) or a "
                    "slowest data-parallel rank that changes every step (input_imbalance: "
                    "bucket or pack the batches). For the job's owners (GpuJobImbalanced).",
                    sort_by="reason",
                ),
                timeseries(
                    "Collective wait by pipeline stage",
                    [
                        target(
                            "avg by (pp_rank) (rate(gpufeed_job_rank_phase_seconds_total{"
                            f'{JOB}, phase="collective_wait"}}{RI})'
                            " * on (instance, job_id, rank) group_left (pp_rank) "
                            f'max by (instance, job_id, rank, pp_rank) (gpufeed_job_rank_info{{{JOB}, pp_rank!=""}}))',
                            "stage {{pp_rank}}",
                        )
                    ],
                    RATIO,
                    max_value=1,
                    description="Seconds per second the ranks of each pipeline stage wait in "
                    "collectives (mean over the stage's ranks; the ranks' pp_rank as they "
                    "report it). The stage every replica waits for waits least.",
                ),
            ],
        ),
        (
            "I/O per tier",
            [
                timeseries(
                    "Read per tier",
                    [
                        target(
                            "sum by (tier) (rate("
                            f"gpufeed_job_storage_read_bytes_total{{{JOB}}}{RI}))",
                            "{{tier}}",
                        )
                    ],
                    BYTES_PER_SECOND,
                ),
                timeseries(
                    "Written per tier",
                    [
                        target(
                            "sum by (tier) (rate("
                            f"gpufeed_job_storage_written_bytes_total{{{JOB}}}{RI}))",
                            "{{tier}}",
                        )
                    ],
                    BYTES_PER_SECOND,
                ),
            ],
        ),
    ],
)
