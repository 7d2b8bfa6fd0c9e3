"""Evidence features for one unit (a GPU, or a CPU-only job) at one instant.

Every feature is named after the signal it measures and is expressed relative to the
node's healthy baseline where that matters ("latency 6x its median"), or gated on a rise
above the baseline ("CPU 97% busy" counts only if the healthy job does not run its CPUs
that hot anyway). Context strings (which tier, which device) travel beside the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufeed import vocabulary
from gpufeed.correlator.baseline import Baselines
from gpufeed.correlator.rules import DATA_TIER_RULES
from gpufeed.correlator.view import NodeView

# Clock event reasons that slow a GPU down (sync_boost, idle and clock settings do not).
THROTTLE_REASONS = frozenset(
    {
        "hw_slowdown",
        "hw_thermal_slowdown",
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "sw_power_cap",
    }
)
# The XIDs that explain a stall as a GPU error: the one list the paging alert uses too.
FATAL_XIDS = frozenset(vocabulary.FATAL_XIDS)
MIN_TIER_READ_BYTES = 1e5  # a tier reading less than this is not feeding anyone
USUAL_TIER_READ_BYTES = 1e6  # healthy median above this: a tier the node's jobs read from
BURST_MIN_WRITE_BYTES = 5e7
# Baseline key kind of a job's read rate per tier: (JOB_READ, job_id, tier). The live
# correlator forgets an ended job's baselines by this prefix.
JOB_READ = "jrd"
WRITE_FLOOR_BYTES = 2e7


@dataclass(slots=True)
class Evidence:
    features: dict[str, float] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)


def observe_healthy(b: Baselines, view: NodeView) -> None:
    """Feeds one healthy bucket of node signals into the baselines."""
    for tier, tv in view.tiers.items():
        b.observe(("lat", tier), tv.read_latency_seconds)
        b.observe(("busy", tier), tv.busy_ratio)
        b.observe(("qd", tier), tv.queue_depth)
        b.observe(("rd", tier), tv.read_bytes_per_second)
        b.observe(("wr", tier), tv.write_bytes_per_second)
        b.peak(("rd", tier), tv.read_bytes_per_second)
    for net, nv in view.nets.items():
        b.observe(("txw", net), nv.transmit_wait_ratio)
        b.observe(("nbps", net), nv.bytes_per_second)
        b.observe(("nutil", net), nv.utilization_ratio)
    b.observe(("cpu",), view.cpu_busy_ratio)
    b.observe(("iowait",), view.iowait_ratio)
    b.observe(("psi", "cpu"), view.psi_some.get("cpu"))
    b.observe(("psi", "io"), view.psi_some.get("io"))
    for job_id, jv in view.jobs.items():
        for tier, r in jv.tier_read_bytes_per_second.items():
            b.observe((JOB_READ, job_id, tier), r)


def _rise(value: float | None, base: float | None, min_rise: float) -> float | None:
    """`value` if it stands above its baseline by `min_rise` (or no baseline yet), else 0."""
    if value is None:
        return None
    if base is None or value - base >= min_rise:
        return value
    return 0.0


def _tier_features(b: Baselines, tier: str, view: NodeView) -> dict[str, float]:
    tv = view.tiers[tier]
    f: dict[str, float] = {}
    if tv.read_latency_seconds is not None:
        base = b.median(("lat", tier))
        if base is not None:
            f["data_tier_read_latency_x_baseline"] = tv.read_latency_seconds / max(base, 5e-5)
    busy = _rise(tv.busy_ratio, b.median(("busy", tier)), 0.15)
    if busy is not None:
        f["data_tier_busy_ratio"] = busy
    if tv.queue_depth is not None:
        base = b.median(("qd", tier))
        f["data_tier_queue_x_baseline"] = tv.queue_depth / max(1.0 if base is None else base, 0.5)
    rd = tv.read_bytes_per_second
    peak = b.peak(("rd", tier), rd)
    base_rd = b.median(("rd", tier))
    if rd is not None and peak and peak > 1e6 and (base_rd is None or rd > 1.3 * base_rd):
        f["data_tier_read_peak_ratio"] = rd / peak
    return f


def _tier_stress(f: dict[str, float]) -> float:
    miss = 1.0
    for r in DATA_TIER_RULES:
        x = f.get(r.feature)
        if x is not None:
            miss *= 1.0 - r.weight * r.strength(x)
    return 1.0 - miss


def job_features(b: Baselines, view: NodeView, job_id: str, ev: Evidence) -> None:
    """Node- and job-level features (the same for every GPU of the job at this instant)."""
    f, ctx = ev.features, ev.context
    jv = view.jobs.get(job_id) if job_id else None
    # which tier feeds this job: its own per-tier reads where accounted, else the node's
    cands: list[str] = []
    if jv is not None and jv.tier_read_bytes_per_second:
        cands = [
            t
            for t, r in jv.tier_read_bytes_per_second.items()
            if r > MIN_TIER_READ_BYTES and t in view.tiers
        ]
        if not cands:
            usual = [
                (b.median((JOB_READ, job_id, t)) or 0.0, t) for t in jv.tier_read_bytes_per_second
            ]
            if usual and max(usual)[0] > 0 and max(usual)[1] in view.tiers:
                cands = [max(usual)[1]]
    if not cands:
        cands = [t for t in view.tiers if (b.median(("rd", t)) or 0.0) > USUAL_TIER_READ_BYTES]
    if not cands:
        cands = [
            t
            for t, tv in view.tiers.items()
            if (tv.read_bytes_per_second or 0.0) > MIN_TIER_READ_BYTES
        ]
    best: tuple[float, float, str, dict[str, float]] | None = None
    for tier in cands:
        tf = _tier_features(b, tier, view)
        key = (_tier_stress(tf), view.tiers[tier].read_bytes_per_second or 0.0, tier, tf)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is not None:
        f.update(best[3])
        ctx["data_tier"] = best[2]
    # checkpoint: a write burst to a tier (the job's own writes where accounted)
    writes: dict[str, float] = {}
    if jv is not None and jv.tier_write_bytes_per_second:
        writes = dict(jv.tier_write_bytes_per_second)
    else:
        writes = {t: tv.write_bytes_per_second or 0.0 for t, tv in view.tiers.items()}
    burst = 0.0
    for tier, wb in writes.items():
        if wb >= BURST_MIN_WRITE_BYTES:
            x = wb / max(b.median(("wr", tier)) or 0.0, WRITE_FLOOR_BYTES)
            if x > burst:
                burst = x
                ctx["checkpoint_tier"] = tier
    if writes:
        f["write_burst_x_baseline"] = burst
    # host CPU and pressure
    v = _rise(view.cpu_busy_ratio, b.median(("cpu",)), 0.08)
    if v is not None:
        f["cpu_busy_ratio"] = v
    v = _rise(view.psi_some.get("cpu"), b.median(("psi", "cpu")), 0.05)
    if v is not None:
        f["cpu_pressure_ratio"] = v
    v = _rise(view.psi_some.get("io"), b.median(("psi", "io")), 0.05)
    if v is not None:
        f["io_pressure_ratio"] = v
    v = _rise(view.iowait_ratio, b.median(("iowait",)), 0.03)
    if v is not None:
        f["iowait_ratio"] = v
    # fabric: saturation near link speed, congestion as transmit-wait above normal
    util_best = -1.0
    wait_best = -1.0
    for net, nv in view.nets.items():
        u = _rise(nv.utilization_ratio, b.median(("nutil", net)), 0.05)
        if u is not None and u > util_best:
            util_best = u
            if u > 0:
                ctx["network_device"] = net
        w = nv.transmit_wait_ratio
        if w is not None:
            x = w / max(b.median(("txw", net)) or 0.0, 0.005) if w >= 0.02 else 0.0
            if x > wait_best:
                wait_best = x
                if x > 0:
                    ctx["network_device"] = net
                base = b.median(("nbps", net))
                if base and base > 1e6 and nv.bytes_per_second is not None:
                    f["network_throughput_drop_ratio"] = max(0.0, 1.0 - nv.bytes_per_second / base)
    if util_best >= 0:
        f["network_utilization_ratio"] = util_best
    if wait_best >= 0:
        f["network_transmit_wait_x_baseline"] = wait_best
    # the job's own account (SDK)
    if jv is not None:
        for phase, name in (
            ("data_wait", "sdk_data_wait_share"),
            ("checkpoint", "sdk_checkpoint_share"),
            ("communication", "sdk_communication_share"),
            ("startup", "sdk_startup_share"),
        ):
            if phase in jv.shares:
                f[name] = jv.shares[phase]
        dw, psi = f.get("sdk_data_wait_share"), f.get("io_pressure_ratio")
        if dw is not None and psi is not None:
            f["io_pressure_while_waiting_for_input"] = psi if dw >= 0.3 else 0.0
        if jv.checkpoint_bytes_per_second is not None:
            f["job_checkpoint_write_bytes_per_second"] = jv.checkpoint_bytes_per_second
