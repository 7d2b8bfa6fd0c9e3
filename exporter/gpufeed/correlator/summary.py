"""The one-line, human summary of a window, built from the evidence that decided it."""

from __future__ import annotations

from collections.abc import Mapping

from gpufeed.correlator.causes import Cause

HEADLINES = {
    Cause.DATA_LOADING: "waits for data from storage",
    Cause.PREPROCESSING: "waits for input; the CPUs are saturated",
    Cause.CHECKPOINTING: "is stalled by a checkpoint",
    Cause.NETWORK: "is held back by the network",
    Cause.THROTTLING: "is slowed by clock throttling",
    Cause.STARTUP: "is starting up",
    Cause.IDLE: "is idle",
    Cause.GPU_ERROR: "has failed",
    Cause.UNKNOWN: "is underutilized and no signal stands out",
}


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _x(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x"


def _rate(x: float) -> str:
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if x >= div:
            return f"{x / div:.1f} {unit}"
    return f"{x:.0f} B/s"


def _phrase(name: str, v: float, ctx: Mapping[str, str]) -> str | None:
    tier = ctx.get("data_tier", "data")
    dev = ctx.get("network_device", "the fabric")
    table = {
        "data_tier_read_latency_x_baseline": f"{tier} tier read latency {_x(v)} its 1-hour median",
        "data_tier_busy_ratio": f"{tier} tier {_pct(v)} busy",
        "data_tier_queue_x_baseline": f"{tier} tier queue depth {_x(v)} normal",
        "data_tier_read_peak_ratio": f"{tier} tier reads at {_pct(v)} of their peak",
        "io_pressure_ratio": f"I/O pressure {_pct(v)}",
        "iowait_ratio": f"iowait {_pct(v)}",
        "sdk_data_wait_share": f"job waits for input {_pct(v)} of the time",
        "io_pressure_while_waiting_for_input": f"I/O pressure {_pct(v)} while the job waits for input",
        "cpu_busy_ratio": f"CPUs {_pct(v)} busy",
        "cpu_pressure_ratio": f"CPU pressure {_pct(v)}",
        "write_burst_x_baseline": f"write burst to the {ctx.get('checkpoint_tier', '?')} tier {_x(v)} normal",
        "job_checkpoint_write_bytes_per_second": f"checkpoint writes {_rate(v)}",
        "sdk_checkpoint_share": f"job in checkpoint {_pct(v)} of the time",
        "job_gpus_stalled_ratio": f"{_pct(v)} of the job's GPUs stalled together",
        "network_utilization_ratio": f"{dev} at {_pct(v)} of link speed",
        "network_transmit_wait_x_baseline": f"{dev} transmit-wait {_x(v)} normal",
        "network_throughput_drop_ratio": f"throughput down {_pct(v)}",
        "nvlink_peak_ratio": f"NVLink at {_pct(v)} of its peak",
        "sdk_communication_share": f"job in communication {_pct(v)} of the time",
        "clock_events_active": f"clock event reasons active ({ctx.get('throttle_reasons', '?')})",
        "job_peer_clock_events_active": (
            f"waiting for throttled GPU {ctx.get('throttled_peers', '?')} of the same job"
            f" ({ctx.get('throttle_reasons', '?')})"
        ),
        "sm_clock_drop_ratio": f"SM clock down {_pct(v)}",
        "job_not_yet_busy": "the job has not computed since it (re)started",
        "sdk_startup_share": f"job reports start-up {_pct(v)} of the time",
        "no_job": "no job holds the GPU",
        "gpu_memory_idle": "nothing is resident on the GPU",
        "gpu_lost": "the GPU is lost (gpufeed_gpu_up 0)",
        "xid_fatal_events": f"fatal XID {ctx.get('xids', '?')}",
        "job_peer_gpu_error": f"GPU {ctx.get('failed_peers', '?')} of the same job has failed",
    }
    return table.get(name)


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
    phrases = [p for name, v in evidence.items() if (p := _phrase(name, v, context))]
    line = f"{who} {HEADLINES[cause]}"
    if phrases:
        line += ": " + ", ".join(phrases[:limit])
    return line
