"""Labelled multi-node jobs for the job-level correlation (issue 13): who holds the job back.

One data-parallel job spans N nodes x G GPUs, one rank per GPU. A step takes, on every
rank, the time of the slowest rank's own work (compute at its GPU's speed, input from its
node's data tier through its node's CPUs) plus the all-reduce (as slow as the slowest
link); a rank that finishes its own work early waits in the collective for the rest. So
the culprit waits least in collectives (it arrives last) and the others wait for it.
How their GPUs read is the `guise` (`GUISES`): `spin` (the default, NCCL) reads them busy
while the collective kernel spins on every node (SM activity, GPM, on every other node,
stays low: the job's busiest GPUs and its ranks' waits tell them from working);
`compute_only` (gloo, or collectives that do not spin) reads the compute share; `mixed`
(what 0.2.0 generated) spins on the GPM nodes only. The agent's contract series are
written for every node: GPU utilization, up, SM activity, SM clock and clock event reasons;
the data tier's counters; the fabric port; host CPU and pressure; the job's phases and
steps; and, per rank, `gpufeed_job_rank_phase_seconds_total` (collective_wait included)
and `gpufeed_job_rank_info` (with the rank's GPU uuid).

Scenarios (`SCENARIOS`), one stall each after a healthy stretch (two for `lost_before`):
one GPU clock-limited (with a clock event reason, and a slow GPU without any), one node's
data tier slow, one node's CPUs starved, one node's link degraded (flapping), congestion
on every node (no culprit: every node's own `network`), one rank hung, one rank killed
(SIGKILL: its process gone without closing the job, `gpufeed_job_rank_lost` 1 and exit
status 137 from `gpufeed run`; NCCL's peers block in the collective until the launcher
restarts the worker group), one GPU lost mid-run, and one GPU lost an hour before a data
tier stall on another node.

Truth (`Label`): per GPU, when it was underutilized, why, and for `straggler` the culprit
(instance, GPU: "" for the whole node). The culprit's own GPUs carry its cause; a culprit
GPU that stays busy (the slow one) has no label.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field

from bench import nvml_reading as nvml

SCENARIOS = (
    "clock_limited",
    "slow_gpu",
    "data_tier_slow",
    "cpu_starved",
    "link_degraded",
    "congestion_everywhere",
    "rank_hung",
    "rank_killed",
    "gpu_lost",
    "gpu_lost_before",
)
HEALTHY = "healthy"  # the same job without a stall: no culprit may be named
# How a GPU waiting in a collective reads (module docstring); the first is the default.
GUISES = (*nvml.GUISES, "mixed")
WARMUP_SECONDS = 900.0  # healthy time first: the baselines need it
STALL_SECONDS = 420.0


@dataclass(frozen=True, slots=True)
class Label:
    """Truth for one GPU: its cause over [start, end], the culprit (instance and its GPUs,
    comma separated; "" for the node as a whole) or the job's imbalance that explains the
    wait (`reason`, the parallel jobs')."""

    instance: str
    gpu: str
    start: float
    end: float
    cause: str
    culprit_instance: str = ""
    culprit_gpu: str = ""
    reason: str = ""  # "stage_imbalance", "input_imbalance"; "" for a named culprit


@dataclass(frozen=True, slots=True)
class Stall:
    """Who holds the job back, from when to when, and what its own node shows."""

    start: float
    end: float
    node: int  # -1: every node (congestion everywhere)
    gpu: int  # -1: the node as a whole
    cause: str  # the culprit's own cause (truth for its node's stalled GPUs)
    kind: str  # the scenario


@dataclass(slots=True)
class _Node:
    instance: str
    gpm: bool
    uuid: list[str]
    cpu: dict[str, float] = field(default_factory=dict)
    psi: dict[str, float] = field(default_factory=dict)
    tier: dict[str, float] = field(default_factory=dict)
    net: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    steps: float = 0.0
    rank_phase: dict[tuple[int, str], float] = field(default_factory=dict)


def _n(r: random.Random, sigma: float = 0.05) -> float:
    return math.exp(r.gauss(0.0, sigma))


@dataclass(frozen=True, slots=True)
class MultiNodeTrace:
    text: str
    labels: list[Label]
    stalls: list[Stall]
    instances: tuple[str, ...]
    job_id: str
    gpus_per_node: int


def build(
    kind: str,
    seed: int = 1,
    nodes: int = 16,
    gpus: int = 8,
    interval: float = 5.0,
    ranks: bool = True,
    guise: str = GUISES[0],
) -> MultiNodeTrace:
    """One job of `nodes` x `gpus` ranks with the stall of scenario `kind`; `guise`, how a
    GPU that waits in a collective reads (`GUISES`)."""
    if kind not in (*SCENARIOS, HEALTHY):
        raise ValueError(f"unknown scenario {kind!r}; known: {', '.join(SCENARIOS)}")
    nvml.check_guise(guise, GUISES)
    r = random.Random(zlib.crc32(f"{kind}/{seed}".encode()))
    t0 = 1_760_000_000.0 + r.randrange(0, 86400)
    job = f"{40000 + r.randrange(10000)}"
    insts = [f"node-{i:02d}:9842" for i in range(nodes)]
    ns = [
        _Node(
            inst,
            gpm=i % 2 == 0,
            uuid=[f"GPU-{zlib.crc32(f'{inst}/{g}'.encode()):08x}" for g in range(gpus)],
        )
        for i, inst in enumerate(insts)
    ]
    culprit = r.randrange(nodes)
    cgpu = r.randrange(gpus)
    s0 = t0 + WARMUP_SECONDS + round(r.uniform(0, 120) / interval) * interval
    stalls: list[Stall] = []
    lost_at = -1.0
    total = WARMUP_SECONDS + 120 + STALL_SECONDS + 600
    if kind == "gpu_lost_before":
        lost_at = s0
        s0 += 3600.0  # the stall comes an hour later, on another node
        total += 3600.0
        other = (culprit + 1 + r.randrange(nodes - 1)) % nodes
        stalls.append(Stall(lost_at, t0 + total + 60, culprit, cgpu, "gpu_error", "lost"))
        stalls.append(Stall(s0, s0 + STALL_SECONDS, other, -1, "data_loading", "data_tier_slow"))
    elif kind != HEALTHY:
        cause, gpu = {
            "clock_limited": ("throttling", cgpu),
            "slow_gpu": ("unknown", cgpu),
            "data_tier_slow": ("data_loading", -1),
            "cpu_starved": ("preprocessing", -1),
            "link_degraded": ("network", -1),
            "congestion_everywhere": ("network", -1),
            "rank_hung": ("unknown", cgpu),
            "rank_killed": ("idle", cgpu),  # its GPU runs nothing of the job any more
            "gpu_lost": ("gpu_error", cgpu),
        }[kind]
        node = -1 if kind == "congestion_everywhere" else culprit
        end = s0 + STALL_SECONDS if kind != "gpu_lost" else t0 + total + 60
        stalls.append(Stall(s0, end, node, gpu, cause, kind))
    t_end = t0 + total
    labels = _labels(stalls, ns, gpus, interval, t_end)
    lines: list[str] = []
    t = t0
    while t < t_end:
        t += interval
        _sample(lines, ns, stalls, t, interval, gpus, job, r, ranks, lost_at, guise)
    lines.append("# EOF")
    return MultiNodeTrace("\n".join(lines) + "\n", labels, stalls, tuple(insts), job, gpus)


def _labels(
    stalls: list[Stall], ns: list[_Node], gpus: int, interval: float, t_end: float
) -> list[Label]:
    """Truth per GPU, from the first sample that shows a stall to the first after it."""
    out: list[Label] = []
    for st in stalls:
        a, b = st.start + interval, min(st.end, t_end) + interval
        if st.kind == "lost":  # the lost GPU alone; the elastic job goes on without it
            out.append(Label(ns[st.node].instance, str(st.gpu), a, b, "gpu_error"))
            continue
        for i, n in enumerate(ns):
            for g in range(gpus):
                if st.node == -1:
                    cause, ci, cg = st.cause, "", ""
                elif i == st.node and (st.gpu == -1 or g == st.gpu):
                    if st.kind in ("clock_limited", "slow_gpu"):
                        continue  # the slow GPU itself computes flat out
                    cause, ci, cg = st.cause, "", ""
                elif i == st.node and st.kind in ("clock_limited", "gpu_lost"):
                    # its node's other GPUs: the node sees why (a throttled or lost peer)
                    cause, ci, cg = st.cause, "", ""
                else:
                    cause = "straggler"
                    ci = ns[st.node].instance
                    cg = "" if st.gpu == -1 else str(st.gpu)
                if any(
                    x.kind == "lost" and x.node == i and x.gpu == g and x.start < b for x in stalls
                ):
                    continue  # lost earlier: it stays gpu_error
                out.append(Label(n.instance, str(g), a, b, cause, ci, cg))
    return out


def _spins(guise: str, gpm: bool) -> bool:
    """Whether a node's GPUs read busy while they wait in a collective (`GUISES`)."""
    return guise == nvml.SPIN or (guise == "mixed" and gpm)


def _sample(
    lines: list[str],
    ns: list[_Node],
    stalls: list[Stall],
    t: float,
    iv: float,
    gpus: int,
    job: str,
    r: random.Random,
    ranks: bool,
    lost_at: float,
    guise: str = GUISES[0],
) -> None:
    """One sample of every node at t."""
    now = [s for s in stalls if s.start < t <= s.end]
    # per rank: its own work per step, compute (at its GPU's speed) and input (its node's
    # data tier and CPUs, overlapped with compute), relative to a healthy step of ~1.0
    nn = len(ns)
    comp = [[0.9 * _n(r, 0.015) for _ in range(gpus)] for _ in range(nn)]
    inp = [[0.5 * _n(r, 0.03) for _ in range(gpus)] for _ in range(nn)]
    comm = 0.05 * _n(r, 0.05)  # the all-reduce left after overlap
    tier_slow = [1.0] * nn
    cpu_busy = [0.4 * _n(r, 0.05) for _ in range(nn)]
    psi_cpu = [0.02] * nn
    tx_wait = [0.002 * _n(r, 0.3) for _ in range(nn)]
    link_drop = [1.0] * nn
    hung: tuple[int, int] | None = None
    killed: tuple[int, int] | None = None
    lost: set[tuple[int, int]] = set()
    reason: dict[tuple[int, int], str] = {}
    clock = [[1.98e9] * gpus for _ in range(nn)]
    for st in stalls:
        if st.kind == "lost" and t > st.start:
            lost.add((st.node, st.gpu))
    for st in now:
        k, g = st.node, st.gpu
        if st.kind == "clock_limited":
            comp[k][g] *= 2.2
            clock[k][g] *= 0.45
            reason[(k, g)] = "hw_slowdown"
        elif st.kind == "slow_gpu":
            comp[k][g] *= 2.2  # no reason reported: a weak part or a heavier shard
        elif st.kind == "data_tier_slow":
            tier_slow[k] = r.uniform(7.0, 10.0)
            inp[k] = [2.4 * _n(r, 0.03) for _ in range(gpus)]
        elif st.kind == "cpu_starved":
            cpu_busy[k] = r.uniform(0.96, 0.99)
            psi_cpu[k] = r.uniform(0.4, 0.7)
            inp[k] = [2.2 * _n(r, 0.03) for _ in range(gpus)]
        elif st.kind == "link_degraded":
            tx_wait[k] = r.uniform(0.3, 0.6)
            link_drop[k] = r.uniform(0.2, 0.4)
            comm = 1.4 * _n(r, 0.05)  # a ring is as slow as its slowest link
        elif st.kind == "congestion_everywhere":
            tx_wait = [r.uniform(0.3, 0.6) for _ in range(nn)]
            link_drop = [r.uniform(0.25, 0.45) for _ in range(nn)]
            comm = 1.5 * _n(r, 0.05)
        elif st.kind in ("rank_hung", "gpu_lost", "rank_killed"):
            hung = (k, g)
            if st.kind == "rank_killed":
                killed = (k, g)
            if st.kind == "gpu_lost":
                lost.add((k, g))
    own = [[max(comp[k][g], inp[k][g]) for g in range(gpus)] for k in range(nn)]
    if hung is not None:
        step = math.inf  # nobody finishes a step while one rank is gone
    else:
        step = max(own[k][g] for k in range(nn) for g in range(gpus) if (k, g) not in lost)
        step += comm
    ts = f"{t:.3f}"
    for k, n in enumerate(ns):
        il = f'instance="{n.instance}"'
        L = lines.append
        comp_total = 0.0
        dw_total = 0.0
        cw_total = 0.0
        for g in range(gpus):
            gl = f'gpu="{g}",uuid="{n.uuid[g]}",{il}'
            gone = (k, g) in lost
            dropped = gone and 0 <= lost_at < t  # the elastic job went on without it
            util = work = wait = data_wait = 0.0
            if not gone and (k, g) != hung:
                if step == math.inf:
                    wait = 1.0
                else:
                    work = comp[k][g] / step
                    data_wait = max(0.0, inp[k][g] - comp[k][g]) / step
                    wait = max(0.0, step - own[k][g]) / step
                util = work
            # waiting in NCCL: the GPU reads busy, its SMs idle (seen only with GPM)
            nv_util = nvml.utilization(util, wait, _spins(guise, n.gpm), r)
            sm = nvml.sm_active(util, wait, r)
            L(f"gpufeed_gpu_up{{{gl}}} {0 if gone else 1} {ts}")
            if not gone:
                L(f"gpufeed_gpu_utilization_ratio{{{gl}}} {nv_util:.3f} {ts}")
                if n.gpm:
                    L(f"gpufeed_gpu_sm_active_ratio{{{gl}}} {min(sm, 1.0):.3f} {ts}")
                L(f"gpufeed_gpu_sm_clock_hertz{{{gl}}} {clock[k][g]:.0f} {ts}")
                on = 1 if reason.get((k, g)) == "hw_slowdown" else 0
                L(f'gpufeed_gpu_clock_event_active{{{gl},reason="hw_slowdown"}} {on} {ts}')
                L(f"gpufeed_gpu_memory_used_bytes{{{gl}}} 7e10 {ts}")
                L(f"gpufeed_gpu_memory_total_bytes{{{gl}}} 8.5e10 {ts}")
            L(f'gpufeed_job_info{{job_id="{job}",gpu="{g}",uuid="{n.uuid[g]}",{il}}} 1 {ts}')
            comp_total += work
            dw_total += data_wait
            cw_total += wait
            rank = k * gpus + g
            if ranks and not dropped:
                for ph, v in (
                    ("compute", work),
                    ("data_wait", data_wait),
                    ("collective_wait", wait),
                ):
                    key = (rank, ph)
                    n.rank_phase[key] = n.rank_phase.get(key, 0.0) + v * iv
                    L(
                        f'gpufeed_job_rank_phase_seconds_total{{job_id="{job}",rank="{rank}",'
                        f'phase="{ph}",{il}}} {n.rank_phase[key]:.3f} {ts}'
                    )
                L(
                    f'gpufeed_job_rank_info{{job_id="{job}",rank="{rank}",local_rank="{g}",'
                    f'world_size="{nn * gpus}",uuid="{n.uuid[g]}",{il}}} 1 {ts}'
                )
                rl = f'job_id="{job}",rank="{rank}",{il}'
                L(f"gpufeed_job_rank_lost{{{rl}}} {1 if (k, g) == killed else 0} {ts}")
                if (k, g) == killed:
                    L(f"gpufeed_job_rank_exit_status{{{rl}}} 137 {ts}")
        # the job's own account (SDK): summed over the node's ranks
        for ph, v in (("compute", comp_total), ("data_wait", dw_total),
                      ("communication", cw_total)):  # fmt: skip
            n.phases[ph] = n.phases.get(ph, 0.0) + v * iv
            L(
                f'gpufeed_job_phase_seconds_total{{job_id="{job}",phase="{ph}",{il}}} {n.phases[ph]:.3f} {ts}'
            )
        n.steps += 0.0 if step == math.inf else iv / step
        # summed over the node's ranks, as the SDK's counter is (build_parallel's note)
        L(f'gpufeed_job_steps_total{{job_id="{job}",{il}}} {round(n.steps) * gpus} {ts}')
        L(f'gpufeed_job_processes{{job_id="{job}",{il}}} {gpus} {ts}')
        # the data tier: reads at the job's pace, latency up when it is slow
        pace = 0.0 if step == math.inf else 1.0 / step
        rb = 1.5e9 * pace * _n(r, 0.05) / max(1.0, tier_slow[k] / 3)
        nreads = rb / 256e3
        lat = 6e-4 * tier_slow[k] * _n(r, 0.1)
        busy = min(1.0, 0.35 * pace + (0.6 if tier_slow[k] > 1 else 0.0)) * _n(r, 0.02)
        tier = n.tier
        for key, inc in (
            ("read_bytes", rb),
            ("reads_completed", nreads),
            ("read_time_seconds", nreads * lat),
            ("io_time_seconds", min(busy, 1.0)),
            ("io_time_weighted_seconds", nreads * lat),
        ):
            tier[key] = tier.get(key, 0.0) + inc * iv
            L(
                f'gpufeed_storage_{key}_total{{tier="warm",mountpoint="/mnt/warm",device="sdb",{il}}}'
                f" {tier[key]:.6g} {ts}"
            )
        # the fabric: all-reduce traffic at the job's pace; transmit-wait where congested
        net = n.net
        bps = 9e9 * pace * link_drop[k] * _n(r, 0.05)
        for key, inc in (
            ("receive_bytes", bps),
            ("transmit_bytes", bps),
            ("transmit_wait_seconds", tx_wait[k]),
        ):
            net[key] = net.get(key, 0.0) + inc * iv
            L(
                f'gpufeed_network_{key}_total{{device="mlx5_0",fabric="infiniband",{il}}} {net[key]:.6g} {ts}'
            )
        L(
            f'gpufeed_network_speed_bytes_per_second{{device="mlx5_0",fabric="infiniband",{il}}} 2.5e10 {ts}'
        )
        # the host: 64 CPUs
        busy_c = min(cpu_busy[k], 0.99)
        for mode, share in (
            ("user", busy_c * 0.85),
            ("system", busy_c * 0.15),
            ("iowait", 0.01),
            ("idle", max(0.0, 0.99 - busy_c)),
        ):
            n.cpu[mode] = n.cpu.get(mode, 0.0) + 64 * share * iv
            L(f'gpufeed_host_cpu_seconds_total{{mode="{mode}",{il}}} {n.cpu[mode]:.6g} {ts}')
        psi_io = 0.3 if tier_slow[k] > 1 else 0.01
        for res, v in (("cpu", psi_cpu[k]), ("io", psi_io)):
            n.psi[res] = n.psi.get(res, 0.0) + v * _n(r, 0.1) * iv
            L(
                f'gpufeed_host_pressure_waiting_seconds_total{{resource="{res}",{il}}} {n.psi[res]:.6g} {ts}'
            )


# ---------------------------------------------------------------------------------------
# Issue 24 (job level): jobs with parallelism coordinates that are never healthy. Kept
# apart from the scenarios above (which stall after a healthy stretch) so that the two can
# grow independently.
#
# The job is dp x pp x tp ranks in Megatron's default order (tensor-parallel fastest, then
# data-parallel, then the pipeline stage: rank = t + tp * (d + dp * p)), `gpus` ranks per
# node, so one node holds the same stage of gpus / tp replicas. Every step each rank works
# for its own time, then waits in the step's collectives (the pipeline's sends and the
# data-parallel all-reduce) until the slowest rank is done: the step takes the slowest
# rank's work plus the all-reduce left after overlap. From the first step:
# - `slow_worker`: one replica's stage (tp GPUs on one node) computes 2.4x slower; every
#   other rank, its node's other GPUs included, waits for it (truth: those ranks, named);
# - `slow_stage`: the last stage computes 1.6x longer on every replica (its layers are
#   heavier): no worker at fault (truth: `stage_imbalance`, no culprit);
# - `rotating_imbalance`: each step one replica, drawn at random, computes 1.3-1.8x longer
#   (its batch holds the long sequences): the slowest data-parallel rank changes every
#   step (truth: `input_imbalance`, no culprit).
# `guise` (GUISES, as for SCENARIOS): `spin` (the default) reads a GPU waiting in a
# collective busy (NCCL's kernel spins) and only SM activity shows the compute;
# `compute_only` counts compute only (gloo-like); every node here has GPM, so `mixed`
# reads as `spin`.
# ---------------------------------------------------------------------------------------

PARALLEL_SCENARIOS = ("slow_worker", "slow_stage", "rotating_imbalance")


# the parallel jobs' truth is the same record (kept under its name for their callers)
ParallelLabel = Label


@dataclass(frozen=True, slots=True)
class ParallelTrace:
    text: str
    labels: list[ParallelLabel]
    kind: str
    instances: tuple[str, ...]
    job_id: str
    gpus_per_node: int
    start: float
    end: float
    step_seconds: float
    # per (instance, gpu): the stretches [start, end] in which it waited for the step's
    # last rank (its exposed wait, each step's all-reduce left out): what "inside windows
    # for 95% of the waiting time" is measured on (a rank of a rotating imbalance waits in
    # the steps another replica gates and none in its own)
    waits: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)


def parallel_rank(d: int, p: int, t: int, dp: int, tp: int) -> int:
    return t + tp * (d + dp * p)


def build_parallel(
    kind: str,
    seed: int = 1,
    dp: int = 4,
    pp: int = 4,
    tp: int = 4,
    gpus: int = 8,
    step_seconds: float = 5.0,
    interval: float = 5.0,
    duration: float = 1800.0,
    guise: str = GUISES[0],
    coords: bool = True,
) -> ParallelTrace:
    """One dp x pp x tp job of scenario `kind` (PARALLEL_SCENARIOS), slow from its first
    step, `duration` seconds (at least 40 steps); `coords`: the ranks report their
    parallelism coordinates (gpufeed_job_rank_info's dp_rank, pp_rank, tp_rank)."""
    if kind not in PARALLEL_SCENARIOS:
        raise ValueError(f"unknown scenario {kind!r}; known: {', '.join(PARALLEL_SCENARIOS)}")
    nvml.check_guise(guise, GUISES)
    world = dp * pp * tp
    if world % gpus or gpus % tp:
        raise ValueError(f"{world} ranks do not fill nodes of {gpus} GPUs by whole tp groups")
    r = random.Random(zlib.crc32(f"parallel/{kind}/{seed}/{dp}x{pp}x{tp}".encode()))
    t0 = 1_760_000_000.0 + r.randrange(0, 86400)
    job = f"{50000 + r.randrange(10000)}"
    nn = world // gpus
    insts = [f"node-{i:02d}:9842" for i in range(nn)]
    uuid = [
        [f"GPU-{zlib.crc32(f'{i}/{g}/{seed}'.encode()):08x}" for g in range(gpus)] for i in insts
    ]
    at = [(d, p, t) for p in range(pp) for d in range(dp) for t in range(tp)]
    at.sort(key=lambda c: parallel_rank(*c, dp, tp))
    slow_d, slow_p = r.randrange(dp), r.randrange(pp)
    if kind == "slow_stage":
        slow_p = pp - 1
    base = 0.9 * step_seconds  # a healthy rank's work; the all-reduce left takes the rest
    starts, work = [t0], []
    n_steps = max(40, int(duration / step_seconds) + 1)
    while len(work) < n_steps:
        heavy = r.randrange(dp) if kind == "rotating_imbalance" else -1
        extra = r.uniform(1.3, 1.8)
        w = []
        for d, p, _t in at:
            x = base * _n(r, 0.01)
            if kind == "slow_worker" and (d, p) == (slow_d, slow_p):
                x *= 2.4
            elif kind == "slow_stage" and p == slow_p:
                x *= 1.6
            elif d == heavy:
                x *= extra
            w.append(x)
        work.append(w)
        starts.append(starts[-1] + max(w) + 0.1 * step_seconds * _n(r, 0.05))
    t_end = min(starts[-1], t0 + max(duration, 40 * step_seconds))
    labels = _parallel_labels(kind, at, insts, gpus, dp, tp, slow_d, slow_p, t0, t_end, interval)
    lines: list[str] = []
    cum_comp = [0.0] * world
    prev = [0.0] * world  # each rank's compute at the sample before
    t = t0
    k = 0  # the step in progress at t
    while t + interval <= t_end:
        t += interval
        while starts[k + 1] <= t:
            for i in range(world):
                cum_comp[i] += work[k][i]
            k += 1
        done = [cum_comp[i] + min(work[k][i], t - starts[k]) for i in range(world)]
        _parallel_sample(lines, insts, uuid, at, done, prev, k, t, t0, interval, gpus, job,
                         r, _spins(guise, True), coords)  # fmt: skip
        prev = done
    lines.append("# EOF")
    waits = _parallel_waits(starts, work, insts, gpus, t0 + interval, t_end)
    return ParallelTrace(
        "\n".join(lines) + "\n", labels, kind, tuple(insts), job, gpus, t0, t_end, step_seconds,
        waits,
    )  # fmt: skip


def _parallel_waits(
    starts: list[float],
    work: list[list[float]],
    insts: list[str],
    gpus: int,
    t0: float,
    t_end: float,
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Each rank's exposed wait per step: from the end of its own work to the end of the
    slowest rank's, clipped to [t0, t_end] (the labels' span)."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for k, w in enumerate(work):
        gate = starts[k] + max(w)
        for i, x in enumerate(w):
            a, b = max(starts[k] + x, t0), min(gate, t_end)
            if b > a:
                out.setdefault((insts[i // gpus], str(i % gpus)), []).append((a, b))
    return out


def _parallel_labels(
    kind: str,
    coords: list[tuple[int, int, int]],
    insts: list[str],
    gpus: int,
    dp: int,
    tp: int,
    slow_d: int,
    slow_p: int,
    t0: float,
    t_end: float,
    interval: float,
) -> list[ParallelLabel]:
    """Truth per GPU, from the first sample to the last."""
    culprit = [i for i, (d, p, _t) in enumerate(coords) if (d, p) == (slow_d, slow_p)]
    c_inst = insts[culprit[0] // gpus]
    c_gpus = ",".join(str(i % gpus) for i in culprit)
    out = []
    for i, (_d, p, _t) in enumerate(coords):
        inst, gpu = insts[i // gpus], str(i % gpus)
        if kind == "slow_worker":
            if i in culprit:
                continue  # it computes flat out
            lab = ParallelLabel(inst, gpu, t0 + interval, t_end, "straggler", c_inst, c_gpus)
        elif kind == "slow_stage":
            if p == slow_p:
                continue
            lab = ParallelLabel(
                inst, gpu, t0 + interval, t_end, "straggler", reason="stage_imbalance"
            )
        else:
            lab = ParallelLabel(
                inst, gpu, t0 + interval, t_end, "straggler", reason="input_imbalance"
            )
        out.append(lab)
    return out


def _parallel_sample(
    lines: list[str],
    insts: list[str],
    uuid: list[list[str]],
    coords: list[tuple[int, int, int]],
    done: list[float],
    prev: list[float],
    steps: int,
    t: float,
    t0: float,
    iv: float,
    gpus: int,
    job: str,
    r: random.Random,
    spinning: bool,
    with_coords: bool,
) -> None:
    """One sample of every node at t: each rank's compute so far is `done`; the rest of
    its time since t0 it waited in collectives."""
    ts = f"{t:.3f}"
    L = lines.append
    world = len(coords)
    for k, inst in enumerate(insts):
        il = f'instance="{inst}"'
        comp_sum = wait_sum = 0.0
        for g in range(gpus):
            i = k * gpus + g
            d, p, tt = coords[i]
            util = max(0.0, min(1.0, (done[i] - prev[i]) / iv))
            wait = 1.0 - util
            gl = f'gpu="{g}",uuid="{uuid[k][g]}",{il}'
            nv = nvml.utilization(util, wait, spinning, r)
            sm = nvml.sm_active(util, wait, r)
            L(f"gpufeed_gpu_up{{{gl}}} 1 {ts}")
            L(f"gpufeed_gpu_utilization_ratio{{{gl}}} {min(nv, 1.0):.3f} {ts}")
            L(f"gpufeed_gpu_sm_active_ratio{{{gl}}} {min(sm, 1.0):.3f} {ts}")
            L(f"gpufeed_gpu_sm_clock_hertz{{{gl}}} 1980000000 {ts}")
            L(f'gpufeed_gpu_clock_event_active{{{gl},reason="hw_slowdown"}} 0 {ts}')
            L(f"gpufeed_gpu_memory_used_bytes{{{gl}}} 7e10 {ts}")
            L(f"gpufeed_gpu_memory_total_bytes{{{gl}}} 8.5e10 {ts}")
            L(f'gpufeed_job_info{{job_id="{job}",gpu="{g}",uuid="{uuid[k][g]}",{il}}} 1 {ts}')
            comp, cw = done[i], (t - t0) - done[i]
            comp_sum += comp
            wait_sum += cw
            rl = f'job_id="{job}",rank="{i}",{il}'
            L(f'gpufeed_job_rank_phase_seconds_total{{{rl},phase="compute"}} {comp:.3f} {ts}')
            L(f'gpufeed_job_rank_phase_seconds_total{{{rl},phase="collective_wait"}} {cw:.3f} {ts}')
            xl = f',dp_rank="{d}",pp_rank="{p}",tp_rank="{tt}"' if with_coords else ""
            L(
                f'gpufeed_job_rank_info{{{rl},local_rank="{g}",world_size="{world}",'
                f'uuid="{uuid[k][g]}"{xl}}} 1 {ts}'
            )
            L(f"gpufeed_job_rank_lost{{{rl}}} 0 {ts}")
        jl = f'job_id="{job}",{il}'
        L(f'gpufeed_job_phase_seconds_total{{{jl},phase="compute"}} {comp_sum:.3f} {ts}')
        L(f'gpufeed_job_phase_seconds_total{{{jl},phase="communication"}} {wait_sum:.3f} {ts}')
        # summed over the node's rank processes, as the SDK's counter is (each rank counts
        # its own steps): a per-node count read as the job's pace made every step `gpus`
        # times as long as it is and left the step rule (engine._over_step) unused
        L(f"gpufeed_job_steps_total{{{jl}}} {steps * gpus} {ts}")
        L(f"gpufeed_job_processes{{{jl}}} {gpus} {ts}")
        _healthy_host(lines, inst, t - t0, ts)


def _healthy_host(lines: list[str], inst: str, since: float, ts: str) -> None:
    """A node whose host, tier and fabric show nothing: 64 CPUs 40% busy, a quiet data
    tier, the all-reduce's traffic well under the link's speed."""
    il = f'instance="{inst}"'
    L = lines.append
    for mode, share in (("user", 0.34), ("system", 0.06), ("iowait", 0.01), ("idle", 0.59)):
        L(f'gpufeed_host_cpu_seconds_total{{mode="{mode}",{il}}} {64 * share * since:.6g} {ts}')
    for res in ("cpu", "io"):
        L(
            f'gpufeed_host_pressure_waiting_seconds_total{{resource="{res}",{il}}} {0.01 * since:.6g} {ts}'
        )
    tl = f'tier="warm",mountpoint="/mnt/warm",device="sdb",{il}'
    for key, rate in (("read_bytes", 2e8), ("reads_completed", 800.0), ("read_time_seconds", 0.5),
                      ("io_time_seconds", 0.1), ("io_time_weighted_seconds", 0.5)):  # fmt: skip
        L(f"gpufeed_storage_{key}_total{{{tl}}} {rate * since:.6g} {ts}")
    nl = f'device="mlx5_0",fabric="infiniband",{il}'
    for key, rate in (
        ("receive_bytes", 5e9),
        ("transmit_bytes", 5e9),
        ("transmit_wait_seconds", 0.002),
    ):
        L(f"gpufeed_network_{key}_total{{{nl}}} {rate * since:.6g} {ts}")
    L(f"gpufeed_network_speed_bytes_per_second{{{nl}}} 2.5e10 {ts}")
