"""What the scheduler exporter and the fabric RTT add to windows (engine/backlog.py): an
idle GPU while GPU jobs pend says fragmentation or stall and shows the queue; a network
window names the round trips and jitter of the job's connections against their level
before it. Hand-made series and the bench's network scenario, through `gpufeed analyze`'s
trace reader. tests/test_correlator_prometheus_backlog.py: the scheduler exporter's
series, under its own instance in a real Prometheus, reach every node's windows."""

from __future__ import annotations

from collections.abc import Iterable

from correlator_helpers import T0, analyze_text, scenarios, trace_text
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.window import Window

G = 'gpu="0",uuid="GPU-a",instance="n1:9400"'
JOB = 'gpufeed_job_info{job_id="j",gpu="0",uuid="GPU-a",scheduler="slurm",name="x",instance="n1:9400"}'
# The scheduler's series as a TSDB feed hands them to this node (feeds/promql.py shares the
# scheduler exporter's series with every node; a trace file routes by instance).
S = 'instance="n1:9400"'


def idle_between(start: float, end: float, backlog: str | None, backlog_share: float = 1.0):
    """GPU 0 busy with job j, idle without a job in [start, end); the scheduler shows 2 GPU
    jobs pending and `backlog` over the first `backlog_share` of that time."""

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        idle = start <= s < end
        yield f"gpufeed_gpu_up{{{G}}}", 1.0
        yield f"gpufeed_gpu_utilization_ratio{{{G}}}", 0.0 if idle else 0.95
        if not idle:
            yield JOB, 1.0
        yield f'gpufeed_scheduler_gpus{{state="free",{S}}}', 3.0 if idle else 0.0
        yield f"gpufeed_scheduler_node_free_gpus_max{{{S}}}", 2.0 if idle else 0.0
        yield f'gpufeed_scheduler_pending_jobs{{queue="gpu",reason="Resources",{S}}}', 1.0
        yield f'gpufeed_scheduler_pending_jobs{{queue="gpu",reason="Priority",{S}}}', 1.0
        on = idle and backlog is not None and s < start + backlog_share * (end - start)
        if on:
            yield f'gpufeed_scheduler_backlog_idle_gpus{{reason="{backlog}",{S}}}', 3.0

    return gen


def test_idle_while_jobs_pend_says_fragmentation_and_the_queue(tmp_path: object) -> None:
    (w,) = analyze_text(trace_text(idle_between(600, 1200, "fragmentation"), 1500), tmp_path)
    ev = dict(w.evidence)
    assert w.cause is Cause.IDLE  # still idle: no job holds the GPU
    assert ev[Ctx.SCHEDULER_BACKLOG] == "fragmentation"
    queue = "2 GPU jobs pend (1 Priority, 1 Resources) while 3 GPUs are free, at most 2 on one node"
    assert ev[Ctx.SCHEDULER_QUEUE] == queue
    assert w.summary.startswith(f"GPU 0 is idle while GPU jobs wait (fragmentation): {queue}")


def test_stall_and_plain_idle(tmp_path: object) -> None:
    (w,) = analyze_text(trace_text(idle_between(600, 1200, "stall"), 1500), tmp_path)
    assert dict(w.evidence)[Ctx.SCHEDULER_BACKLOG] == "stall"
    # a backlog over a fifth of the window does not make the window's reason
    (w,) = analyze_text(trace_text(idle_between(600, 1200, "stall", 0.2), 1500), tmp_path)
    assert Ctx.SCHEDULER_BACKLOG not in dict(w.evidence)
    assert w.summary.startswith("GPU 0 is idle:") or w.summary == "GPU 0 is idle"
    # no scheduler series at all (the live agent, a node's own trace): nothing added
    (w,) = analyze_text(trace_text(idle_between(600, 1200, None), 1500), tmp_path)
    assert Ctx.SCHEDULER_BACKLOG not in dict(w.evidence)


def network_windows(tmp_path: object, rtt_jitter_during: tuple[float, float]) -> list[Window]:
    """The bench's congested-network scenario with fabric series: 0.2 ms RTT and 50 us
    jitter for 15 minutes before the fault, `rtt_jitter_during` through it."""
    text, labels = scenarios.single("network", "congested", seed=3, minutes=40)
    faults = [lb for lb in labels if lb.cause == "network"]  # one per GPU of the node
    start, end = min(f.start for f in faults), max(f.end for f in faults)
    inst = f'instance="{faults[0].instance}"'
    extra = []
    t = start - 900.0
    while t < end:
        rtt, jitter = rtt_jitter_during if t >= start else (0.0002, 0.00005)
        for peer, k in (("", 1.0), ("10.0.0.7", 1.0), ("10.0.0.9", 0.5)):
            labels_ = f'peer="{peer}",{inst}' if peer else inst
            extra.append(f"gpufeed_fabric_rtt_seconds{{{labels_}}} {rtt} {t:.3f}")
            extra.append(f"gpufeed_fabric_rtt_jitter_seconds{{{labels_}}} {jitter * k} {t:.3f}")
        t += 15.0
    text = text.replace("# EOF\n", "\n".join(extra) + "\n# EOF\n")
    ws = [w for w in analyze_text(text, tmp_path) if w.cause is Cause.NETWORK]
    assert ws, "the scenario's network fault is found"
    return ws


def test_network_window_names_rtt_and_jitter(tmp_path: object) -> None:
    ws = network_windows(tmp_path, (0.030, 0.008))
    ev = dict(ws[0].evidence)
    assert ev[Ctx.FABRIC_LATENCY] == (
        "RTT 30.0 ms, jitter 8.0 ms (before: 200 us, 50 us); most jitter to 10.0.0.7"
    )
    assert "RTT 30.0 ms, jitter 8.0 ms" in ws[0].summary


def test_a_steady_fabric_is_no_evidence(tmp_path: object) -> None:
    for w in network_windows(tmp_path, (0.0002, 0.00005)):
        assert Ctx.FABRIC_LATENCY not in dict(w.evidence)
