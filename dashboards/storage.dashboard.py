"""Storage tiers: each tier across the fleet, and which jobs load it."""

from dashboards.presets import (
    BYTES,
    BYTES_PER_SECOND,
    OPS_PER_SECOND,
    PER_SECOND,
    RATIO,
    SECONDS,
    build_dashboard,
    instance_variable,
    table,
    target,
    tier_variable,
    timeseries,
)

TIER = 'tier=~"$tier"'
NODES_TIER = 'instance=~"$instance", tier=~"$tier"'
# object-storage tiers have no mount, so they are not among $tier's values (capacity)
NODES = 'instance=~"$instance"'
RI = "[$__rate_interval]"


def recorded(name: str) -> str:
    """A fleet-wide per-tier aggregate from the recording rules (alerts/)."""
    return f"tier:gpufeed_storage_{name}{{{TIER}}}"


dashboard = build_dashboard(
    title="gpufeed / Storage tiers",
    uid="gpufeed-storage",
    description="Per tier across the fleet: throughput, IOPS, latency, queue depth, "
    "capacity, and the jobs that load each tier.",
    variables=[instance_variable(), tier_variable()],
    rows=[
        (
            "Throughput and IOPS (fleet)",
            [
                timeseries(
                    "Throughput",
                    [
                        target(recorded("read_bytes:rate5m"), "{{tier}} read"),
                        target(recorded("written_bytes:rate5m"), "{{tier}} write"),
                    ],
                    BYTES_PER_SECOND,
                ),
                timeseries(
                    "IOPS",
                    [
                        target(recorded("reads_completed:rate5m"), "{{tier}} read"),
                        target(recorded("writes_completed:rate5m"), "{{tier}} write"),
                    ],
                    OPS_PER_SECOND,
                ),
            ],
        ),
        (
            "Latency and queue depth (fleet)",
            [
                timeseries(
                    "Mean latency",
                    [
                        target(
                            f"{recorded('read_time_seconds:rate5m')}"
                            f" / {recorded('reads_completed:rate5m')}",
                            "{{tier}} read",
                        ),
                        target(
                            f"{recorded('write_time_seconds:rate5m')}"
                            f" / {recorded('writes_completed:rate5m')}",
                            "{{tier}} write",
                        ),
                    ],
                    SECONDS,
                ),
                timeseries(
                    "Queue depth",
                    [target(recorded("io_time_weighted_seconds:rate5m"), "{{tier}}")],
                    PER_SECOND,
                    description="Requests in flight, summed over the tier's block devices.",
                ),
                table(
                    "Busiest devices",
                    [
                        target(
                            "topk(10, max by (instance, tier, mountpoint, device) (rate("
                            f"gpufeed_storage_io_time_seconds_total{{{NODES_TIER}}}{RI})))",
                            instant=True,
                            table=True,
                        )
                    ],
                    RATIO,
                    sort_by="Value",
                ),
            ],
        ),
        (
            "Capacity (fleet)",
            [
                timeseries(
                    "Capacity and free space",
                    [
                        target(recorded("capacity_bytes:sum"), "{{tier}} capacity"),
                        target(recorded("free_bytes:sum"), "{{tier}} free"),
                    ],
                    BYTES,
                ),
                timeseries(
                    "Used",
                    [
                        target(
                            f"1 - {recorded('free_bytes:sum')} / {recorded('capacity_bytes:sum')}",
                            "{{tier}}",
                        )
                    ],
                    RATIO,
                    max_value=1,
                ),
            ],
        ),
        (
            "Targets (per node; tier_targets in the agents' config)",
            [
                timeseries(
                    "Read latency against target",
                    [
                        target(
                            "sum by (instance, tier) (rate(gpufeed_storage_read_time_seconds_total"
                            f"{{{NODES_TIER}}}{RI})) / sum by (instance, tier) (rate("
                            f"gpufeed_storage_reads_completed_total{{{NODES_TIER}}}{RI}))",
                            "{{instance}} {{tier}}",
                        ),
                        target(
                            "max by (tier) (gpufeed_storage_tier_target_read_latency_seconds"
                            f"{{{NODES_TIER}}})",
                            "{{tier}} target",
                        ),
                    ],
                    SECONDS,
                    description="Mean read latency per node and tier, and each tier's target "
                    "(StorageTierMissesTarget fires above it while jobs wait for data).",
                ),
                timeseries(
                    "Read throughput against target",
                    [
                        target(
                            "sum by (instance, tier) (rate(gpufeed_storage_read_bytes_total"
                            f"{{{NODES_TIER}}}{RI}))",
                            "{{instance}} {{tier}}",
                        ),
                        target(
                            "max by (tier) (gpufeed_storage_tier_target_read_bytes_per_second"
                            f"{{{NODES_TIER}}})",
                            "{{tier}} target",
                        ),
                    ],
                    BYTES_PER_SECOND,
                ),
            ],
        ),
        (
            "GPUDirect Storage (nvidia-fs)",
            [
                timeseries(
                    "GDS throughput",
                    [
                        target(
                            "sum by (instance, op) (rate(gpufeed_storage_gds_bytes_total"
                            f'{{instance=~"$instance"}}{RI}))',
                            "{{instance}} {{op}}",
                        )
                    ],
                    BYTES_PER_SECOND,
                    description="Reads and writes through the nvidia-fs driver (whole MiB).",
                ),
                timeseries(
                    "GDS latency",
                    [
                        target(
                            'gpufeed_storage_gds_latency_seconds{instance=~"$instance"}',
                            "{{instance}} {{op}} latency",
                        ),
                    ],
                    SECONDS,
                ),
                timeseries(
                    "GDS errors",
                    [
                        target(
                            "sum by (instance, op, kind) (rate(gpufeed_storage_gds_errors_total"
                            f'{{instance=~"$instance"}}{RI}))',
                            "{{instance}} {{op}} {{kind}}",
                        )
                    ],
                    PER_SECOND,
                ),
                timeseries(
                    "GPU memory for GDS",
                    [
                        target(
                            'gpufeed_storage_gds_gpu_pinned_bytes{instance=~"$instance"}',
                            "{{instance}} {{uuid}} pinned",
                        ),
                        target(
                            'gpufeed_storage_gds_gpu_bounce_buffer_bytes{instance=~"$instance"}',
                            "{{instance}} {{uuid}} bounce buffers",
                        ),
                    ],
                    BYTES,
                    description="Bounce buffers in use: GDS I/O that could not go directly "
                    "to the application's GPU buffer.",
                ),
            ],
        ),
        (
            "Page cache",
            [
                timeseries(
                    "Job page-cache hit ratio",
                    [
                        target(
                            "1 - sum by (job_id) (rate(gpufeed_job_cache_fetched_read_bytes_total"
                            f'{{instance=~"$instance"}}{RI})) / sum by (job_id) (rate('
                            f'gpufeed_job_cache_requested_read_bytes_total{{instance=~"$instance"}}'
                            f"{RI}))",
                            "{{job_id}}",
                        )
                    ],
                    RATIO,
                    max_value=1,
                    description="Share of the bytes a job's reads returned that storage did not "
                    "have to fetch (/proc/PID/io: 1 - read_bytes / rchar). Pipe and socket "
                    "reads count as hits, readahead never read as misses (docs/storage.md).",
                ),
                timeseries(
                    "NFS client cache hit ratio",
                    [
                        target(
                            "1 - sum by (tier) (rate(gpufeed_storage_read_bytes_total"
                            f"{{{NODES_TIER}}}{RI})) / sum by (tier) (rate("
                            f"gpufeed_storage_nfs_requested_read_bytes_total{{{NODES_TIER}}}{RI}))",
                            "{{tier}}",
                        )
                    ],
                    RATIO,
                    max_value=1,
                    description="NFS tiers: 1 - bytes read from the server / bytes applications "
                    "read (mountstats).",
                ),
                timeseries(
                    "Jobs' open files in the page cache",
                    [
                        target(
                            "sum by (tier) (gpufeed_job_cache_resident_bytes"
                            f"{{{NODES_TIER}}}) / sum by (tier) (gpufeed_job_cache_open_file_bytes"
                            f"{{{NODES_TIER}}})",
                            "{{tier}} resident",
                        ),
                        target(
                            "sum by (tier) (gpufeed_job_cache_evicted_bytes"
                            f"{{{NODES_TIER}}}) / sum by (tier) (gpufeed_job_cache_open_file_bytes"
                            f"{{{NODES_TIER}}})",
                            "{{tier}} evicted by reclaim",
                        ),
                    ],
                    RATIO,
                    max_value=1,
                    description="Of the files jobs hold open on block-backed tiers (cachestat): "
                    "resident, and evicted by memory reclaim (a dataset that outgrew memory).",
                ),
            ],
        ),
        (
            "Object storage (s3:// tiers)",
            [
                timeseries(
                    "Object-storage throughput",
                    [
                        target(
                            "sum by (tier) (rate(gpufeed_object_storage_read_bytes_total"
                            f"{{{NODES}}}{RI}))",
                            "{{tier}} read",
                        ),
                        target(
                            "sum by (tier) (rate(gpufeed_object_storage_written_bytes_total"
                            f"{{{NODES}}}{RI}))",
                            "{{tier}} write",
                        ),
                    ],
                    BYTES_PER_SECOND,
                    description="Bytes jobs moved to and from object-storage tiers, as their "
                    "processes reported them (gpufeed run's S3 clients, Job.add_io).",
                ),
                timeseries(
                    "Object-storage requests",
                    [
                        target(
                            "sum by (tier, operation) (rate("
                            f"gpufeed_object_storage_requests_total{{{NODES}}}{RI}))",
                            "{{tier}} {{operation}}",
                        )
                    ],
                    OPS_PER_SECOND,
                ),
                timeseries(
                    "Object-storage request latency",
                    [
                        target(
                            "sum by (tier, operation) (rate("
                            f"gpufeed_object_storage_request_seconds_total{{{NODES}}}{RI}))"
                            " / sum by (tier, operation) (rate("
                            f"gpufeed_object_storage_requests_total{{{NODES}}}{RI}))",
                            "{{tier}} {{operation}}",
                        )
                    ],
                    SECONDS,
                    description="Mean time from request to response headers (S3's first-byte "
                    "latency); the S3 connector's reads: to the last byte.",
                ),
                timeseries(
                    "Throttled and failed requests",
                    [
                        target(
                            "sum by (tier, reason) (rate(gpufeed_object_storage_errors_total"
                            f"{{{NODES}}}{RI})) / on (tier) group_left sum by (tier) (rate("
                            f"gpufeed_object_storage_requests_total{{{NODES}}}{RI}))",
                            "{{tier}} {{reason}}",
                        )
                    ],
                    RATIO,
                    max_value=1,
                    description="Share of a tier's requests refused as too many (throttled: "
                    "HTTP 503 SlowDown, 429) or failed otherwise.",
                ),
            ],
        ),
        (
            "Jobs loading each tier",
            [
                timeseries(
                    "Top readers",
                    [
                        target(
                            "topk(10, sum by (tier, job_id) (rate("
                            f"gpufeed_job_storage_read_bytes_total{{{NODES_TIER}}}{RI})))",
                            "{{tier}} {{job_id}}",
                        )
                    ],
                    BYTES_PER_SECOND,
                ),
                timeseries(
                    "Top writers",
                    [
                        target(
                            "topk(10, sum by (tier, job_id) (rate("
                            f"gpufeed_job_storage_written_bytes_total{{{NODES_TIER}}}{RI})))",
                            "{{tier}} {{job_id}}",
                        )
                    ],
                    BYTES_PER_SECOND,
                ),
            ],
        ),
    ],
)
