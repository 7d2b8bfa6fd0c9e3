"""The simulated node: determinism, physics invariants, and each cause's signature."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufeed.catalogue import CATALOGUE
from gpufeed.model import Family
from gpufeed.simulate import build_simulated_node
from gpufeed.simulate.gpu_backend import SimulatedGpuBackend
from gpufeed.simulate.node import SimulatedNode
from gpufeed.simulate.scenario import default_scenario, load_scenario, parse_scenario
from sim_helpers import rate, sample_value, working_share

SCENARIOS = Path(__file__).parent / "fixtures" / "scenarios"
# the node's own families: not the correlator's (the agent adds them) nor the fleet service's
# a node's families: not the correlator's, the fleet service's or the cluster scheduler's
CONTRACT_FAMILIES = {
    m.name for m in CATALOGUE if m.contract and m.group not in ("correlator", "fleet", "scheduler")
}
# beyond the contract, simulated where NVML would give them on an H100
GPU_EXTRA_FAMILIES = {
    "gpufeed_gpu_busy_seconds_total", "gpufeed_gpu_sm_occupancy_ratio",
    "gpufeed_gpu_tensor_active_ratio", "gpufeed_gpu_dram_bandwidth_utilization_ratio",
    "gpufeed_gpu_memory_reserved_bytes",
}  # fmt: skip

Reader = Callable[[float], list[Family]]


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    return SimulatedNode(default_scenario(), seed=7, clock=lambda: 0.0)


@pytest.fixture(scope="module")
def read(node: SimulatedNode) -> Reader:
    return node.families


def util(read: Reader, t: float, gpu: int) -> float:
    v = sample_value(read(t), "gpufeed_gpu_utilization_ratio", gpu=str(gpu))
    assert v is not None
    return v


def latency(read: Reader, t: float, tier: str, op: str = "read") -> float:
    kind = "reads" if op == "read" else "writes"
    time_ = rate(read, t, f"gpufeed_storage_{op}_time_seconds_total", tier=tier)
    ops = rate(read, t, f"gpufeed_storage_{kind}_completed_total", tier=tier)
    return time_ / ops


def test_every_contract_family_is_produced_over_one_cycle(node: SimulatedNode) -> None:
    names: set[str] = set()
    for t in range(0, 480, 10):
        names |= {f.name for f in node.families(t) if f.samples}
    assert names == CONTRACT_FAMILIES | GPU_EXTRA_FAMILIES


def test_gpu_info_says_simulated_and_every_gpu_has_its_job(read: Reader) -> None:
    fams = read(50)
    info = [s for f in fams if f.name == "gpufeed_gpu_info" for s in f.samples]
    assert len(info) == 8 and {s.label("backend") for s in info} == {"simulated"}
    jobs = {s.label("gpu"): s.label("job_id") for f in fams if f.name == "gpufeed_job_info"
            for s in f.samples}  # fmt: skip
    assert jobs == {"0": "llm-pretrain-4821", "1": "llm-pretrain-4821", "2": "llm-pretrain-4821",
                    "3": "llm-pretrain-4821", "4": "vision-ft-77", "5": "vision-ft-77",
                    "6": "rl-sweep-3", "7": "chat-serve-9"}  # fmt: skip


def test_same_seed_same_output_whatever_the_query_order() -> None:
    times = [0.0, 3.5, 97.25, 181.0, 290.5, 431.0, 1000.75]
    a = SimulatedNode(default_scenario(), seed=3, clock=lambda: 0.0)
    forward = [a.families(t) for t in times]
    b = SimulatedNode(default_scenario(), seed=3, clock=lambda: 0.0)
    b.engine.HISTORY_CELLS = 4  # force replays from the start
    backward = [b.families(t) for t in reversed(times)][::-1]
    assert forward == backward
    c = SimulatedNode(default_scenario(), seed=4, clock=lambda: 0.0)
    assert c.families(times[3]) != forward[3]


def test_counters_never_decrease_and_ratios_stay_in_range(node: SimulatedNode) -> None:
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    checked = 0
    t = 0.0
    while t < 700:  # more than one cycle, through the lost GPU and its return
        for fam in node.families(t):
            for s in fam.samples:
                if fam.type in ("counter", "histogram"):
                    key = (s.name, s.labels)
                    assert s.value >= last.get(key, -math.inf), (t, key)
                    last[key] = s.value
                    checked += 1
                if s.name.endswith("_ratio"):
                    assert 0.0 <= s.value <= 1.0, (t, s)
                assert math.isfinite(s.value)
        t += 3.7
    assert checked > 10000


def test_lost_gpu_reports_only_identity_and_up(node: SimulatedNode) -> None:
    (lost,) = [s for s in node.gpu_samples(300) if not s.up]
    assert lost.identity.index == 6
    identity_fields = {"identity", "up", "xid_errors_total", "processes", "mig_enabled"}
    measured = [f.name for f in dataclasses.fields(lost) if f.name not in identity_fields]
    assert measured and all(getattr(lost, f) is None for f in measured)
    assert lost.xid_errors_total == ((79, 1),)
    fams = node.gpu_families(300)
    left = {f.name for f in fams if any(s.label("gpu") == "6" for s in f.samples)}
    assert left == {"gpufeed_gpu_info", "gpufeed_gpu_up", "gpufeed_gpu_xid_errors_total"}
    assert sample_value(fams, "gpufeed_gpu_up", gpu="6") == 0.0
    # after the reset the GPU is back, the XID stays counted
    (back,) = [s for s in node.gpu_samples(500) if s.identity.index == 6]
    assert back.up and back.utilization_ratio is not None and back.xid_errors_total == ((79, 1),)


def test_startup_signature(read: Reader) -> None:
    assert max(util(read, 40, g) for g in range(4)) < 0.2
    job = {"job_id": "llm-pretrain-4821"}
    assert rate(read, 40, "gpufeed_job_steps_total", **job) == 0
    assert rate(read, 40, "gpufeed_job_phase_seconds_total", phase="startup", **job) > 0.9
    # loading weights from the checkpoint tier
    assert rate(read, 40, "gpufeed_job_storage_read_bytes_total", tier="hot", **job) > 2e9


def test_compute_signature(read: Reader) -> None:
    for g in (0, 1, 2, 3, 6, 7):  # 7: the LLM server, busy with requests waiting
        assert util(read, 140, g) > 0.85
    for g in (4, 5):
        assert util(read, 240, g) > 0.85
    assert rate(read, 140, "gpufeed_job_steps_total", job_id="llm-pretrain-4821") > 0.9


def test_data_loading_saturated_signature(read: Reader) -> None:
    t = 230.0
    assert max(util(read, t, g) for g in range(4)) < 0.5
    thr = rate(read, t, "gpufeed_storage_read_bytes_total", tier="warm")
    assert thr > 0.95 * 2.2e9  # the warm tier's ceiling
    assert latency(read, t, "warm") > 3 * latency(read, 140, "warm")
    assert rate(read, t, "gpufeed_host_pressure_waiting_seconds_total", resource="io") > 0.2
    iowait = rate(read, t, "gpufeed_host_cpu_seconds_total", mode="iowait")
    assert iowait > 5 * rate(read, 140, "gpufeed_host_cpu_seconds_total", mode="iowait")
    job = {"job_id": "llm-pretrain-4821"}
    wait = rate(read, t, "gpufeed_job_phase_seconds_total", phase="data_wait", **job)
    assert wait > 0.6
    # the warm tier is NFS: its reads go over ethernet, and it has no block-device busy time
    assert rate(read, t, "gpufeed_network_receive_bytes_total", device="eth0") > 2e9
    assert sample_value(read(t), "gpufeed_storage_io_time_seconds_total", tier="warm") is None


def test_data_loading_contended_signature() -> None:
    text = (SCENARIOS / "short-data-loading.yaml").read_text().replace("saturated", "contended")
    node = SimulatedNode(parse_scenario(text), seed=1, clock=lambda: 0.0)
    read = node.families
    assert max(util(read, 100, g) for g in (0, 1)) < 0.5
    assert latency(read, 100, "warm") > 8 * latency(read, 20, "warm")
    assert rate(read, 100, "gpufeed_storage_read_bytes_total", tier="warm") < 0.15 * 2.2e9
    assert node.ground_truth(100)[0].cause == "data_loading"
    assert node.ground_truth(100)[0].guise == "contended"


def test_preprocessing_signature(read: Reader) -> None:
    t = 130.0
    assert max(util(read, t, g) for g in (4, 5)) < 0.5
    idle = rate(read, t, "gpufeed_host_cpu_seconds_total", mode="idle")
    assert idle < 0.08 * 128
    assert rate(read, t, "gpufeed_host_pressure_waiting_seconds_total", resource="cpu") > 0.4
    # storage is not why: the job's data tier has its normal latency
    assert latency(read, t, "hot") < 2 * latency(read, 20, "hot") + 1e-4
    assert rate(read, t, "gpufeed_host_pressure_waiting_seconds_total", resource="io") < 0.05


def test_checkpointing_signature(read: Reader) -> None:
    t = 420.0
    assert max(util(read, t, g) for g in range(4)) < 0.1
    assert rate(read, t, "gpufeed_storage_written_bytes_total", tier="hot") > 0.8 * 3.2e9
    job = {"job_id": "llm-pretrain-4821"}
    assert rate(read, t, "gpufeed_job_phase_seconds_total", phase="checkpoint", **job) > 0.9
    assert rate(read, t, "gpufeed_job_checkpoint_written_bytes_total", **job) > 2e9
    before = sample_value(read(470), "gpufeed_job_checkpoint_seconds_count", **job)
    after = sample_value(read(485), "gpufeed_job_checkpoint_seconds_count", **job)
    assert before is not None and after == before + 1
    total = sample_value(read(485), "gpufeed_job_checkpoint_seconds_sum", **job)
    assert total == pytest.approx(100.0)


def test_network_saturated_signature(read: Reader) -> None:
    """The job's 2 GPUs wait in collectives that spin (NCCL, `collectives: spin`): NVML
    reads them busy, and SM activity is that of the compute share (0.3-0.6 of the time)."""
    t = 320.0
    assert min(util(read, t, g) for g in (4, 5)) >= 0.9
    for g in (4, 5):
        sm = sample_value(read(t), "gpufeed_gpu_sm_active_ratio", gpu=str(g))
        assert sm is not None and sm < 0.5, sm
        before = sample_value(read(250.0), "gpufeed_gpu_sm_active_ratio", gpu=str(g))
        assert before is not None and before > 0.55, before  # computing, before the stall
    # GPUs 4 and 5 sit on the third rail
    assert rate(read, t, "gpufeed_network_transmit_bytes_total", device="mlx5_2") > 0.9 * 50e9
    assert rate(read, t, "gpufeed_gpu_nvlink_transmit_bytes_total", gpu="4") > 0.8 * 450e9
    assert rate(read, t, "gpufeed_host_pressure_waiting_seconds_total", resource="io") < 0.05


def test_network_congested_signature() -> None:
    s = parse_scenario(
        "jobs:\n  - id: j\n    gpus: [0, 1]\n    phases:\n"
        "      - {phase: compute, seconds: 60}\n"
        "      - {phase: network, seconds: 120, guise: congested}\n"
    )
    read = SimulatedNode(s, seed=2, clock=lambda: 0.0).families
    wait = rate(read, 100, "gpufeed_network_transmit_wait_seconds_total", device="mlx5_0")
    assert wait > 0.3
    assert wait > 20 * rate(
        read, 20, "gpufeed_network_transmit_wait_seconds_total", device="mlx5_0"
    )
    during = rate(read, 100, "gpufeed_network_transmit_bytes_total", device="mlx5_0")
    assert during < 0.5 * rate(read, 20, "gpufeed_network_transmit_bytes_total", device="mlx5_0")


def test_throttling_signature_and_thermal_confounder(node: SimulatedNode, read: Reader) -> None:
    fams = read(230)
    assert util(read, 230, 6) < 0.75
    reason = {"gpu": "6", "reason": "hw_power_brake_slowdown"}
    assert sample_value(fams, "gpufeed_gpu_clock_event_active", **reason) == 1.0
    clock = sample_value(fams, "gpufeed_gpu_sm_clock_hertz", gpu="6")
    assert clock is not None and clock < 0.55 * 1.98e9
    assert node.ground_truth(230)[6].cause == "throttling"
    # thermal throttling at full utilization on GPU 5 is a confounder, not a cause
    fams = read(430)
    assert sample_value(fams, "gpufeed_gpu_clock_event_active", gpu="5", reason="hw_thermal_slowdown") == 1.0  # fmt: skip
    assert util(read, 430, 5) > 0.85
    truth = node.ground_truth(430)[5]
    assert truth.cause is None and truth.confounder == "thermal_full_util"


def test_short_dip_is_healthy_truth(node: SimulatedNode, read: Reader) -> None:
    assert util(read, 210, 4) < 0.5
    truth = node.ground_truth(210)[4]
    assert truth.cause is None and truth.confounder == "short_dip"
    assert util(read, 225, 4) > 0.85


def test_idle_gpus(node: SimulatedNode, read: Reader) -> None:
    fams = read(420)  # rl-sweep has ended: GPU 6 is idle
    held = {s.label("gpu") for f in fams if f.name == "gpufeed_job_info" for s in f.samples}
    assert "6" not in held and "7" in held
    assert util(read, 420, 6) == 0.0
    assert sample_value(fams, "gpufeed_gpu_clock_event_active", gpu="6", reason="gpu_idle") == 1.0
    assert node.ground_truth(420)[6].cause == "idle"


def test_serving_gpu_has_a_queue_then_none(node: SimulatedNode, read: Reader) -> None:
    """GPU 7 serves (vLLM): requests wait while it is busy; in its low_demand spell the
    queue is empty and the GPU mostly idles; the truth is low_demand, not a stall."""
    busy, quiet = read(100), read(260)
    for fams, waiting in ((busy, True), (quiet, False)):
        got = sample_value(fams, "gpufeed_serving_requests_waiting", job_id="chat-serve-9")
        assert got is not None and (got > 0) == waiting
        assert sample_value(fams, "gpufeed_serving_up", job_id="chat-serve-9") == 1.0
    assert util(read, 100, 7) > 0.85 and util(read, 260, 7) < 0.5
    assert node.ground_truth(100)[7].cause is None
    assert node.ground_truth(260)[7].cause == "low_demand"


def test_ground_truth_matches_utilization_over_a_cycle(node: SimulatedNode) -> None:
    """A GPU labelled with a cause works below 0.8 (utilization; where it spins in a
    collective, as its SM activity shows); a healthy one is above, except in dips."""
    for t in range(0, 480, 5):
        truth = node.ground_truth(t)
        for s in node.gpu_samples(t):
            tr = truth[s.identity.index]
            u = s.utilization_ratio if s.up else 0.0
            assert u is not None
            u = working_share(u, s.sm_active_ratio, tr.phase)
            if tr.cause is not None:
                assert u < 0.8, (t, s.identity.index, tr)
            elif tr.confounder != "short_dip":
                assert u >= 0.8, (t, s.identity.index, tr)


def test_pace_compresses_the_timeline_not_the_rates() -> None:
    clock = [100.0]
    backend, collectors, node = build_simulated_node(
        str(SCENARIOS / "short-data-loading.yaml"), seed=1, pace=10, clock=lambda: clock[0]
    )
    assert isinstance(backend, SimulatedGpuBackend) and backend.name == "simulated"
    (collector,) = collectors
    assert collector.name == "simulated"

    def read(t: float) -> list[Family]:
        clock[0] = 100.0 + t
        return collector.collect()

    clock[0] = 103.0  # 30 simulated seconds: still computing
    assert min(s.utilization_ratio or 0 for s in backend.sample()[:2]) > 0.85
    clock[0] = 110.0  # 100 simulated seconds: the data-loading stall
    assert max(s.utilization_ratio or 0 for s in backend.sample()[:2]) < 0.5
    assert node.ground_truth()[0].cause == "data_loading"
    # bytes per wall second stay at the tier's ceiling, not ten times it
    thr = rate(read, 10, "gpufeed_storage_read_bytes_total", window=4, tier="warm")
    assert 0.9 * 2.2e9 < thr <= 2.2e9
    busy = 128 - rate(read, 14, "gpufeed_host_cpu_seconds_total", window=2, mode="idle")
    assert 0 < busy < 128
    # a wall clock stepped backwards pauses the simulation; it never goes back
    before = collector.collect()
    clock[0] -= 50
    assert collector.collect() == before


def test_scenario_without_repeat_ends_with_idle_gpus() -> None:
    s = load_scenario(SCENARIOS / "every-key.yaml")
    node = SimulatedNode(s, seed=1, clock=lambda: 0.0)
    late = s.jobs[0].period_seconds + 100
    assert {t.cause for t in node.ground_truth(late).values()} == {"idle"}
    assert not [f for f in node.node_families(late) if f.name == "gpufeed_job_info"]
    # sm_active: false in the scenario means the GPUs do not report it: absent, not 0
    assert all(s.sm_active_ratio is None for s in node.gpu_samples(10))


@pytest.mark.parametrize("t", [40.0, 230.0, 300.0, 430.0])
def test_gpu_collector_renders_the_backend_as_the_trace_generator_does(t: float) -> None:
    """The GPU families of a `--simulate` agent equal those written into generated traces."""
    from gpufeed.collectors.gpu import GpuCollector

    clock = [t]
    backend, _, node = build_simulated_node(None, seed=9, clock=lambda: clock[0])
    clock[0] = node.started_at_seconds + t
    rendered = GpuCollector(backend).collect()

    def flat(fams: list[Family]) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, s.labels, s.value) for f in fams for s in f.samples}

    assert flat(rendered) == flat(node.gpu_families(t))


@pytest.mark.parametrize("collectives", ["spin", "compute_only"])
def test_a_network_phase_reads_as_its_collectives_do(collectives: str) -> None:
    """NCCL's spinning collective reads busy with SM activity at the compute share;
    `collectives: compute_only` (gloo) reads the compute share. Truth is `network` either
    way, and the steps are the compute share's."""
    import dataclasses

    s = load_scenario(SCENARIOS / "every-key.yaml")
    job = dataclasses.replace(s.jobs[0], collectives=collectives)
    s = dataclasses.replace(s, jobs=(job,), node=dataclasses.replace(s.node, sm_active=True))
    at = 0.0
    for p in job.phases:
        if p.phase == "network":
            break
        at += p.seconds
    t = at + 0.5 * next(p.seconds for p in job.phases if p.phase == "network")
    node = SimulatedNode(s, seed=1, clock=lambda: 0.0)
    assert {node.ground_truth(t)[g].cause for g in job.gpus} == {"network"}
    for g in node.gpu_samples(t):
        if g.identity.index not in job.gpus:
            continue
        assert g.utilization_ratio is not None and g.sm_active_ratio is not None
        if collectives == "spin":
            assert g.utilization_ratio >= 0.9 and g.sm_active_ratio < 0.5, g
        else:
            assert g.utilization_ratio < 0.7, g
