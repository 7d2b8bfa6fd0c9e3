"""Job: one training job's GPUs, windows and causes, phases, steps, checkpoints and I/O."""

from dashboards.presets import (
    BYTES_PER_SECOND,
    GPU_HOURS_PER_HOUR,
    PER_SECOND,
    RATIO,
    SECONDS,
    build_dashboard,
    instance_variable,
    job_id_variable,
    state_timeline,
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
                            "sum by (cause) (rate("
                            f"gpufeed_gpu_underutilized_seconds_total{{{JOB}}}{RI}))",
                            "{{cause}}",
                        )
                    ],
                    GPU_HOURS_PER_HOUR,
                    stacked=True,
                    by_cause=True,
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
