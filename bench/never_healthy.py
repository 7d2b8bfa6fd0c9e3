"""Multi-node jobs that are never healthy: a slow worker from the first step (issue 24).

A data-parallel job of N nodes x G GPUs, one rank per GPU, steps of S seconds. Every step
each rank computes (its own time: 0.85 S with 2% noise), then waits in the gradient
all-reduce for the slowest rank, then all ranks move the collective's own bytes together
(0.08 S). The culprit (one GPU, or four GPUs of one node: one replica's pipeline stage)
computes `slow` times longer, from the first step to the last; every other rank waits for
it in every step. Unlike bench/multinode_scenarios.py, which aggregates a step into each
sample, a step here spans samples: a rank computes for whole seconds and waits for whole
seconds (steps of 0.5-60 s), as the issue's production trace did (46 s steps).

Guises (`GUISES`), how NVML's utilization reads a rank inside a collective:

- `spin` (NCCL, the default): the collective kernel spins while it waits, so utilization
  reads ~1.0 all the time; SM activity (GPM) shows only the compute;
- `compute_only` (gloo, or collectives that do not spin): utilization is the compute share.

Series: per GPU utilization, up, SM activity, SM clock, memory; `gpufeed_job_info`; per
rank `gpufeed_job_rank_phase_seconds_total` (compute, collective_wait: reported in flight)
and `gpufeed_job_rank_info` with its GPU; per node the job's phases, steps (summed over its
processes) and processes. No storage, CPU or network counters (the production trace had
none).

Truth: per victim GPU its waiting stretches (from the end of its compute to the end of the
slowest rank's); a healthy job (`slow` 1.0) has none, and no window may open in it.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass

from bench import nvml_reading as nvml

GUISES = nvml.GUISES
COMPUTE_SHARE = 0.85  # a rank's own compute, of a healthy step
COMM_SHARE = 0.08  # the collective's own transfer, every rank alike


@dataclass(frozen=True, slots=True)
class Trace:
    text: str
    job_id: str
    instances: tuple[str, ...]
    gpus_per_node: int
    culprit_instance: str  # "" in a healthy job
    culprit_gpus: tuple[str, ...]  # the culprit's GPUs on its node
    # (instance, gpu) -> the victim's waiting stretches [(start, end)]
    waits: dict[tuple[str, str], list[tuple[float, float]]]
    start: float
    end: float
    step_seconds: float  # a healthy step
    job_step_seconds: float  # the job's mean step, as slow as its slowest rank


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def build(
    step_seconds: float,
    nodes: int = 8,
    gpus: int = 8,
    guise: str = "spin",
    slow: float = 2.4,
    culprit_gpus: int = 4,
    seed: int = 1,
    interval: float = 1.0,
    steps: int = 25,
    min_seconds: float = 600.0,
    gpm: bool = True,
) -> Trace:
    """One job, slow from its first step when `slow` > 1 (its culprit on a random node);
    without `gpm`, no SM activity (GPUs older than Hopper)."""
    nvml.check_guise(guise)
    if step_seconds <= 0 or nodes < 1 or gpus < 1 or not 1 <= culprit_gpus <= gpus:
        raise ValueError("need a step > 0, a node, a GPU and 1..gpus culprit GPUs")
    r = random.Random(zlib.crc32(f"{step_seconds}/{nodes}/{gpus}/{guise}/{seed}".encode()))
    t0 = 1_760_000_000.0 + r.randrange(0, 86400)
    job = f"{50000 + r.randrange(10000)}"
    insts = tuple(f"node-{i:02d}:9842" for i in range(nodes))
    uuid = [[f"GPU-{zlib.crc32(f'{i}/{g}'.encode()):08x}" for g in range(gpus)] for i in insts]
    cnode = r.randrange(nodes)
    cg0 = r.randrange(gpus - culprit_gpus + 1)
    culprit = {(cnode, g) for g in range(cg0, cg0 + culprit_gpus)} if slow > 1.0 else set()
    duration = max(steps * step_seconds * (slow if culprit else 1.0), min_seconds)
    # the steps: per rank its compute end, then the slowest's, then the transfer
    plan: list[tuple[float, list[list[float]], float, float]] = []
    s = t0
    while s < t0 + duration:
        comp = [
            [
                COMPUTE_SHARE * step_seconds * math.exp(r.gauss(0, 0.02))
                * (slow if (k, g) in culprit else 1.0)
                for g in range(gpus)
            ]
            for k in range(nodes)
        ]  # fmt: skip
        slowest = max(max(c) for c in comp)
        comm = COMM_SHARE * step_seconds * math.exp(r.gauss(0, 0.05))
        plan.append((s, comp, s + slowest, s + slowest + comm))
        s += slowest + comm
    t_end = t0 + duration
    waits: dict[tuple[str, str], list[tuple[float, float]]] = {}
    if culprit:
        for st, comp, arrive, _ in plan:
            for k in range(nodes):
                for g in range(gpus):
                    if (k, g) not in culprit and st + comp[k][g] < min(arrive, t_end):
                        key = (insts[k], str(g))
                        waits.setdefault(key, []).append((st + comp[k][g], min(arrive, t_end)))
    lines: list[str] = []
    counters: dict[tuple[int, int, str], float] = {}
    t = t0
    i0 = 0
    while t < t_end:
        t += interval
        while i0 < len(plan) - 1 and plan[i0][3] <= t - interval:
            i0 += 1
        done = sum(1 for p in plan if p[3] <= t)
        _sample(lines, t, interval, plan, i0, insts, uuid, job, (guise, gpm), r, counters, done)
    lines.append("# EOF")
    return Trace(
        "\n".join(lines) + "\n",
        job,
        insts,
        gpus,
        insts[cnode] if culprit else "",
        tuple(str(g) for _, g in sorted(culprit)),
        waits,
        t0,
        t_end,
        step_seconds,
        (plan[-1][3] - t0) / len(plan),
    )


def _shares(
    t: float, iv: float, plan: list[tuple[float, list[list[float]], float, float]], i0: int,
    k: int, g: int,
) -> tuple[float, float]:  # fmt: skip
    """(compute, in-collective) share of rank (k, g) over the sample interval (t - iv, t]."""
    comp = coll = 0.0
    for st, c, _arrive, end in plan[i0:]:
        if st >= t:
            break
        comp += _overlap(t - iv, t, st, st + c[k][g])
        coll += _overlap(t - iv, t, st + c[k][g], end)
    return comp / iv, coll / iv


def _sample(
    lines: list[str],
    t: float,
    iv: float,
    plan: list[tuple[float, list[list[float]], float, float]],
    i0: int,
    insts: tuple[str, ...],
    uuid: list[list[str]],
    job: str,
    how: tuple[str, bool],  # (guise, GPM)
    r: random.Random,
    counters: dict[tuple[int, int, str], float],
    done: int,
) -> None:
    ts = f"{t:.3f}"
    guise, gpm = how
    L = lines.append
    gpus = len(uuid[0])
    for k, inst in enumerate(insts):
        il = f'instance="{inst}"'
        node_comp = node_coll = 0.0
        for g in range(gpus):
            fc, fw = _shares(t, iv, plan, i0, k, g)
            gl = f'gpu="{g}",uuid="{uuid[k][g]}",{il}'
            util = nvml.utilization(fc, fw, guise == nvml.SPIN, r)
            sm = nvml.sm_active(fc, fw, r)
            L(f"gpufeed_gpu_up{{{gl}}} 1 {ts}")
            L(f"gpufeed_gpu_utilization_ratio{{{gl}}} {util:.3f} {ts}")
            if gpm:
                L(f"gpufeed_gpu_sm_active_ratio{{{gl}}} {sm:.3f} {ts}")
            L(f"gpufeed_gpu_sm_clock_hertz{{{gl}}} 1980000000 {ts}")
            L(f"gpufeed_gpu_memory_used_bytes{{{gl}}} 7e10 {ts}")
            L(f"gpufeed_gpu_memory_total_bytes{{{gl}}} 8.5e10 {ts}")
            L(f'gpufeed_job_info{{job_id="{job}",gpu="{g}",uuid="{uuid[k][g]}",{il}}} 1 {ts}')
            rank = k * gpus + g
            for ph, v in (("compute", fc), ("collective_wait", fw)):
                key = (k, g, ph)
                counters[key] = counters.get(key, 0.0) + v * iv
                L(
                    f'gpufeed_job_rank_phase_seconds_total{{job_id="{job}",rank="{rank}",'
                    f'phase="{ph}",{il}}} {counters[key]:.3f} {ts}'
                )
            L(
                f'gpufeed_job_rank_info{{job_id="{job}",rank="{rank}",local_rank="{g}",'
                f'world_size="{len(insts) * gpus}",uuid="{uuid[k][g]}",{il}}} 1 {ts}'
            )
            node_comp += fc
            node_coll += fw
        for ph, v in (("compute", node_comp), ("communication", node_coll)):
            key = (k, -1, ph)
            counters[key] = counters.get(key, 0.0) + v * iv
            L(
                f'gpufeed_job_phase_seconds_total{{job_id="{job}",phase="{ph}",{il}}} '
                f"{counters[key]:.3f} {ts}"
            )
        L(f'gpufeed_job_steps_total{{job_id="{job}",{il}}} {done * gpus} {ts}')
        L(f'gpufeed_job_processes{{job_id="{job}",{il}}} {gpus} {ts}')
