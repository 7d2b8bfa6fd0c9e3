"""Every contract series the simulated node exposes, as a table over the engine's value lists.

Which series exist, with which labels, is data (one `SeriesDef` per series), not code
paths: the live collector and the trace generator read the same table, so a recorded trace
and a scrape of `--simulate` carry exactly the same names and labels.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufeed.catalogue import spec
from gpufeed.gpu.backend import GpuIdentity
from gpufeed.model import Family, LabelPairs, MetricType, Sample, label_pairs
from gpufeed.simulate import layout as L
from gpufeed.simulate.engine import mix
from gpufeed.simulate.scenario import CLOCK_EVENT_REASONS, JobSpec, Scenario

# SERVING: present while the gauge at `gate_index` (a serving job's endpoint up) is set
ALWAYS, GPU_UP, JOB_PRESENT, NONZERO, SERVING = range(5)
# gauges only a GPU with GPM (Hopper and newer) has; `node.sm_active` says whether it does
GPM_GAUGES = (L.G_SMACT, L.G_OCCUPANCY, L.G_TENSOR, L.G_DRAM)
CONST, GAUGE, COUNTER = range(3)


def reserved_memory_bytes(total_bytes: float) -> float:
    """What the simulated driver reserves: about what an H100's does (~0.6 %), MiB-aligned."""
    return float(round(total_bytes * 0.006 / 2**20) * 2**20)


@dataclass(frozen=True, slots=True)
class SeriesDef:
    family: str
    type: MetricType
    sample: str  # the sample's own name (`..._bucket`, `..._sum` for histograms)
    labels: LabelPairs
    source: int  # CONST, GAUGE or COUNTER
    index: int  # into the gauge or counter list
    const: float = 0.0
    gate: int = ALWAYS  # when the series is present
    gate_index: int = -1  # the GPU or job the gate looks at
    integer: bool = False  # counts of whole things (steps) are floored


def gpu_identities(scenario: Scenario, seed: int) -> list[GpuIdentity]:
    """Stable, seed-dependent UUIDs and PCI addresses, so that two simulated nodes differ."""
    out = []
    for g in range(scenario.node.gpus):
        h = random.Random(mix(seed, 11, g)).getrandbits(128)
        x = f"{h:032x}"
        uuid = f"GPU-{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"
        bus = f"00000000:{0x18 + 0x10 * g:02X}:00.0"
        out.append(GpuIdentity(g, uuid, scenario.node.gpu_name, scenario.node.driver_version, bus))
    return out


def gpu_series(scenario: Scenario, lay: L.Layout, ids: Sequence[GpuIdentity]) -> list[SeriesDef]:
    """GPU series as the GPU collector renders them (used by the trace generator)."""
    out: list[SeriesDef] = []

    def add(fam: str, typ: MetricType, labels: dict[str, str], src: int, idx: int,
            const: float = 0.0, gate: int = GPU_UP, g: int = -1) -> None:  # fmt: skip
        out.append(SeriesDef(fam, typ, fam, label_pairs(labels), src, idx, const, gate, g))

    for ident in ids:
        g = ident.index
        base = {"gpu": str(g), "uuid": ident.uuid}
        info = {**base, "name": ident.name, "driver_version": ident.driver_version,
                "pci_bus_id": ident.pci_bus_id, "backend": "simulated"}  # fmt: skip
        add("gpufeed_gpu_info", "gauge", info, CONST, 0, 1.0, ALWAYS)
        add("gpufeed_gpu_up", "gauge", base, GAUGE, lay.gg(g, L.G_UP), gate=ALWAYS)
        gauges = [
            ("gpufeed_gpu_utilization_ratio", L.G_UTIL),
            ("gpufeed_gpu_sm_active_ratio", L.G_SMACT),
            ("gpufeed_gpu_sm_occupancy_ratio", L.G_OCCUPANCY),
            ("gpufeed_gpu_tensor_active_ratio", L.G_TENSOR),
            ("gpufeed_gpu_dram_bandwidth_utilization_ratio", L.G_DRAM),
            ("gpufeed_gpu_memory_bandwidth_utilization_ratio", L.G_MEMBW),
            ("gpufeed_gpu_memory_used_bytes", L.G_MEMUSED),
            ("gpufeed_gpu_power_watts", L.G_POWER),
            ("gpufeed_gpu_temperature_celsius", L.G_TEMP),
            ("gpufeed_gpu_sm_clock_hertz", L.G_CLOCK),
        ]
        for fam, i in gauges:
            if i in GPM_GAUGES and not scenario.node.sm_active:
                continue
            add(fam, "gauge", base, GAUGE, lay.gg(g, i), g=g)
        add(
            "gpufeed_gpu_memory_total_bytes",
            "gauge",
            base,
            CONST,
            0,
            scenario.node.gpu_memory_bytes,
            g=g,
        )
        add("gpufeed_gpu_memory_reserved_bytes", "gauge", base, CONST, 0,
            reserved_memory_bytes(scenario.node.gpu_memory_bytes), g=g)  # fmt: skip
        for r, reason in enumerate(CLOCK_EVENT_REASONS):
            add("gpufeed_gpu_clock_event_active", "gauge", {**base, "reason": reason}, GAUGE,
                lay.gg(g, L.G_REASONS + r), g=g)  # fmt: skip
        counters = [
            ("gpufeed_gpu_busy_seconds_total", L.C_BUSY),
            ("gpufeed_gpu_energy_joules_total", L.C_ENERGY),
            ("gpufeed_gpu_pcie_transmit_bytes_total", L.C_PCIE_TX),
            ("gpufeed_gpu_pcie_receive_bytes_total", L.C_PCIE_RX),
            ("gpufeed_gpu_nvlink_transmit_bytes_total", L.C_NVL_TX),
            ("gpufeed_gpu_nvlink_receive_bytes_total", L.C_NVL_RX),
        ]
        for fam, i in counters:
            add(fam, "counter", base, COUNTER, lay.gc(g, i), g=g)
        out.append(SeriesDef("gpufeed_gpu_xid_errors_total", "counter",
                             "gpufeed_gpu_xid_errors_total", label_pairs({**base, "xid": "79"}),
                             COUNTER, lay.gc(g, L.C_XID79), 0.0, NONZERO, -1))  # fmt: skip
    return _by_family(out)


# family -> the counters a simulated port of each fabric shows (all zero: healthy links)
SIMULATED_LINK_COUNTERS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "infiniband": (
        ("gpufeed_network_link_errors_total", ("symbol_error", "link_downed")),
        ("gpufeed_network_congestion_packets_total", ("port_xmit_discards",)),
    ),
    "roce": (
        ("gpufeed_network_link_errors_total", ("link_downed", "out_of_sequence")),
        ("gpufeed_network_congestion_packets_total", ("np_ecn_marked_roce_packets", "np_cnp_sent")),
    ),
    "ethernet": (("gpufeed_network_link_errors_total", ("carrier_changes", "rx_errors")),),
}


def _object_tier_series(lay: L.Layout, t: int, tier: str) -> list[SeriesDef]:
    """An object-storage tier as the SDK collector exports it: bytes, and per operation
    the requests and their seconds (no metadata requests); no request fails here."""
    out: list[SeriesDef] = []
    pairs = label_pairs({"tier": tier})
    for fam, i in (
        ("gpufeed_object_storage_read_bytes_total", L.T_READ_B),
        ("gpufeed_object_storage_written_bytes_total", L.T_WRITE_B),
    ):
        out.append(SeriesDef(fam, "counter", fam, pairs, COUNTER, lay.tc(t, i)))
    for op, reqs, secs in (("read", L.T_READS, L.T_READ_T), ("write", L.T_WRITES, L.T_WRITE_T)):
        lab = {"tier": tier, "operation": op}
        for fam, i in (
            ("gpufeed_object_storage_requests_total", reqs),
            ("gpufeed_object_storage_request_seconds_total", secs),
        ):
            whole = i == reqs  # requests are whole things
            pairs_o = label_pairs(lab)
            out.append(
                SeriesDef(fam, "counter", fam, pairs_o, COUNTER, lay.tc(t, i), integer=whole)
            )
        for reason in ("failed", "throttled"):
            fam = "gpufeed_object_storage_errors_total"
            pairs_r = label_pairs({**lab, "reason": reason})
            out.append(SeriesDef(fam, "counter", fam, pairs_r, CONST, 0, 0.0))
    return out


SIMULATED_RTT_SECONDS = 60e-6  # a healthy data-centre round trip
SIMULATED_JITTER_SECONDS = 15e-6


def node_series(scenario: Scenario, lay: L.Layout, ids: Sequence[GpuIdentity]) -> list[SeriesDef]:
    """Storage, network, host and job series (what the `simulated` collector emits)."""
    out: list[SeriesDef] = []

    def add(fam: str, typ: MetricType, labels: dict[str, str], src: int, idx: int,
            const: float = 0.0, gate: int = ALWAYS, gi: int = -1, sample: str = "",
            integer: bool = False) -> None:  # fmt: skip
        out.append(SeriesDef(fam, typ, sample or fam, label_pairs(labels), src, idx, const,
                             gate, gi, integer))  # fmt: skip

    s = scenario
    for t, tier in enumerate(s.tiers):
        if tier.object_store:
            out.extend(_object_tier_series(lay, t, tier.name))
            continue
        lab = {"tier": tier.name, "mountpoint": tier.mountpoint}
        if tier.device is not None:
            lab["device"] = tier.device
        for fam, i in (
            ("gpufeed_storage_read_bytes_total", L.T_READ_B),
            ("gpufeed_storage_written_bytes_total", L.T_WRITE_B),
            ("gpufeed_storage_reads_completed_total", L.T_READS),
            ("gpufeed_storage_writes_completed_total", L.T_WRITES),
            ("gpufeed_storage_read_time_seconds_total", L.T_READ_T),
            ("gpufeed_storage_write_time_seconds_total", L.T_WRITE_T),
            ("gpufeed_storage_io_time_seconds_total", L.T_IO_T),
            ("gpufeed_storage_io_time_weighted_seconds_total", L.T_IO_W),
        ):
            if i in (L.T_IO_T, L.T_IO_W) and tier.device is None:
                continue  # a network filesystem has no block-device busy time: absent
            add(fam, "counter", lab, COUNTER, lay.tc(t, i), integer=i in (L.T_READS, L.T_WRITES))
        if tier.name == L.SIMULATED_GDS_TIER:
            _gds_series(add, t, lay, tier.read_latency_seconds, tier.read_bytes_per_second)
        if tier.device is None:  # the NFS client's cache; a block tier has no such counter
            add("gpufeed_storage_nfs_requested_read_bytes_total", "counter", lab, COUNTER,
                lay.tc(t, L.T_REQUESTED_B))  # fmt: skip
        add("gpufeed_storage_capacity_bytes", "gauge", lab, CONST, 0, tier.capacity_bytes)
        add("gpufeed_storage_free_bytes", "gauge", lab, GAUGE, lay.g_tier_free + t)
    for p, port in enumerate(s.ports):
        lab = {"device": port.device, "fabric": port.fabric}
        if port.port is not None:
            lab["port"] = port.port
        add("gpufeed_network_receive_bytes_total", "counter", lab, COUNTER, lay.pc(p, L.P_RX))
        add("gpufeed_network_transmit_bytes_total", "counter", lab, COUNTER, lay.pc(p, L.P_TX))
        add(
            "gpufeed_network_speed_bytes_per_second",
            "gauge",
            lab,
            CONST,
            0,
            port.speed_bytes_per_second,
        )
        if port.shaped_rate_bytes_per_second is not None:
            add("gpufeed_network_shaped_rate_bytes_per_second", "gauge", lab, CONST, 0,
                port.shaped_rate_bytes_per_second)  # fmt: skip
        if port.counts_transmit_wait:
            add("gpufeed_network_transmit_wait_seconds_total", "counter", lab, COUNTER,
                lay.pc(p, L.P_WAIT))  # fmt: skip
        # A simulated link never fails: it is up, and its fault and congestion counters
        # (the ones its kind of port has) stay at zero.
        add("gpufeed_network_link_up", "gauge", lab, CONST, 0, 1.0)
        for fam, counters in SIMULATED_LINK_COUNTERS[port.fabric]:
            for counter in counters:
                add(fam, "counter", {**lab, "counter": counter}, CONST, 0, 0.0)
    if s.ports:
        # The job's TCP connections over a healthy fabric (node level; no peers simulated)
        add("gpufeed_fabric_rtt_seconds", "gauge", {}, CONST, 0, SIMULATED_RTT_SECONDS)
        add("gpufeed_fabric_rtt_jitter_seconds", "gauge", {}, CONST, 0, SIMULATED_JITTER_SECONDS)
        add("gpufeed_fabric_connections", "gauge", {}, CONST, 0, 8.0)
    for i, mode in enumerate(L.CPU_MODES):
        add(
            "gpufeed_host_cpu_seconds_total",
            "counter",
            {"mode": mode},
            COUNTER,
            lay.hc(L.H_CPU + i),
        )
    add("gpufeed_host_cpus", "gauge", {}, CONST, 0, float(s.node.cpus))
    for i, res in enumerate(L.PRESSURE_SOME):
        add("gpufeed_host_pressure_waiting_seconds_total", "counter", {"resource": res}, COUNTER,
            lay.hc(L.H_SOME + i))  # fmt: skip
    for i, res in enumerate(L.PRESSURE_FULL):
        add("gpufeed_host_pressure_stalled_seconds_total", "counter", {"resource": res}, COUNTER,
            lay.hc(L.H_FULL + i))  # fmt: skip
    add("gpufeed_host_memory_available_bytes", "gauge", {}, GAUGE, lay.g_mem_available)
    for j, job in enumerate(s.jobs):
        jl = {"job_id": job.job_id}
        if job.serving:
            # its server's own /metrics on the node, as a config entry names it
            sv = {**jl, "server": job.serving, "endpoint": f"127.0.0.1:{8000 + j}"}
            up = lay.sg(j, L.S_UP)
            add("gpufeed_serving_up", "gauge", sv, GAUGE, up, gate=JOB_PRESENT, gi=j)
            for fam, i in (
                ("gpufeed_serving_requests_waiting", L.S_WAITING),
                ("gpufeed_serving_requests_running", L.S_RUNNING),
                ("gpufeed_serving_kv_cache_usage_ratio", L.S_KV),
            ):
                add(fam, "gauge", sv, GAUGE, lay.sg(j, i), gate=SERVING, gi=up)
            add("gpufeed_serving_requests_completed_total", "counter", sv, COUNTER,
                lay.jc(j, lay.j_served), gate=SERVING, gi=up, integer=True)  # fmt: skip
        for g in job.gpus:
            info = {**jl, "gpu": str(g), "uuid": ids[g].uuid, "scheduler": job.scheduler,
                    "name": job.name}  # fmt: skip
            add("gpufeed_job_info", "gauge", info, CONST, 0, 1.0, JOB_PRESENT, j)
        if job.sdk:
            sl = {**jl, "name": job.name[:64]}  # as the agent's SDK series (jobs/aggregate.py)
            for i, phase in enumerate(L.SDK_PHASES):
                add("gpufeed_job_phase_seconds_total", "counter", {**sl, "phase": phase}, COUNTER,
                    lay.jc(j, lay.j_phase + i), gate=JOB_PRESENT, gi=j)  # fmt: skip
            add("gpufeed_job_steps_total", "counter", sl, COUNTER, lay.jc(j, lay.j_steps),
                gate=JOB_PRESENT, gi=j, integer=True)  # fmt: skip
            for fam, base, buckets in (
                ("gpufeed_job_checkpoint_seconds", lay.j_ckpt_hist, L.CHECKPOINT_BUCKETS_SECONDS),
                ("gpufeed_job_epoch_seconds", lay.j_epoch_hist, L.EPOCH_BUCKETS_SECONDS),
            ):
                for i, le in enumerate((*buckets, math.inf)):
                    le_s = "+Inf" if math.isinf(le) else repr(le)
                    add(fam, "histogram", {**sl, "le": le_s}, COUNTER, lay.jc(j, base + i),
                        gate=JOB_PRESENT, gi=j, sample=fam + "_bucket")  # fmt: skip
                nb = len(buckets) + 1
                add(fam, "histogram", sl, COUNTER, lay.jc(j, base + nb), gate=JOB_PRESENT, gi=j,
                    sample=fam + "_sum")  # fmt: skip
                add(fam, "histogram", sl, COUNTER, lay.jc(j, base + nb + 1), gate=JOB_PRESENT,
                    gi=j, sample=fam + "_count")  # fmt: skip
            add("gpufeed_job_checkpoint_written_bytes_total", "counter", sl, COUNTER,
                lay.jc(j, lay.j_ckpt_bytes), gate=JOB_PRESENT, gi=j)  # fmt: skip
            # one process per GPU (a rank each), alive while the job is
            add("gpufeed_job_processes", "gauge", sl, CONST, 0, float(len(job.gpus)),
                gate=JOB_PRESENT, gi=j)  # fmt: skip
            # its weights come from the tier its start-up reads (the checkpoint tier, or the
            # one a start-up phase names); the in-progress gauge reads 0 outside start-up
            for t, tier in enumerate(s.tiers):
                if tier.name not in _load_tiers(job):
                    continue
                ll = {**sl, "tier": tier.name}
                add("gpufeed_job_model_load_seconds_total", "counter", ll, COUNTER,
                    lay.jc(j, lay.j_load_seconds + t), gate=JOB_PRESENT, gi=j)  # fmt: skip
                add("gpufeed_job_model_load_bytes_total", "counter", ll, COUNTER,
                    lay.jc(j, lay.j_load_bytes + t), gate=JOB_PRESENT, gi=j)  # fmt: skip
                add("gpufeed_job_model_loading_bytes", "gauge", ll, GAUGE, lay.jg(j, t),
                    gate=JOB_PRESENT, gi=j)  # fmt: skip
            out.extend(_rank_series(lay, j, job.job_id, [ids[g].uuid for g in job.gpus]))
        # per-tier I/O comes from cgroup accounting, not the SDK: present without it too,
        # for the tiers the job touches (cgroup io.stat lists only devices it used)
        touched = {job.data_tier, job.checkpoint_tier} | {ph.tier for ph in job.phases if ph.tier}
        for t, tier in enumerate(s.tiers):
            if tier.name not in touched:
                continue
            tl = {**jl, "tier": tier.name}
            add("gpufeed_job_storage_read_bytes_total", "counter", tl, COUNTER,
                lay.jc(j, lay.j_tier_read + t), gate=JOB_PRESENT, gi=j)  # fmt: skip
            add("gpufeed_job_storage_written_bytes_total", "counter", tl, COUNTER,
                lay.jc(j, lay.j_tier_write + t), gate=JOB_PRESENT, gi=j)  # fmt: skip
        for fam, i in (
            ("gpufeed_job_cache_requested_read_bytes_total", L.J_CACHE_REQUESTED),
            ("gpufeed_job_cache_fetched_read_bytes_total", L.J_CACHE_FETCHED),
        ):
            add(fam, "counter", jl, COUNTER, lay.jc(j, lay.j_cache + i), gate=JOB_PRESENT, gi=j)
        for tier in s.tiers:
            if tier.name not in touched or tier.device is None:
                continue  # cachestat looks at block-backed tiers only
            # one open 8 GiB file on each tier the job uses, as cached as the simulated reads
            tl = {**jl, "tier": tier.name}
            shard = 8.0 * 2**30
            for fam, v in (
                ("gpufeed_job_cache_open_file_bytes", shard),
                ("gpufeed_job_cache_resident_bytes", shard * L.SIMULATED_CACHE_HIT_RATIO),
                ("gpufeed_job_cache_evicted_bytes", 0.0),
                ("gpufeed_job_cache_recently_evicted_bytes", 0.0),
            ):
                add(fam, "gauge", tl, CONST, 0, v, JOB_PRESENT, j)
        cpu = lay.j_cpu
        for fam, i in (
            ("gpufeed_job_cpu_usage_seconds_total", L.J_CPU_USAGE),
            ("gpufeed_job_cpu_periods_total", L.J_CPU_PERIODS),
            ("gpufeed_job_cpu_throttled_periods_total", L.J_CPU_THROTTLED),
            ("gpufeed_job_cpu_throttled_seconds_total", L.J_CPU_THROTTLED_S),
            ("gpufeed_job_cpu_running_seconds_total", L.J_CPU_RUNNING),
            ("gpufeed_job_cpu_waiting_seconds_total", L.J_CPU_WAITING),
            ("gpufeed_job_cpu_pressure_waiting_seconds_total", L.J_CPU_PRESSURE),
        ):
            add(fam, "counter", jl, COUNTER, lay.jc(j, cpu + i), gate=JOB_PRESENT, gi=j)
    return _by_family(out)


def _gds_series(
    add: Callable[..., None], t: int, lay: L.Layout, latency: float, peak: float
) -> None:
    """The GPU-direct tier's config targets (twice its nominal latency, half its peak
    throughput) and the nvidia-fs driver's view of the same reads and writes."""
    tl = {"tier": L.SIMULATED_GDS_TIER}
    add("gpufeed_storage_tier_target_read_latency_seconds", "gauge", tl, CONST, 0, 2 * latency)
    add("gpufeed_storage_tier_target_read_bytes_per_second", "gauge", tl, CONST, 0, peak / 2)
    for op, b, n in (("read", L.T_READ_B, L.T_READS), ("write", L.T_WRITE_B, L.T_WRITES)):
        add("gpufeed_storage_gds_bytes_total", "counter", {"op": op}, COUNTER, lay.tc(t, b))
        add("gpufeed_storage_gds_operations_total", "counter", {"op": op}, COUNTER,
            lay.tc(t, n), integer=True)  # fmt: skip
        add("gpufeed_storage_gds_latency_seconds", "gauge", {"op": op}, CONST, 0, latency)
        for kind in ("io", "io_state"):
            add("gpufeed_storage_gds_errors_total", "counter", {"op": op, "kind": kind}, CONST, 0)
    gpu = {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "pci_bus_id": "0000:00:00.0"}
    add("gpufeed_storage_gds_gpu_pinned_bytes", "gauge", gpu, CONST, 0, float(256 << 20))
    add("gpufeed_storage_gds_gpu_bounce_buffer_bytes", "gauge", gpu, CONST, 0, 0.0)


def _load_tiers(job: JobSpec) -> set[str]:
    """The tiers a job's start-up reads its weights from (simulate/phases.py `_startup`)."""
    return {ph.tier or job.checkpoint_tier for ph in job.phases if ph.phase == "startup"}


def _rank_series(lay: L.Layout, j: int, job_id: str, uuids: list[str]) -> list[SeriesDef]:
    """One rank per GPU of an SDK job, as `gpufeed run` under torchrun reports them. The
    simulated ranks move in lockstep: each reports the job's phase fractions and steps (the
    same counters), and waits in collectives for the job's `communication` time."""
    phases = (*L.SDK_PHASES, "collective_wait")
    comm = L.SDK_PHASES.index("communication")
    out: list[SeriesDef] = []
    for r, uuid in enumerate(uuids):
        rl = {"job_id": job_id, "rank": str(r)}
        for i, phase in enumerate(phases):
            index = lay.jc(j, lay.j_phase + (comm if phase == "collective_wait" else i))
            fam = "gpufeed_job_rank_phase_seconds_total"
            out.append(SeriesDef(fam, "counter", fam, label_pairs({**rl, "phase": phase}),
                                 COUNTER, index, gate=JOB_PRESENT, gate_index=j))  # fmt: skip
        fam = "gpufeed_job_rank_steps_total"
        out.append(SeriesDef(fam, "counter", fam, label_pairs(rl), COUNTER,
                             lay.jc(j, lay.j_steps), gate=JOB_PRESENT, gate_index=j,
                             integer=True))  # fmt: skip
        info = {**rl, "local_rank": str(r), "world_size": str(len(uuids)), "uuid": uuid}
        info.update(_parallel_coordinates(r, len(uuids)))
        fam = "gpufeed_job_rank_info"
        out.append(SeriesDef(fam, "gauge", fam, label_pairs(info), CONST, 0, 1.0,
                             JOB_PRESENT, j))  # fmt: skip
        fam = "gpufeed_job_rank_lost"  # a simulated rank never dies
        out.append(SeriesDef(fam, "gauge", fam, label_pairs(rl), CONST, 0, 0.0,
                             JOB_PRESENT, j))  # fmt: skip
    return out


def _parallel_coordinates(rank: int, world_size: int) -> dict[str, str]:
    """The coordinates a simulated job declares (`Job.set_parallel`, `gpufeed run
    --parallel-sizes`): an even number of ranks is 2 pipeline stages of world/2
    data-parallel ranks in Megatron's order (data-parallel fastest without tensor
    parallelism), so the Job dashboard's per-stage panels have a job to show; an odd
    one declares nothing, as a plain torchrun job does."""
    if world_size < 2 or world_size % 2:
        return {}
    dp = world_size // 2
    return {"dp_rank": str(rank % dp), "pp_rank": str(rank // dp)}


def _by_family(defs: list[SeriesDef]) -> list[SeriesDef]:
    """Groups series by family (stable), as exposition formats want them contiguous."""
    order: dict[str, int] = {}
    for d in defs:
        order.setdefault(d.family, len(order))
    return sorted(defs, key=lambda d: order[d.family])


def value_of(
    d: SeriesDef, gauges: Sequence[float], counters: Sequence[float],
    up: Sequence[bool], present: Sequence[bool],
) -> float | None:  # fmt: skip
    """The series' value in one reading, or None where the series is absent."""
    if d.gate == GPU_UP and not up[d.gate_index]:
        return None
    if d.gate == JOB_PRESENT and not present[d.gate_index]:
        return None
    if d.gate == SERVING and gauges[d.gate_index] <= 0:
        return None
    if d.source == CONST:
        return d.const
    v = gauges[d.index] if d.source == GAUGE else counters[d.index]
    if d.gate == NONZERO and v == 0:
        return None
    return math.floor(v) if d.integer else v


def render(
    defs: Sequence[SeriesDef], gauges: Sequence[float], counters: Sequence[float],
    up: Sequence[bool], present: Sequence[bool],
) -> list[Family]:  # fmt: skip
    """Families of one reading; a family whose series are all absent is left out."""
    out: list[Family] = []
    cur: list[Sample] = []
    prev: SeriesDef | None = None
    for d in defs:
        if prev is not None and d.family != prev.family:
            if cur:
                out.append(Family(prev.family, prev.type, spec(prev.family).help, tuple(cur)))
            cur = []
        prev = d
        v = value_of(d, gauges, counters, up, present)
        if v is not None:
            cur.append(Sample(d.sample, d.labels, float(v)))
    if prev is not None and cur:
        out.append(Family(prev.family, prev.type, spec(prev.family).help, tuple(cur)))
    return out
