"""An independent, physics-based generator of labelled multi-node traces for the correlator.

Each simulated node has GPUs, storage tiers with a throughput ceiling and a latency that
grows with queueing, a fabric with a link speed, CPUs, and one or two training jobs. A job
step needs input (read from its data tier, then decoded on the CPUs), compute, and an
all-reduce over the fabric; whichever part is slowest sets the step time, and GPU
utilization is compute time over step time. Episodes change one physical quantity (a
tier's ceiling collapses under contention, a checkpoint writes gigabytes, the fabric is
congested, a GPU throttles, a GPU falls off the bus) and the metrics follow from the model,
with multiplicative noise, missed scrapes and the odd agent restart (counter reset).

Labels say, per GPU, when it was underutilized and why; everything else is healthy. A
sample at time t reports the interval before t (as NVML utilization does), so a label runs
from the first sample that shows an episode to the first sample after it.
Confounders change metrics without underutilizing a GPU and must open no window.
A node's GPUs that wait in collectives (a slow fabric, a throttled peer) read as NCCL
shows them by default (`NodeSim.collectives`, bench/nvml_reading.py): busy, with SM
activity at their compute share; `compute_only` reads the compute share (gloo).
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from bench import nvml_reading as nvml
from gpufeed.vocabulary import Cause

CAUSES = tuple(c.value for c in Cause)
GUISES: dict[str, tuple[str, ...]] = {
    "data_loading": ("saturated", "contended"),
    "preprocessing": ("cpu_bound", "cpu_stolen"),
    "checkpointing": ("hot_tier", "cold_tier_nfs"),
    "network": ("saturated", "congested"),
    "throttling": ("thermal_peer", "power_brake"),
    "startup": ("load_weights",),
    "idle": ("job_ended",),
    "gpu_error": ("lost", "fatal_xid"),
    # the training loop itself is slow (Python overhead, a synchronisation in user code):
    # no resource is stressed, so the only honest answer is `unknown`
    "unknown": ("slow_user_code",),
}
# The network benchmark's guises (bench/network_accuracy.py), with the `network_reason` each
# one is: the saturated and congested ones above, and three that only its traces schedule
# (the main benchmark's traces stay as they were).
NETWORK_GUISE_REASONS: dict[str, str] = {
    "saturated": "saturated",
    "congested": "congestion",
    "flapping": "link_errors",
    "link_errors": "link_errors",
    "peer": "peer",
}
WARMUP_MIN = (15.0, 20.0)  # healthy minutes before the first episode
CONFOUNDERS = ("archive_busy", "short_dip", "thermal_full_util", "network_busy_healthy")
# one GPU reports a clock slowdown for a long time while its job trains at full speed
PEER_THROTTLED_HEALTHY = "peer_throttled_healthy"


@dataclass(frozen=True, slots=True)
class Label:
    instance: str
    gpu: str
    start: float
    end: float
    cause: str
    network_reason: str = ""  # for cause network: saturated, congestion, link_errors, peer


@dataclass(slots=True)
class Tier:
    name: str
    block: bool  # block device (busy/queue) or NFS (latency only)
    ceiling: float  # bytes/s
    latency: float  # seconds at light load
    read_bytes: float = 0.0
    written_bytes: float = 0.0
    reads: float = 0.0
    writes: float = 0.0
    read_time: float = 0.0
    write_time: float = 0.0
    io_time: float = 0.0
    io_weighted: float = 0.0


@dataclass(slots=True)
class Net:
    device: str
    fabric: str
    speed: float
    rx: float = 0.0
    tx: float = 0.0
    tx_wait: float = 0.0
    up: float = 1.0
    # fault and congestion counters by the kernel's name (emitted with link_counters only)
    errors: dict[str, float] = field(default_factory=dict)
    congestion: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Episode:
    kind: str  # a cause, a confounder, or "healthy"
    guise: str
    start: float
    end: float
    gpus: tuple[int, ...] = ()
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class NodeSim:
    instance: str
    rng: random.Random
    n_gpus: int = 8
    sdk: bool = True
    job_io: bool = False
    two_jobs: bool = False
    interval: float = 5.0
    tiers: dict[str, Tier] = field(default_factory=dict)
    nets: dict[str, Net] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    psi: dict[str, float] = field(default_factory=dict)
    psi_full: dict[str, float] = field(default_factory=dict)
    energy: list[float] = field(default_factory=list)
    nvl: list[float] = field(default_factory=list)
    xid: dict[tuple[int, str], float] = field(default_factory=dict)
    phases: dict[tuple[str, str], float] = field(default_factory=dict)
    steps: dict[str, float] = field(default_factory=dict)
    ckpt_bytes: dict[str, float] = field(default_factory=dict)
    job_tier: dict[tuple[str, str, str], float] = field(default_factory=dict)
    rank_phases: dict[tuple[str, str, str], float] = field(default_factory=dict)
    data_tier: str = "warm"
    # The network benchmark's nodes: link state, fault and congestion counters and per-rank
    # phases are emitted; `roce` makes the job's fabric RoCE (ECN/CNP, no transmit-wait).
    link_counters: bool = False
    roce: bool = False
    errors_trickle: float = 0.0  # healthy symbol errors per second (a marginal cable)
    # How its GPUs read while their ranks wait in a collective (bench/nvml_reading.py): a
    # node's job runs a rank per GPU, so on NCCL (`spin`, the default) a GPU that waits for
    # the fabric or a slower peer reads busy and SM activity (GPM, reported then) shows
    # its compute; `compute_only` reads the compute share and reports no SM activity.
    collectives: str = nvml.SPIN

    def __post_init__(self) -> None:
        r = self.rng
        self.tiers = {
            "hot": Tier("hot", True, r.uniform(5e9, 7e9), r.uniform(8e-5, 1.5e-4)),
            "warm": Tier("warm", True, r.uniform(1.5e9, 2.5e9), r.uniform(4e-4, 9e-4)),
            "cold": Tier("cold", False, r.uniform(6e8, 1.2e9), r.uniform(2e-3, 4e-3)),
        }
        self.data_tier = r.choice(["warm", "warm", "hot", "cold"])
        self.nets = {
            "mlx5_0": Net("mlx5_0", "roce" if self.roce else "infiniband", 25e9),
            "eth0": Net("eth0", "ethernet", 12.5e9),
        }
        if self.link_counters:
            ib = self.nets["mlx5_0"]
            if self.roce:
                ib.errors = dict.fromkeys(("link_downed", "out_of_sequence"), 0.0)
                ib.congestion = dict.fromkeys(("np_ecn_marked_roce_packets", "np_cnp_sent"), 0.0)
            else:
                ib.errors = dict.fromkeys(("symbol_error", "link_downed", "port_rcv_errors"), 0.0)
                ib.congestion = {"port_xmit_discards": 0.0}
            self.nets["eth0"].errors = dict.fromkeys(("carrier_changes", "rx_errors"), 0.0)
        self.cpu = {
            m: 0.0 for m in ("user", "system", "iowait", "idle", "irq", "softirq", "steal", "nice")
        }
        self.psi = {"cpu": 0.0, "io": 0.0, "memory": 0.0}
        self.psi_full = {"io": 0.0, "memory": 0.0}
        self.energy = [0.0] * self.n_gpus
        self.nvl = [0.0] * self.n_gpus

    def jobs_at(self, t: float, eps: list[Episode]) -> dict[int, str]:
        """GPU -> job id; a job ends during `idle` and restarts after it (with a new id)."""
        held: dict[int, str] = {}
        gen = sum(1 for e in eps if e.kind == "idle" and e.end < t)
        for g in range(self.n_gpus):
            half = "b" if self.two_jobs and g >= self.n_gpus // 2 else "a"
            held[g] = f"{self.instance.split(':')[0]}-{half}{gen}"
        for e in eps:
            if e.kind == "idle" and e.start < t <= e.end:
                for g in e.gpus:
                    held.pop(g, None)
        return held


def _noise(r: random.Random, sigma: float = 0.08) -> float:
    return math.exp(r.gauss(0.0, sigma))


def schedule(sim: NodeSim, t0: float, hours: float, kinds: list[tuple[str, str]]) -> list[Episode]:
    """Healthy warm-up, then the given episodes in order with healthy gaps between them."""
    r = sim.rng
    t = t0 + r.uniform(WARMUP_MIN[0], WARMUP_MIN[1]) * 60
    eps: list[Episode] = []
    all_gpus = tuple(range(sim.n_gpus))
    half = tuple(range(sim.n_gpus // 2)) if sim.two_jobs else all_gpus
    for kind, guise in kinds:
        iv = sim.interval
        dur = round(r.uniform(150, 420) / iv) * iv
        gpus = half
        if kind == "short_dip":
            dur = 20.0
            gpus = (r.randrange(sim.n_gpus),)
        elif kind == "gpu_error":
            # lost: one GPU falls off the bus and the rest of its job stalls with it;
            # fatal XID: one GPU fails and the (elastic) job goes on without it
            lost = r.randrange(sim.n_gpus // 2 if sim.two_jobs else sim.n_gpus)
            gpus = (lost, *(g for g in half if g != lost)) if guise == "lost" else (lost,)
        elif kind == "checkpointing":
            dur = round(r.uniform(90, 240) / iv) * iv
        elif kind == "idle":
            dur = round(r.uniform(180, 420) / iv) * iv
        start = round(t / iv) * iv
        eps.append(Episode(kind, guise, start, start + dur, gpus))
        if kind == "idle":  # the next job starts after the idle stretch: a startup episode
            s2 = start + dur
            d2 = round(r.uniform(120, 300) / iv) * iv
            eps.append(Episode("startup", "load_weights", s2, s2 + d2, gpus))
            t = s2 + d2
        else:
            t = start + dur
        t += r.uniform(6, 14) * 60
    return eps


def simulate(
    sim: NodeSim, eps: list[Episode], t0: float, t_end: float
) -> tuple[list[str], list[Label]]:
    """The node's OpenMetrics lines (without '# EOF') and its labels."""
    r = sim.rng
    iv = sim.interval
    inst = sim.instance
    out: list[str] = []
    labels: list[Label] = []
    for e in eps:
        if e.kind in CAUSES:
            target = e.gpus
            if e.kind == "throttling":
                target = tuple(g for g in e.gpus if g not in e.extra.get("hot", ()))  # type: ignore[operator]
            reason = NETWORK_GUISE_REASONS[e.guise] if e.kind == "network" else ""
            # a late peer makes this node's GPUs victims: straggler (the reason stays peer)
            cause = "straggler" if reason == "peer" else e.kind
            for g in target:
                labels.append(Label(inst, str(g), e.start + iv, e.end + iv, cause, reason))
    # throttling: which GPUs are slowed (the others of the job wait for them)
    for e in eps:
        if e.kind == "throttling":
            k = 1 if e.guise == "thermal_peer" else 2
            hot = tuple(r.sample(list(e.gpus), k))
            e.extra["n_hot"] = float(k)
            e.extra["hot"] = hot  # type: ignore[assignment]
    labels = [lab for lab in labels if lab.cause != "throttling"]
    for e in eps:
        if e.kind == "throttling":
            for g in e.gpus:
                if g not in e.extra["hot"]:  # type: ignore[operator]
                    labels.append(Label(inst, str(g), e.start + iv, e.end + iv, "throttling"))
    restart_at = t0 + r.uniform(0.3, 0.7) * (t_end - t0) if r.random() < 0.5 else -1.0
    lost_once: set[int] = set()
    # a stable hash (str hash() is salted per process): the same seed gives the same trace
    uuid = [
        f"GPU-{zlib.crc32(f'{inst}/{g}'.encode()) % 10**8:08d}-sim-{g}" for g in range(sim.n_gpus)
    ]
    t = t0
    job_first: dict[str, float] = {}
    while t < t_end:
        t += iv
        active = [e for e in eps if e.start < t <= e.end]
        kinds = {e.kind: e for e in active}
        if restart_at > 0 and t >= restart_at:  # the agent restarts: counters from zero
            restart_at = -1.0
            for tier in sim.tiers.values():
                for f in (
                    "read_bytes",
                    "written_bytes",
                    "reads",
                    "writes",
                    "read_time",
                    "write_time",
                    "io_time",
                    "io_weighted",
                ):
                    setattr(tier, f, 0.0)
            for n in sim.nets.values():
                n.rx = n.tx = n.tx_wait = 0.0
        jobs = sim.jobs_at(t, eps)
        for jid in set(jobs.values()):
            job_first.setdefault(jid, t)
        # --- the step model: time per step = max(input, compute, communication) -------
        dt_tier = sim.tiers[sim.data_tier]
        need_read = r.uniform(0.18, 0.25) * dt_tier.ceiling  # healthy read demand
        compute = 1.0
        t_input_io = 0.0
        t_cpu = 0.55 * _noise(r, 0.05)  # decode/augment, relative to compute
        t_comm = 0.35 * _noise(r, 0.05)  # all-reduce, overlapped partly
        cpu_busy = 0.45 * _noise(r, 0.05)
        steal = 0.0
        lat_mult = 1.0
        ceiling = dt_tier.ceiling
        ib_extra = 0.0
        tx_wait_rate = 0.002 * _noise(r, 0.3)
        ib_eff = 1.0
        link_fault = ""  # the network benchmark's guises: "flapping", "link_errors"
        ecn_rate = 0.0
        write_tier: str | None = None
        write_rate = 0.0
        compute_overhead = 0.0
        stall_all = False
        startup = False
        for e in active:
            if e.kind == "data_loading":
                if e.guise == "saturated":
                    need_read = ceiling * r.uniform(2.6, 3.6)
                else:  # other nodes hammer the shared tier: little throughput, high latency
                    ceiling = dt_tier.ceiling * r.uniform(0.04, 0.07)
                    lat_mult = r.uniform(8, 16)
            elif e.kind == "preprocessing":
                if e.guise == "cpu_bound":
                    t_cpu = r.uniform(1.8, 2.6)
                else:
                    t_cpu = r.uniform(1.6, 2.2)
                    steal = r.uniform(0.15, 0.25)
                cpu_busy = r.uniform(0.95, 0.99)
            elif e.kind == "network":
                if e.guise == "saturated":
                    ib_extra = 1.0
                    t_comm = r.uniform(1.8, 2.5)
                    if sim.link_counters:  # a full link runs out of credits now and then too
                        tx_wait_rate = r.uniform(0.005, 0.08)
                elif e.guise in ("flapping", "link_errors"):
                    # retrains and lost packets: the collectives crawl, little gets through,
                    # and what waits to be resent waits for credits too
                    link_fault = e.guise
                    ib_eff = r.uniform(0.3, 0.6)
                    t_comm = r.uniform(1.8, 2.8)
                    tx_wait_rate = r.uniform(0.002, 0.03)
                elif e.guise == "peer":
                    # another node's rank is late: this node's links idle while it waits
                    t_comm = r.uniform(1.8, 2.8)
                elif sim.roce:  # congested RoCE: switches mark ECN, DCQCN slows the senders
                    ib_eff = r.uniform(0.25, 0.45)
                    ecn_rate = r.uniform(3e3, 1e5)
                    t_comm = r.uniform(1.8, 2.8)
                else:
                    ib_eff = r.uniform(0.25, 0.45)
                    tx_wait_rate = r.uniform(0.25, 0.6)
                    t_comm = r.uniform(1.8, 2.8)
            elif e.kind == "unknown":
                compute_overhead = r.uniform(0.7, 1.3)  # host time in the loop, one core
            elif e.kind == "checkpointing":
                stall_all = True
                write_tier = "hot" if e.guise == "hot_tier" else "cold"
                write_rate = sim.tiers[write_tier].ceiling * r.uniform(0.75, 0.95)
        compute += compute_overhead  # GPU idle while one host thread works
        # effective input time per step: reads through the tier's ceiling
        read_rate = min(need_read, ceiling)
        t_input_io = need_read / max(read_rate, 1.0) * 0.6
        input_time = max(t_input_io, t_cpu)
        step_time = max(compute, input_time, t_comm)
        util_job = (compute - compute_overhead) / step_time
        # the tier's physics: utilization of its ceiling drives queueing and latency
        min(
            read_rate / dt_tier.ceiling
            + (write_rate / dt_tier.ceiling if write_tier == sim.data_tier else 0.0),
            0.99,
        )
        if "data_loading" in kinds and kinds["data_loading"].guise == "saturated":
            pass
        # --- GPU states -----------------------------------------------------------------
        gpu_util: list[float | None] = []
        ups: list[float] = []
        clocks: list[float] = []
        reasons: list[set[str]] = [set() for _ in range(sim.n_gpus)]
        th = kinds.get("throttling")
        hot = th.extra["hot"] if th else ()  # type: ignore[assignment]
        affected: set[int] = set()
        for e in active:
            if e.kind in ("data_loading", "preprocessing", "network", "unknown"):
                affected.update(e.gpus)
        # the GPUs whose ranks wait in collectives: for the fabric, or for a throttled peer
        in_collective = {g for e in active if e.kind == "network" for g in e.gpus}
        if th is not None:
            in_collective.update(g for g in th.gpus if g not in hot)
        coll_wait: list[float] = []
        for g in range(sim.n_gpus):
            u = util_job if g in affected else 1.0
            in_job = g in jobs
            up = 1.0
            clock = 1.98e9 * _noise(r, 0.01)
            if stall_all and g in kinds["checkpointing"].gpus:
                u = r.uniform(0.0, 0.08)
            if th is not None and g in th.gpus:
                if g in hot:
                    u = r.uniform(0.96, 1.0)
                    clock *= 0.55
                    reasons[g] = (
                        {"hw_thermal_slowdown", "sw_thermal_slowdown"}
                        if th.guise == "thermal_peer"
                        else {"hw_power_brake_slowdown", "hw_slowdown"}
                    )
                else:
                    u = r.uniform(0.5, 0.62)
            cf = kinds.get("thermal_full_util")
            if cf is not None:
                reasons[g] = {"sw_thermal_slowdown"}
                clock *= 0.8
            pt = kinds.get(PEER_THROTTLED_HEALTHY)
            if pt is not None and g in pt.gpus:  # slowed a little, not enough to hold the job
                reasons[g] = {"hw_slowdown"}
                clock *= 0.9
            st = kinds.get("startup")
            if st is not None and g in st.gpus:
                u = r.uniform(0.0, 0.03)
                startup = True
            if not in_job:
                u = 0.0
                clock = 2.1e8
            dip = kinds.get("short_dip")
            if dip is not None and g in dip.gpus:
                u = r.uniform(0.2, 0.4)
            ge = kinds.get("gpu_error")
            if ge is not None and g in ge.gpus:
                if ge.guise == "lost" and g != ge.gpus[0]:
                    u = r.uniform(0.0, 0.05)  # the job's collectives wait for the lost GPU
                elif ge.guise == "lost":
                    up = 0.0
                    if g not in lost_once:
                        lost_once.add(g)
                        sim.xid[(g, "79")] = sim.xid.get((g, "79"), 0.0) + 1
                else:
                    if (g, "48") not in sim.xid or t - ge.start <= iv:
                        sim.xid[(g, "48")] = sim.xid.get((g, "48"), 0.0) + (
                            1 if t - ge.start <= iv else 0
                        )
                    u = 0.0
            elif ge is None and lost_once:
                lost_once.clear()
            if u >= 0.8 or not in_job:
                u = min(1.0, u + r.gauss(0, 0.015)) if u >= 0.8 else u
            else:
                u = min(max(u + r.gauss(0, 0.03), 0.0), 0.78)
            gpu_util.append(None if up == 0.0 else max(0.0, min(1.0, u)))
            coll_wait.append(1.0 - max(0.0, min(1.0, u)) if g in in_collective else 0.0)
            ups.append(up)
            clocks.append(clock if up else 0.0)
        # --- storage counters -------------------------------------------------------------
        busy_frac = sum((u or 0.0) for u in gpu_util) / sim.n_gpus
        for tier in sim.tiers.values():
            rb = 0.0
            wb = 0.0
            if tier.name == sim.data_tier and not stall_all and not startup:
                rb = read_rate * (0.3 + 0.7 * min(1.0, busy_frac / max(util_job, 0.05)))
            if startup and tier.name == "hot":
                rb += tier.ceiling * r.uniform(0.3, 0.5)
            if tier.name == "cold" and "archive_busy" in kinds:
                rb += tier.ceiling * r.uniform(0.6, 0.8)
            if write_tier == tier.name:
                wb = write_rate
            wb += 2e6 * _noise(r, 0.3)  # logs
            rho_t = min((rb + wb) / tier.ceiling, 0.985)
            if (
                tier.name == sim.data_tier
                and "data_loading" in kinds
                and kinds["data_loading"].guise == "saturated"
            ):
                rho_t = 0.985
            lat = tier.latency * (1.0 + rho_t / (1.0 - rho_t) * 0.15) * _noise(r, 0.1)
            if tier.name == sim.data_tier and lat_mult > 1:
                lat *= lat_mult
            if tier.name == "cold" and "archive_busy" in kinds:
                lat *= 4
            rb *= _noise(r, 0.08)
            io_size = 256e3 if tier.block else 1e6
            nreads = rb / io_size
            nwrites = wb / 1e6
            tier.read_bytes += rb * iv
            tier.written_bytes += wb * iv
            tier.reads += nreads * iv
            tier.writes += nwrites * iv
            tier.read_time += nreads * lat * iv
            tier.write_time += nwrites * lat * 1.5 * iv
            if tier.block:
                busy = min(1.0, rho_t * 1.05 + 0.02) * _noise(r, 0.03)
                tier.io_time += min(busy, 1.0) * iv
                qd = (nreads * lat + nwrites * lat * 1.5) * _noise(r, 0.05)
                tier.io_weighted += qd * iv
        # --- fabric --------------------------------------------------------------------------
        ib = sim.nets["mlx5_0"]
        base_ib = 8e9 * busy_frac / max(util_job, 0.05) * util_job
        ib_rate = base_ib
        if ib_extra:
            ib_rate = ib.speed * r.uniform(0.93, 0.99)
        if ib_eff < 1.0:
            ib_rate = 8e9 * ib_eff * _noise(r, 0.1)
        if "network_busy_healthy" in kinds:
            ib_rate = min(ib_rate + 9e9, ib.speed * 0.75)
        ib.tx += ib_rate * _noise(r, 0.05) * iv
        ib.rx += ib_rate * _noise(r, 0.05) * iv
        ib.tx_wait += tx_wait_rate * iv
        if sim.link_counters:
            _link_counters(sim, r, link_fault, ecn_rate, eps, t)
        eth = sim.nets["eth0"]
        eth_rate = 5e7 * _noise(r, 0.3)
        nfs = sim.tiers["cold"]
        if write_tier == "cold":
            eth_rate += write_rate
        eth_rate += nfs.read_bytes and 0.0
        eth.tx += eth_rate * iv
        eth.rx += 3e7 * _noise(r, 0.3) * iv
        eth.tx_wait += 0.001 * iv
        # --- host ----------------------------------------------------------------------------
        ncpu = 64
        iow = 0.01
        psi_io = 0.02
        if "data_loading" in kinds:
            iow = r.uniform(0.08, 0.18)
            psi_io = r.uniform(0.25, 0.5)
        if stall_all:
            psi_io = r.uniform(0.1, 0.3)
            iow = r.uniform(0.03, 0.08)
        psi_cpu = 0.03 if cpu_busy < 0.9 else r.uniform(0.35, 0.7)
        if startup:
            cpu_busy = 0.2
        busy = min(cpu_busy, 0.99 - iow)
        shares = {
            "user": busy * 0.8 * (1 - steal),
            "system": busy * 0.15,
            "softirq": busy * 0.05,
            "steal": busy * steal * 0.8,
            "iowait": iow,
            "irq": 0.0,
            "nice": 0.0,
        }
        shares["idle"] = max(0.0, 1.0 - sum(shares.values()))
        for m, s in shares.items():
            sim.cpu[m] += ncpu * s * iv
        sim.psi["cpu"] += psi_cpu * _noise(r, 0.1) * iv
        sim.psi["io"] += psi_io * _noise(r, 0.1) * iv
        sim.psi["memory"] += 0.001 * iv
        sim.psi_full["io"] += psi_io * 0.6 * iv
        sim.psi_full["memory"] += 0.0
        # --- SDK phases per job ---------------------------------------------------------------
        job_ids = sorted(set(jobs.values()))
        for jid in job_ids:
            gpus = [g for g, j in jobs.items() if j == jid]
            ju = sum(gpu_util[g] or 0.0 for g in gpus) / max(len(gpus), 1)
            ranks = len(gpus)
            ph = {
                "compute": ju,
                "data_wait": 0.0,
                "checkpoint": 0.0,
                "communication": 0.0,
                "startup": 0.0,
                "other": 0.0,
            }
            rest = max(0.0, 1.0 - ju)
            if startup and any(g in kinds["startup"].gpus for g in gpus):
                ph["startup"] = rest
            elif stall_all:
                ph["checkpoint"] = rest
            elif "network" in kinds or (
                "throttling" in kinds and any(g in kinds["throttling"].gpus for g in gpus)
            ):
                ph["communication"] = rest
            elif compute_overhead > 0:
                ph["other"] = rest  # the SDK sees time outside its phases
            elif input_time >= max(compute, t_comm) * 1.05:
                ph["data_wait"] = rest
            else:
                ph["communication"] = rest * 0.7
                ph["data_wait"] = rest * 0.3
            for p, v in ph.items():
                sim.phases[(jid, p)] = sim.phases.get((jid, p), 0.0) + v * ranks * iv
            if sim.link_counters:
                # per rank (the SDK's rank view): time in collectives is the communication
                # share; every rank of this node waits alike
                for rank in range(ranks):
                    for p, v in ph.items():
                        k2 = (jid, f"{rank}", "collective_wait" if p == "communication" else p)
                        sim.rank_phases[k2] = sim.rank_phases.get(k2, 0.0) + v * iv
            sim.steps[jid] = sim.steps.get(jid, 0.0) + (0 if startup else ju * iv * 2)
            if stall_all:
                sim.ckpt_bytes[jid] = sim.ckpt_bytes.get(jid, 0.0) + write_rate * iv
            else:
                sim.ckpt_bytes.setdefault(jid, 0.0)
            for tier in sim.tiers.values():
                k = (jid, tier.name, "r")
                share = len(gpus) / sim.n_gpus
                rd = 0.0
                if tier.name == sim.data_tier and not stall_all and not startup:
                    rd = read_rate * share * (0.3 + 0.7 * min(1.0, ju / max(util_job, 0.05)))
                if startup and tier.name == "hot":
                    rd = tier.ceiling * 0.4 * share
                sim.job_tier[k] = sim.job_tier.get(k, 0.0) + rd * iv
                kw = (jid, tier.name, "w")
                sim.job_tier[kw] = (
                    sim.job_tier.get(kw, 0.0)
                    + (write_rate * share if write_tier == tier.name else 1e5) * iv
                )
        # --- emit (a missed scrape now and then) ----------------------------------------------
        if r.random() < 0.01:
            continue
        ts = f"{t:.3f}"
        L = out.append
        il = f'instance="{inst}"'
        for g in range(sim.n_gpus):
            gl = f'gpu="{g}",uuid="{uuid[g]}",{il}'
            L(
                f'gpufeed_gpu_info{{gpu="{g}",uuid="{uuid[g]}",name="NVIDIA H100 80GB HBM3",driver_version="550.54",pci_bus_id="0000:{g:02x}:00.0",backend="simulated",{il}}} 1 {ts}'
            )
            L(f"gpufeed_gpu_up{{{gl}}} {ups[g]:g} {ts}")
            u = gpu_util[g]
            if u is not None:
                _utilization(L, gl, ts, sim, u, coll_wait[g])
                L(f"gpufeed_gpu_memory_used_bytes{{{gl}}} {(7e10 if g in jobs else 5e8):.0f} {ts}")
                L(f"gpufeed_gpu_memory_total_bytes{{{gl}}} 85899345920 {ts}")
                L(f"gpufeed_gpu_sm_clock_hertz{{{gl}}} {clocks[g]:.0f} {ts}")
                sim.energy[g] += (120 + 580 * u) * iv
                L(f"gpufeed_gpu_power_watts{{{gl}}} {120 + 580 * u:.1f} {ts}")
                L(f"gpufeed_gpu_energy_joules_total{{{gl}}} {sim.energy[g]:.1f} {ts}")
                L(f"gpufeed_gpu_temperature_celsius{{{gl}}} {40 + 35 * u:.0f} {ts}")
                sim.nvl[g] += 1e10 * u * _noise(r, 0.05) * iv
                L(f"gpufeed_gpu_nvlink_transmit_bytes_total{{{gl}}} {sim.nvl[g]:.0f} {ts}")
                for reason in (
                    "sw_power_cap",
                    "hw_slowdown",
                    "hw_thermal_slowdown",
                    "sw_thermal_slowdown",
                    "hw_power_brake_slowdown",
                ):
                    L(
                        f'gpufeed_gpu_clock_event_active{{gpu="{g}",uuid="{uuid[g]}",reason="{reason}",{il}}} {1 if reason in reasons[g] else 0} {ts}'
                    )
            for (xg, x), n in sim.xid.items():
                if xg == g:
                    L(
                        f'gpufeed_gpu_xid_errors_total{{gpu="{g}",uuid="{uuid[g]}",xid="{x}",{il}}} {n:g} {ts}'
                    )
            if g in jobs:
                L(
                    f'gpufeed_job_info{{job_id="{jobs[g]}",gpu="{g}",uuid="{uuid[g]}",scheduler="slurm",name="train",{il}}} 1 {ts}'
                )
        for tier in sim.tiers.values():
            dev = f',device="{"nvme0n1" if tier.name == "hot" else "sdb"}"' if tier.block else ""
            tl = f'tier="{tier.name}",mountpoint="/mnt/{tier.name}"{dev},{il}'
            for f, name in (
                ("read_bytes", "read_bytes"),
                ("written_bytes", "written_bytes"),
                ("reads", "reads_completed"),
                ("writes", "writes_completed"),
                ("read_time", "read_time_seconds"),
                ("write_time", "write_time_seconds"),
            ):
                L(f"gpufeed_storage_{name}_total{{{tl}}} {getattr(tier, f):.6g} {ts}")
            if tier.block:
                L(f"gpufeed_storage_io_time_seconds_total{{{tl}}} {tier.io_time:.6g} {ts}")
                L(
                    f"gpufeed_storage_io_time_weighted_seconds_total{{{tl}}} {tier.io_weighted:.6g} {ts}"
                )
            L(f"gpufeed_storage_capacity_bytes{{{tl}}} 1e13 {ts}")
        for n in sim.nets.values():
            nl = f'device="{n.device}",fabric="{n.fabric}",{il}'
            L(f"gpufeed_network_receive_bytes_total{{{nl}}} {n.rx:.6g} {ts}")
            L(f"gpufeed_network_transmit_bytes_total{{{nl}}} {n.tx:.6g} {ts}")
            L(f"gpufeed_network_speed_bytes_per_second{{{nl}}} {n.speed:.6g} {ts}")
            if n.fabric != "roce":  # RoCE ports do not count transmit-wait
                L(f"gpufeed_network_transmit_wait_seconds_total{{{nl}}} {n.tx_wait:.6g} {ts}")
            if sim.link_counters:
                L(f"gpufeed_network_link_up{{{nl}}} {n.up:g} {ts}")
                for fam, counters in (
                    ("link_errors", n.errors),
                    ("congestion_packets", n.congestion),
                ):
                    for c, v in counters.items():
                        L(f'gpufeed_network_{fam}_total{{counter="{c}",{nl}}} {v:.0f} {ts}')
        for m, v in sim.cpu.items():
            L(f'gpufeed_host_cpu_seconds_total{{mode="{m}",{il}}} {v:.6g} {ts}')
        L(f"gpufeed_host_cpus{{{il}}} 64 {ts}")
        for res, v in sim.psi.items():
            L(f'gpufeed_host_pressure_waiting_seconds_total{{resource="{res}",{il}}} {v:.6g} {ts}')
        for res, v in sim.psi_full.items():
            L(f'gpufeed_host_pressure_stalled_seconds_total{{resource="{res}",{il}}} {v:.6g} {ts}')
        for jid in job_ids:
            if sim.sdk:
                for (j, p), v in sim.phases.items():
                    if j == jid:
                        L(
                            f'gpufeed_job_phase_seconds_total{{job_id="{jid}",phase="{p}",{il}}} {v:.6g} {ts}'
                        )
                L(f'gpufeed_job_steps_total{{job_id="{jid}",{il}}} {sim.steps[jid]:.0f} {ts}')
                for (j, rank, p), v in sim.rank_phases.items():
                    if j == jid:
                        L(
                            f'gpufeed_job_rank_phase_seconds_total{{job_id="{jid}",rank="{rank}",phase="{p}",{il}}} {v:.6g} {ts}'
                        )
                L(
                    f'gpufeed_job_checkpoint_written_bytes_total{{job_id="{jid}",{il}}} {sim.ckpt_bytes[jid]:.6g} {ts}'
                )
                L(f'gpufeed_job_checkpoint_seconds_bucket{{job_id="{jid}",le="+Inf",{il}}} 3 {ts}')
            if sim.job_io:
                for (j, tn, rw), v in sim.job_tier.items():
                    if j == jid:
                        m = "read" if rw == "r" else "written"
                        L(
                            f'gpufeed_job_storage_{m}_bytes_total{{job_id="{jid}",tier="{tn}",{il}}} {v:.6g} {ts}'
                        )
    return out, labels


def _utilization(
    L: Callable[[str], None], gl: str, ts: str, sim: NodeSim, u: float, waiting: float
) -> None:
    """A GPU's utilization as NVML reads it (`sim.collectives`: a kernel spinning in a
    collective counts busy), and its SM activity where the node spins (GPM); `u` is the
    share it computed, `waiting` the share its rank waited in a collective."""
    if sim.collectives != nvml.SPIN:  # as before the guise existed: no draw, no GPM
        L(f"gpufeed_gpu_utilization_ratio{{{gl}}} {u:.3f} {ts}")
        return
    r = sim.rng
    L(f"gpufeed_gpu_utilization_ratio{{{gl}}} {nvml.utilization(u, waiting, True, r):.3f} {ts}")
    L(f"gpufeed_gpu_sm_active_ratio{{{gl}}} {nvml.sm_active(u, waiting, r):.3f} {ts}")


def _link_counters(
    sim: NodeSim, r: random.Random, fault: str, ecn_rate: float, eps: list[Episode], t: float
) -> None:
    """The job port's state and fault/congestion counters for one sample (network benchmark).

    Healthy links count nothing; a flapping link goes down as the stall begins and again now
    and then (down for a sample, link_downed +1, a burst of symbol errors as it retrains); a
    faulty one stays up with a steady stream of errors; a congested RoCE fabric marks ECN
    and sends CNPs. The management Ethernet's carrier changes once in a while, in healthy
    time too.
    """
    iv = sim.interval
    ib = sim.nets["mlx5_0"]
    ib.up = 1.0
    # the flap that stalls the job opens the episode; more follow now and then
    first = any(e.guise == "flapping" and e.start < t <= e.start + iv for e in eps)
    if fault == "flapping" and (first or r.random() < iv / 60.0):
        ib.up = 0.0
        ib.errors["link_downed"] += 1
        if "symbol_error" in ib.errors:
            ib.errors["symbol_error"] += r.randint(20, 400)
        else:
            ib.errors["out_of_sequence"] += r.randint(50, 500)
    elif fault == "link_errors":
        rate = r.uniform(2.0, 200.0)
        key = "port_rcv_errors" if "port_rcv_errors" in ib.errors else "out_of_sequence"
        ib.errors[key] += rate * iv
        if "symbol_error" in ib.errors:
            ib.errors["symbol_error"] += rate * r.uniform(2, 5) * iv
    # a marginal cable on some nodes: a trickle of errors in healthy time too
    if sim.errors_trickle and "symbol_error" in ib.errors:
        ib.errors["symbol_error"] += r.uniform(0.0, 2.0 * sim.errors_trickle) * iv
    if sim.roce:  # DCQCN reacts to the odd marked packet in healthy time too
        ecn_rate += r.uniform(0.0, 400.0)
    if ecn_rate:
        ib.congestion["np_ecn_marked_roce_packets"] += ecn_rate * iv
        ib.congestion["np_cnp_sent"] += ecn_rate * r.uniform(0.3, 0.6) * iv
    eth = sim.nets["eth0"]
    if r.random() < iv / 7200.0:  # a management link flap, unrelated to any job
        eth.errors["carrier_changes"] += 2


def build(
    seed: int,
    nodes: int = 6,
    hours: float = 4.0,
    interval: float = 5.0,
    collectives: str = nvml.SPIN,
) -> tuple[str, list[Label]]:
    """A multi-node trace covering every cause in every guise, plus confounders;
    `collectives`: how a GPU waiting in a collective reads (NodeSim.collectives)."""
    r = random.Random(seed)
    t0 = 1_760_000_000.0 + r.randrange(0, 86400)
    # straggler is a job-level cause: bench/multinode_scenarios.py generates it
    kinds_all = [(c, g) for c in CAUSES if c != "startup" for g in GUISES.get(c, ())]
    kinds_all += [(c, "") for c in CONFOUNDERS]
    lines: list[str] = []
    labels: list[Label] = []
    t_end = t0 + hours * 3600
    for n in range(nodes):
        sim = NodeSim(
            f"node-{n:02d}:9400",
            random.Random(r.random()),
            sdk=(n % 2 == 0),
            job_io=(n % 3 == 1),
            two_jobs=(n % 4 == 3),
            interval=interval,
            collectives=collectives,
        )
        kinds = list(kinds_all)
        sim.rng.shuffle(kinds)
        eps = []
        per = max(1, len(kinds))
        # fit the episodes in the trace; leftovers go to the next node
        eps = schedule(sim, t0, hours, kinds[: min(per, 14)])
        eps = [e for e in eps if e.end < t_end - 600]
        out, labs = simulate(sim, eps, t0, t_end)
        lines.extend(out)
        labels.extend(labs)
    lines.append("# EOF")
    return "\n".join(lines) + "\n", labels


def single(
    cause: str,
    guise: str,
    seed: int = 1,
    sdk: bool = True,
    job_io: bool = False,
    minutes: float = 40.0,
    link_counters: bool = False,
    roce: bool = False,
    collectives: str = nvml.SPIN,
) -> tuple[str, list[Label]]:
    """One node, one episode (a cause in one guise, or a confounder): for tests."""
    sim = NodeSim(
        "node-t:9400",
        random.Random(seed),
        sdk=sdk,
        job_io=job_io,
        link_counters=link_counters,
        roce=roce,
        collectives=collectives,
    )
    t0 = 1_760_000_000.0
    eps = schedule(sim, t0, minutes / 60, [(cause, guise)])
    out, labels = simulate(sim, eps, t0, t0 + minutes * 60)
    out.append("# EOF")
    return "\n".join(out) + "\n", labels


PEER_FAULTS = ("lost", "throttled", "fatal_xid")


def peer_fault_then_stalls(seed: int = 5, interval: float = 5.0) -> tuple[str, list[Label]]:
    """Issue 13's defect, one node per fault: a GPU of the job faults in a healthy stretch
    and stays faulty (node-00: falls off the bus; node-01: reports a clock slowdown that
    does not slow its job; node-02: a fatal XID, the elastic job goes on without it) while
    the rest of the job trains at full speed for 15 minutes; then a data tier stall and,
    later, a saturated fabric. Those stalls are named for what they are, not the peer."""
    r = random.Random(seed)
    t0 = 1_760_000_000.0
    t_end = t0 + 75 * 60
    lines: list[str] = []
    labels: list[Label] = []
    for n, fault in enumerate(PEER_FAULTS):
        sim = NodeSim(
            f"node-{n:02d}:9400", random.Random(r.random()), sdk=n != 1, interval=interval
        )
        bad = sim.rng.randrange(sim.n_gpus)
        f0 = t0 + 20 * 60
        if fault == "throttled":
            fault_ep = Episode(PEER_THROTTLED_HEALTHY, "", f0, t_end + 60, (bad,))
            stalled = tuple(range(sim.n_gpus))  # a slowed GPU waits for data like the rest
        else:
            fault_ep = Episode("gpu_error", fault, f0, t_end + 60, (bad,))
            stalled = tuple(g for g in range(sim.n_gpus) if g != bad)
        d0, n0 = t0 + 35 * 60, t0 + 52 * 60
        eps = [
            fault_ep,
            Episode("data_loading", "saturated", d0, d0 + 300, stalled),
            Episode("network", "saturated", n0, n0 + 300, stalled),
        ]
        out, labs = simulate(sim, eps, t0, t_end)
        lines.extend(out)
        labels.extend(labs)
    lines.append("# EOF")
    return "\n".join(lines) + "\n", labels


# What the network benchmark's nodes live through besides their network episodes: other
# causes (the reason must not leak into them) and a confounder.
NETWORK_BENCH_OTHERS: tuple[tuple[str, str], ...] = (
    ("data_loading", "saturated"),
    ("throttling", "thermal_peer"),
    ("unknown", "slow_user_code"),
    ("network_busy_healthy", ""),
    ("short_dip", ""),
)


def build_network(
    seed: int,
    nodes: int = 6,
    hours: float = 4.0,
    interval: float = 5.0,
    collectives: str = nvml.SPIN,
) -> tuple[str, list[Label]]:
    """Traces for the network sub-cause benchmark: every network guise on every node (twice
    on long traces), InfiniBand and RoCE nodes, with and without SDK (and per-rank) signals."""
    r = random.Random(seed)
    t0 = 1_760_000_000.0 + r.randrange(0, 86400)
    lines: list[str] = []
    labels: list[Label] = []
    t_end = t0 + hours * 3600
    for n in range(nodes):
        sim = NodeSim(
            f"net-{n:02d}:9400",
            random.Random(r.random()),
            sdk=(n % 3 != 2),
            interval=interval,
            link_counters=True,
            roce=(n % 2 == 1),
            errors_trickle=0.05 if n % 4 == 0 else 0.0,
            collectives=collectives,
        )
        # a peer is seen only through the job's own account of its waits (SDK, per rank):
        # without it such a stall is indistinguishable from slow user code
        guises = [g for g in NETWORK_GUISE_REASONS if sim.sdk or g != "peer"]
        kinds = [("network", g) for g in guises] * 2 + list(NETWORK_BENCH_OTHERS)
        sim.rng.shuffle(kinds)
        eps = schedule(sim, t0, hours, kinds)
        eps = [e for e in eps if e.end < t_end - 600]
        out, labs = simulate(sim, eps, t0, t_end)
        lines.extend(out)
        labels.extend(labs)
    lines.append("# EOF")
    return "\n".join(lines) + "\n", labels
