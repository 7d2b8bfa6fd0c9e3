"""Node: everything one node's agent sees, with underutilization windows as annotations."""

from dashboards.presets import (
    BYTES,
    BYTES_PER_SECOND,
    CELSIUS,
    HERTZ,
    OPS_PER_SECOND,
    PER_SECOND,
    RATIO,
    SECONDS,
    WATTS,
    build_dashboard,
    instance_variable,
    target,
    tier_variable,
    timeseries,
    window_annotation,
)

NODE = 'instance=~"$instance"'
TIERS = 'instance=~"$instance", tier=~"$tier"'
RI = "[$__rate_interval]"


def per_gpu(metric: str) -> str:
    return f"{metric}{{{NODE}}}"


def gpu_rate(metric: str) -> str:
    # link="" keeps the per-GPU sum and skips the optional per-link series, which would
    # count the same bytes twice.
    return f'rate({metric}{{{NODE}, link=""}}{RI})'


def tier_rate(counter: str) -> str:
    return f"sum by (tier) (rate(gpufeed_storage_{counter}_total{{{TIERS}}}{RI}))"


dashboard = build_dashboard(
    title="gpufeed / Node",
    uid="gpufeed-node",
    description="One node: per-GPU activity, interconnect, clocks, power and temperature; "
    "storage tiers, fabric and host. Underutilization windows are annotations.",
    variables=[instance_variable(multi=False), tier_variable()],
    annotations=[window_annotation(NODE)],
    rows=[
        (
            "GPU activity",
            [
                timeseries(
                    "GPU utilization",
                    [target(per_gpu("gpufeed_gpu_utilization_ratio"), "GPU {{gpu}}")],
                    RATIO,
                    max_value=1,
                ),
                timeseries(
                    "SM activity",
                    [target(per_gpu("gpufeed_gpu_sm_active_ratio"), "GPU {{gpu}}")],
                    RATIO,
                    max_value=1,
                    description="NVML GPM; absent on GPUs before Hopper.",
                ),
                timeseries(
                    "Memory bandwidth utilization",
                    [
                        target(
                            per_gpu("gpufeed_gpu_memory_bandwidth_utilization_ratio"), "GPU {{gpu}}"
                        )
                    ],
                    RATIO,
                    max_value=1,
                ),
            ],
        ),
        (
            "GPU interconnect",
            [
                timeseries(
                    "NVLink traffic",
                    [
                        target(
                            gpu_rate("gpufeed_gpu_nvlink_transmit_bytes_total"), "GPU {{gpu}} tx"
                        ),
                        target(
                            gpu_rate("gpufeed_gpu_nvlink_receive_bytes_total"), "GPU {{gpu}} rx"
                        ),
                    ],
                    BYTES_PER_SECOND,
                ),
                timeseries(
                    "PCIe traffic",
                    [
                        target(
                            f"rate(gpufeed_gpu_pcie_transmit_bytes_total{{{NODE}}}{RI})",
                            "GPU {{gpu}} to host",
                        ),
                        target(
                            f"rate(gpufeed_gpu_pcie_receive_bytes_total{{{NODE}}}{RI})",
                            "GPU {{gpu}} from host",
                        ),
                    ],
                    BYTES_PER_SECOND,
                ),
            ],
        ),
        (
            "GPU clocks, power and temperature",
            [
                timeseries(
                    "SM clock",
                    [target(per_gpu("gpufeed_gpu_sm_clock_hertz"), "GPU {{gpu}}")],
                    HERTZ,
                ),
                timeseries(
                    "Clock event reasons (GPUs affected)",
                    [
                        target(
                            f"sum by (reason) (gpufeed_gpu_clock_event_active{{{NODE}}})",
                            "{{reason}}",
                        )
                    ],
                    PER_SECOND,
                    stacked=True,
                ),
                timeseries(
                    "Power",
                    [target(per_gpu("gpufeed_gpu_power_watts"), "GPU {{gpu}}")],
                    WATTS,
                ),
                timeseries(
                    "Temperature",
                    [target(per_gpu("gpufeed_gpu_temperature_celsius"), "GPU {{gpu}}")],
                    CELSIUS,
                ),
            ],
        ),
        (
            "Storage tiers",
            [
                timeseries(
                    "Throughput",
                    [
                        target(tier_rate("read_bytes"), "{{tier}} read"),
                        target(tier_rate("written_bytes"), "{{tier}} write"),
                    ],
                    BYTES_PER_SECOND,
                ),
                timeseries(
                    "IOPS",
                    [
                        target(tier_rate("reads_completed"), "{{tier}} read"),
                        target(tier_rate("writes_completed"), "{{tier}} write"),
                    ],
                    OPS_PER_SECOND,
                ),
                timeseries(
                    "Mean latency",
                    [
                        target(
                            f"{tier_rate('read_time_seconds')} / {tier_rate('reads_completed')}",
                            "{{tier}} read",
                        ),
                        target(
                            f"{tier_rate('write_time_seconds')} / {tier_rate('writes_completed')}",
                            "{{tier}} write",
                        ),
                    ],
                    SECONDS,
                ),
                timeseries(
                    "Queue depth",
                    [target(tier_rate("io_time_weighted_seconds"), "{{tier}}")],
                    PER_SECOND,
                    description="Average requests in flight (block devices only).",
                ),
                timeseries(
                    "Free space",
                    [
                        target(
                            f"gpufeed_storage_free_bytes{{{TIERS}}}",
                            "{{tier}} {{mountpoint}}",
                        )
                    ],
                    BYTES,
                ),
            ],
        ),
        (
            "Network fabric",
            [
                timeseries(
                    "Throughput against link speed",
                    [
                        target(
                            f"rate(gpufeed_network_receive_bytes_total{{{NODE}}}{RI})",
                            "{{device}} {{port}} rx",
                        ),
                        target(
                            f"rate(gpufeed_network_transmit_bytes_total{{{NODE}}}{RI})",
                            "{{device}} {{port}} tx",
                        ),
                        target(
                            f"gpufeed_network_speed_bytes_per_second{{{NODE}}}",
                            "{{device}} {{port}} link speed",
                        ),
                    ],
                    BYTES_PER_SECOND,
                ),
                timeseries(
                    "Transmit wait (congestion)",
                    [
                        target(
                            f"rate(gpufeed_network_transmit_wait_seconds_total{{{NODE}}}{RI})",
                            "{{device}} {{port}}",
                        )
                    ],
                    RATIO,
                    description="Fraction of time a port had data to send but could not.",
                ),
                timeseries(
                    "Link faults (network_reason link_errors)",
                    [
                        target(
                            f"rate(gpufeed_network_link_errors_total{{{NODE}}}{RI})",
                            "{{device}} {{port}} {{counter}}",
                        ),
                        target(
                            # 1 while a port is down: a flat 0 line per port when all is well
                            f"1 - gpufeed_network_link_up{{{NODE}}}",
                            "{{device}} {{port}} down",
                        ),
                    ],
                    PER_SECOND,
                    description="Link downs, carrier changes and error counters per second, "
                    "by the kernel's counter name, and ports that are down (1): what decides a "
                    "network window's link_errors reason.",
                ),
                timeseries(
                    "Congestion packets (network_reason congestion)",
                    [
                        target(
                            f"rate(gpufeed_network_congestion_packets_total{{{NODE}}}{RI})",
                            "{{device}} {{port}} {{counter}}",
                        )
                    ],
                    PER_SECOND,
                    description="RoCE ECN marks and CNPs, InfiniBand transmit discards: with "
                    "transmit-wait, what decides a network window's congestion reason.",
                ),
                timeseries(
                    "Fabric round trips (GPU jobs' TCP connections)",
                    [
                        target(f"gpufeed_fabric_rtt_seconds{{{NODE}}}", "RTT {{peer}}"),
                        target(f"gpufeed_fabric_rtt_jitter_seconds{{{NODE}}}", "jitter {{peer}}"),
                    ],
                    SECONDS,
                    description="Smoothed round-trip time and its variation (jitter) of the "
                    "TCP connections of the processes holding GPUs, from the kernel's socket "
                    "diagnostics (no probe traffic); per peer node and, without a peer, for "
                    "the whole node. A network window names them when they rose; "
                    "FabricJitterHigh fires on the node's jitter.",
                ),
            ],
        ),
        (
            "Host",
            [
                timeseries(
                    "CPU by mode",
                    [
                        target(
                            "sum by (mode) (rate(gpufeed_host_cpu_seconds_total"
                            f'{{{NODE}, mode!="idle"}}{RI}))'
                            f" / scalar(sum(gpufeed_host_cpus{{{NODE}}}))",
                            "{{mode}}",
                        )
                    ],
                    RATIO,
                    stacked=True,
                    max_value=1,
                ),
                timeseries(
                    "Pressure (PSI)",
                    [
                        target(
                            f"rate(gpufeed_host_pressure_waiting_seconds_total{{{NODE}}}{RI})",
                            "{{resource}} some",
                        ),
                        target(
                            f"rate(gpufeed_host_pressure_stalled_seconds_total{{{NODE}}}{RI})",
                            "{{resource}} full",
                        ),
                    ],
                    RATIO,
                    description="Share of time some (or all) tasks waited for the resource.",
                ),
                timeseries(
                    "Memory available",
                    [target(f"gpufeed_host_memory_available_bytes{{{NODE}}}", "available")],
                    BYTES,
                ),
            ],
        ),
    ],
)
