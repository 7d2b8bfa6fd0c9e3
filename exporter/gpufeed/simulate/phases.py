"""What a job asks of the node in each phase: the physics of one job during one cell.

Each phase is one small function that fills a `JobLoad` (GPU utilization and clocks, SDK
phase shares, reads and writes per tier, CPU cores by mode, pressure, fabric and NVLink
use). The engine adds up the loads of every job into the node's gauges and counters.
Levels come from `params`, random draws fixed for one phase instance (so a stall keeps its
character for its whole length), so each stall is different and the correlator has to
read the physics, not memorise numbers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufeed.simulate.layout import SDK_PHASES
from gpufeed.simulate.scenario import JobSpec, NodeSpec, PhaseSpec, TierSpec

STALL_UTIL_MAX = 0.72  # a stall stays clearly below the usual 0.8 threshold
STEPPING_PHASES = ("compute", "data_loading", "preprocessing", "network", "throttling")


class Noise:
    """The per-cell random stream; cheap approximately-normal draws for jitter."""

    __slots__ = ("random", "uniform")

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.random = rng.random
        self.uniform = rng.uniform

    def gauss(self, mu: float, sd: float) -> float:
        # a sum of three uniforms: close enough to normal for jitter, and 10x cheaper
        r = self.random
        return mu + sd * 2.0 * (r() + r() + r() - 1.5)


@dataclass(slots=True)
class JobLoad:
    util: float = 0.0
    util_sd: float = 0.0
    util_max: float = STALL_UTIL_MAX
    sdk: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SDK_PHASES, 0.0))
    step_fraction: float = 0.0  # of the job's nominal step rate
    rail_fraction: float = 0.0  # of each of its InfiniBand ports' speed
    transmit_wait: float = 0.0  # seconds per second on its ports
    nvlink_fraction: float = 0.0  # of NVLink bandwidth per GPU
    pcie_rx_per_gpu: float = 0.0  # bytes per second, host to device
    pcie_tx_per_gpu: float = 0.0
    clock_fraction: float = 1.0
    reason: str = ""  # an active clock event reason
    memory_fraction: float = 0.0  # of each GPU's memory
    reads: list[tuple[int, float]] = field(default_factory=list)  # (tier, bytes/s)
    writes: list[tuple[int, float]] = field(default_factory=list)
    tier_latency: dict[int, float] = field(default_factory=dict)  # latency multipliers
    saturated: set[int] = field(default_factory=set)  # tiers driven to their ceiling
    cpu_user: float = 0.0  # cores
    cpu_system: float = 0.0
    cpu_iowait: float = 0.0
    cpu_softirq: float = 0.0
    cpu_pressure: float = 0.0  # PSI some, seconds per second
    io_pressure: float = 0.0
    io_pressure_full: float = 0.0
    lost_gpu: int = -1
    sm_fraction: float = 1.0  # SM activity for the utilization NVML reads (GPM)
    checkpoint_bytes_per_second: float = 0.0


@dataclass(frozen=True, slots=True)
class JobContext:
    job: JobSpec
    phase: PhaseSpec
    params: list[float]  # draws in [0, 1) fixed for this phase instance
    t_in_phase: float  # scenario seconds since the phase began
    node: NodeSpec
    tiers: tuple[TierSpec, ...]
    tier_index: dict[str, int]
    tier_read: list[float]  # what the tiers already carry this cell (bytes/s)
    working_set: float  # the job's GPU memory fraction when running
    noise: Noise

    @property
    def gpus(self) -> int:
        return len(self.job.gpus)

    @property
    def data_tier(self) -> int:
        return self.tier_index[self.job.data_tier]

    def tier_or(self, default: str) -> int:
        return self.tier_index[self.phase.tier or default]

    @property
    def healthy_read(self) -> float:
        """The job's read rate while it computes happily (bytes/s)."""
        ceiling = self.tiers[self.data_tier].read_bytes_per_second
        return self.job.data_read_bytes_per_second or min(3e9, 0.25 * ceiling)


def job_load(c: JobContext) -> JobLoad:
    n = c.gpus
    u = c.noise.uniform
    load = JobLoad(
        rail_fraction=u(0.25, 0.4),
        transmit_wait=u(0.001, 0.006),
        nvlink_fraction=u(0.12, 0.2),
        memory_fraction=c.working_set,
        cpu_user=1.5 * n,
        cpu_system=0.3 * n,
        cpu_iowait=0.02 * n,
        cpu_softirq=0.05 * n,
    )
    PHYSICS[c.phase.phase](c, load)
    if c.job.serving:
        _serving(c, load)
    elif c.phase.phase in STEPPING_PHASES:
        # the steps the compute share makes: a spinning GPU's busy reading is not work
        load.step_fraction = load.util * load.sm_fraction / 0.95
    return load


def _serving(c: JobContext, a: JobLoad) -> None:
    """An inference server keeps its weights on the GPU, reads no dataset, talks over no
    rail and takes little CPU (tokenising); its queue is its demand (engine: serving)."""
    a.reads.clear()
    a.memory_fraction = c.working_set
    a.rail_fraction = a.transmit_wait = a.nvlink_fraction = 0.0
    a.pcie_rx_per_gpu = 0.0
    a.cpu_user, a.cpu_system, a.cpu_iowait, a.cpu_softirq = 0.3 * c.gpus, 0.05 * c.gpus, 0.0, 0.0


def _compute(c: JobContext, a: JobLoad) -> None:
    p = c.params
    a.util, a.util_sd, a.util_max = 0.93 + 0.045 * p[0], 0.015, 1.0
    a.sdk.update(compute=0.9, data_wait=0.03, communication=0.05, other=0.02)
    rate = c.healthy_read * (1 + c.noise.gauss(0, 0.08))
    a.reads.append((c.data_tier, rate))
    a.pcie_rx_per_gpu = c.healthy_read / c.gpus


def _startup(c: JobContext, a: JobLoad) -> None:
    """Loading weights: reads from the checkpoint tier, memory filling up, no steps yet."""
    p = c.params
    a.util, a.util_sd = 0.06 * p[0], 0.02
    filled = min(1.0, c.t_in_phase / max(1.0, 0.6 * c.phase.seconds))
    a.memory_fraction = 0.03 + (c.working_set - 0.03) * filled
    src = c.tier_or(c.job.checkpoint_tier)
    rate = c.tiers[src].read_bytes_per_second * (0.45 + 0.3 * p[1])
    a.reads.append((src, rate))
    a.pcie_rx_per_gpu = min(c.node.pcie_bytes_per_second * 0.8, rate / c.gpus)
    a.sdk["startup"] = 1.0
    a.rail_fraction, a.nvlink_fraction = 0.005, 0.002
    a.cpu_user, a.cpu_system, a.cpu_iowait = 1.0 * c.gpus, 0.5 * c.gpus, 0.5 * c.gpus


def _data_loading(c: JobContext, a: JobLoad) -> None:
    """Waiting for input that storage cannot deliver: saturated, or slow (contended)."""
    p = c.params
    src = c.tier_or(c.job.data_tier)
    tier = c.tiers[src]
    a.util, a.util_sd = 0.08 + 0.3 * p[0], 0.05
    if c.phase.guise == "contended":  # others load a shared tier: slow at low throughput
        rate = tier.read_bytes_per_second * (0.02 + 0.08 * p[1])
        a.tier_latency[src] = 10 + 30 * p[2]
    else:  # the job itself drives the tier to its ceiling
        rate = max(0.0, tier.read_bytes_per_second * (0.97 + 0.03 * p[1]) - c.tier_read[src])
        a.tier_latency[src] = 3 + 5 * p[2]
        a.saturated.add(src)
    a.reads.append((src, rate))
    a.pcie_rx_per_gpu = rate / c.gpus
    wait = 0.65 + 0.2 * p[3]
    a.sdk.update(data_wait=wait, compute=(1 - wait) * 0.8, communication=(1 - wait) * 0.2)
    a.rail_fraction, a.nvlink_fraction = 0.02 + 0.03 * p[4], 0.02
    a.cpu_user, a.cpu_system = 0.6 * c.gpus, 0.3 * c.gpus
    a.cpu_iowait = (1.5 + 1.5 * p[5]) * c.gpus + 2
    a.io_pressure = 0.25 + 0.35 * p[6]
    a.io_pressure_full = a.io_pressure * (0.35 + 0.25 * p[7])


def _preprocessing(c: JobContext, a: JobLoad) -> None:
    """Waiting for input the CPUs cannot prepare fast enough; storage is fine."""
    p = c.params
    a.util, a.util_sd = 0.15 + 0.3 * p[0], 0.04
    a.reads.append((c.data_tier, c.healthy_read * a.util / 0.95))
    wait = 0.55 + 0.25 * p[1]
    a.sdk.update(data_wait=wait, compute=(1 - wait) * 0.85, communication=(1 - wait) * 0.15)
    a.rail_fraction, a.nvlink_fraction = 0.05, 0.03
    a.cpu_user = c.node.cpus * (0.93 + 0.05 * p[2])
    a.cpu_system = c.node.cpus * 0.03
    a.cpu_pressure = 0.45 + 0.4 * p[3]


def _checkpointing(c: JobContext, a: JobLoad) -> None:
    """A write burst to the checkpoint tier; every GPU of the job waits for it."""
    p = c.params
    dst = c.tier_or(c.job.checkpoint_tier)
    a.util, a.util_sd = 0.04 * p[0], 0.01
    rate = c.tiers[dst].write_bytes_per_second * (0.85 + 0.12 * p[1])
    a.writes.append((dst, rate))
    a.checkpoint_bytes_per_second = rate
    a.tier_latency[dst] = 2 + 3 * p[2]
    # the state is copied device-to-host first, then the GPUs just wait
    early = c.t_in_phase < 0.3 * c.phase.seconds
    a.pcie_tx_per_gpu = rate / c.gpus * (3.0 if early else 0.2)
    a.sdk.update(checkpoint=0.97, other=0.03)
    a.rail_fraction, a.nvlink_fraction = 0.01, 0.005
    a.cpu_user, a.cpu_system, a.cpu_iowait = 0.5 * c.gpus, 1.0 * c.gpus, 0.8 * c.gpus
    a.io_pressure = 0.08 + 0.17 * p[3]
    a.io_pressure_full = a.io_pressure * 0.3


def _network(c: JobContext, a: JobLoad) -> None:
    """Collectives held back by the fabric: saturated (at link speed) or congested."""
    p = c.params
    a.util, a.util_sd = 0.3 + 0.3 * p[0], 0.04
    comm = 0.45 + 0.25 * p[1]
    a.sdk.update(communication=comm, compute=1 - comm)
    if c.phase.guise == "congested":  # throughput falls while transmit-wait climbs
        a.rail_fraction, a.transmit_wait, a.nvlink_fraction = (
            0.04 + 0.11 * p[2], 0.35 + 0.5 * p[3], 0.04)  # fmt: skip
    else:
        a.rail_fraction, a.transmit_wait, a.nvlink_fraction = (
            0.93 + 0.055 * p[2], 0.02 + 0.06 * p[3], 0.85 + 0.1 * p[4])  # fmt: skip
    a.reads.append((c.data_tier, c.healthy_read * a.util / 0.95))
    a.cpu_user, a.cpu_system, a.cpu_softirq = 1.0 * c.gpus, 0.4 * c.gpus, 0.3 * c.gpus
    _spin(c, a)


def _throttling(c: JobContext, a: JobLoad) -> None:
    """Clocks held down by a clock event reason; the job's GPUs fall out of step."""
    p = c.params
    a.util, a.util_sd = 0.45 + 0.23 * p[0], 0.03
    a.clock_fraction = 0.3 + 0.2 * p[1]
    a.reason = c.phase.reason or "hw_slowdown"
    a.sdk.update(compute=0.9, communication=0.08, data_wait=0.02)
    a.reads.append((c.data_tier, c.healthy_read * a.util / 0.95))
    a.rail_fraction *= a.util
    a.nvlink_fraction *= a.util


def _gpu_error(c: JobContext, a: JobLoad) -> None:
    """A GPU fell off the bus; the job hangs on its other GPUs and reports nothing."""
    a.lost_gpu = c.phase.gpu if c.phase.gpu >= 0 else c.job.gpus[-1]
    a.util = a.util_sd = 0.0
    a.rail_fraction = a.transmit_wait = a.nvlink_fraction = 0.0
    a.cpu_user, a.cpu_system, a.cpu_iowait = 0.1 * c.gpus, 0.05 * c.gpus, 0.0


def _straggler(c: JobContext, a: JobLoad) -> None:
    """A peer on another node is late: the job's ranks here wait in collectives. NCCL's
    kernel spins meanwhile, so NVML reads the GPUs busy while few SMs work (GPM); this
    node's storage, CPUs and fabric are quiet."""
    p = c.params
    wait = 0.6 + 0.25 * p[2]
    a.util, a.util_sd = 1 - wait, 0.03
    _spin(c, a, sm_fraction=0.08 + 0.12 * p[1])
    a.sdk.update(communication=wait, compute=1 - wait)
    a.step_fraction = 1 - wait
    a.rail_fraction, a.nvlink_fraction = 0.03 + 0.04 * p[3], 0.02
    a.reads.append((c.data_tier, c.healthy_read * (1 - wait)))


def _spin(c: JobContext, a: JobLoad, sm_fraction: float = -1.0) -> None:
    """A job whose ranks wait in collectives on NCCL (JobSpec.spins): the collective's
    kernel spins while it waits, so NVML counts the GPU busy (utilization 0.95-0.99) while
    its SMs do only the work it computes: SM activity per unit of utilization
    `sm_fraction`, by default the compute share the phase set (`a.util`) over the busy
    reading, so that SM activity reads as in the compute-only reading. The SDK and the
    fabric are the phase's; a job that does not spin keeps the compute share."""
    if not c.job.spins:
        return
    spin = 0.95 + 0.04 * c.params[0]
    a.sm_fraction = a.util / spin if sm_fraction < 0 else sm_fraction
    a.util, a.util_sd, a.util_max = spin, 0.01, 1.0


def _low_demand(c: JobContext, a: JobLoad) -> None:
    """An inference server with few requests: it serves each as it comes, none waits; the
    GPU computes in short bursts (the serving physics in job_load does the rest)."""
    a.util, a.util_sd = 0.04 + 0.3 * c.params[0], 0.05


def _idle(c: JobContext, a: JobLoad) -> None:
    """The job holds nothing (never called: an idle job is not present)."""


PHYSICS: dict[str, Callable[[JobContext, JobLoad], None]] = {
    "compute": _compute,
    "startup": _startup,
    "data_loading": _data_loading,
    "preprocessing": _preprocessing,
    "checkpointing": _checkpointing,
    "network": _network,
    "throttling": _throttling,
    "gpu_error": _gpu_error,
    "idle": _idle,
    "straggler": _straggler,
    "low_demand": _low_demand,
}
