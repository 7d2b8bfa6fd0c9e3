"""Random scenarios for labelled benchmark traces: every cause, in several guises.

A generated scenario runs its jobs in lockstep through a list of episodes: in each, one job
goes through one cause (a data-loading stall on saturated or contended storage, CPU-bound
preprocessing, a checkpoint to one of several tiers, a saturated or congested fabric,
throttling, a lost GPU, the job ending and starting again) while the other jobs compute.
Between episodes everything computes, sometimes under a confounder that must not open a
window: a busy archive tier, a dip of about 20 seconds, thermal throttling at full load.
Durations, magnitudes, guises and the GPU layout all come from the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gpufeed.simulate.engine import mix
from gpufeed.simulate.scenario import (
    COLLECTIVE_GUISES,
    PHASES,
    THROTTLE_REASONS,
    EventSpec,
    JobSpec,
    NodeSpec,
    PhaseSpec,
    Scenario,
    default_ports,
    default_tiers,
)

# Every phase but compute and startup (idle: the job ends; it comes back through `startup`),
# low_demand (only an inference server has it; generated jobs train), and straggler: one node alone cannot tell a peer is late without per-rank signals (a
# scenario file may still ask for it; bench/culprit_accuracy.py judges the job level).
STALL_CAUSES = tuple(
    p for p in PHASES if p not in ("compute", "startup", "straggler", "low_demand")
)
CONFOUNDERS = ("busy_tier", "dip", "thermal")


@dataclass
class _JobPlan:
    job_id: str
    gpus: tuple[int, ...]
    data_tier: str
    checkpoint_tier: str
    sdk: bool
    phases: list[PhaseSpec] = field(default_factory=list)


def random_scenario(
    seed: int,
    duration_seconds: float,
    *,
    sdk: bool | None = None,
    collectives: str = COLLECTIVE_GUISES[0],
    gpus: int = 8,
    stall_seconds: tuple[float, float] = (120.0, 540.0),
    healthy_seconds: tuple[float, float] = (150.0, 900.0),
    confounder_probability: float = 0.5,
) -> Scenario:
    """A node's scenario covering `duration_seconds`; `sdk` None draws it per job;
    `collectives`: how its jobs' GPUs read in a collective wait (COLLECTIVE_GUISES)."""
    rng = random.Random(mix(seed, 101))
    layout = _gpu_layout(rng, gpus)
    plans: list[_JobPlan] = []
    for i, held in enumerate(layout):
        data_tier = rng.choice(("warm", "warm", "hot", "gpu_direct"))
        ckpt_tier = rng.choice(("hot", "gpu_direct", "warm"))
        plans.append(
            _JobPlan(
                job_id=f"job-{seed % 100000:05d}-{i}",
                gpus=held,
                data_tier=data_tier,
                checkpoint_tier=ckpt_tier,
                sdk=rng.random() < 0.5 if sdk is None else sdk,
            )
        )
    events: list[EventSpec] = []
    t = 0.0
    if plans:
        _all(plans, "startup", rng.uniform(90, 240))
        t = plans[0].phases[-1].seconds
    while t < duration_seconds:
        # healthy stretch, sometimes with a confounder in it
        healthy = rng.uniform(*healthy_seconds)
        if plans and rng.random() < confounder_probability:
            events.append(_confounder(rng, plans, t, healthy))
        _all(plans, "compute", healthy)
        t += healthy
        if not plans or t >= duration_seconds:
            break
        j = rng.randrange(len(plans))
        cause = rng.choice(STALL_CAUSES)
        secs = rng.uniform(*stall_seconds)
        for k, plan in enumerate(plans):
            if k != j:
                plan.phases.append(PhaseSpec("compute", secs))
                continue
            plan.phases.append(_stall(rng, plan, cause, secs))
        t += secs
        if cause == "idle":  # a new run of the job: loading weights again
            secs = rng.uniform(90, 240)
            for k, plan in enumerate(plans):
                plan.phases.append(PhaseSpec("startup" if k == j else "compute", secs))
            t += secs
    for plan in plans:  # everyone runs to the end of the trace
        plan.phases.append(PhaseSpec("compute", max(1.0, duration_seconds - t + 60)))
    jobs = tuple(
        JobSpec(
            job_id=p.job_id,
            name=p.job_id.rsplit("-", 1)[0],
            scheduler=rng.choice(("slurm", "kubernetes")),
            gpus=p.gpus,
            data_tier=p.data_tier,
            checkpoint_tier=p.checkpoint_tier,
            sdk=p.sdk,
            data_read_bytes_per_second=0.0,
            steps_per_second=rng.uniform(0.5, 3.0),
            steps_per_epoch=rng.randrange(200, 2000),
            phases=tuple(p.phases),
            collectives=collectives,
        )
        for p in plans
    )
    return Scenario(
        name=f"generated-{seed}",
        repeat=False,
        node=NodeSpec(gpus=gpus),
        tiers=default_tiers(),
        ports=default_ports(),
        jobs=jobs,
        events=tuple(events),
    )


def _gpu_layout(rng: random.Random, gpus: int) -> list[tuple[int, ...]]:
    """Which GPUs each job holds; some GPUs may be held by no job."""
    idle = rng.choice((0, 0, 1, 2)) if gpus > 2 else 0
    held = gpus - idle
    sizes: list[int] = []
    while held > 0:
        size = min(held, rng.choice((1, 2, 4, 4, 8)))
        sizes.append(size)
        held -= size
        if len(sizes) == 3:
            sizes[-1] += held
            break
    out, g = [], 0
    for size in sizes:
        out.append(tuple(range(g, g + size)))
        g += size
    return out


def _all(plans: list[_JobPlan], phase: str, seconds: float) -> None:
    for plan in plans:
        plan.phases.append(PhaseSpec(phase, seconds))


def _stall(rng: random.Random, plan: _JobPlan, cause: str, seconds: float) -> PhaseSpec:
    if cause == "data_loading":
        return PhaseSpec(cause, seconds, guise=rng.choice(("saturated", "contended")))
    if cause == "network":
        return PhaseSpec(cause, seconds, guise=rng.choice(("saturated", "congested")))
    if cause == "checkpointing":
        tier = rng.choice(("", "hot", "gpu_direct", "warm"))
        return PhaseSpec(cause, seconds, tier=tier)
    if cause == "throttling":
        return PhaseSpec(cause, seconds, reason=rng.choice(THROTTLE_REASONS))
    if cause == "gpu_error":
        return PhaseSpec(cause, seconds, gpu=rng.choice(plan.gpus))
    return PhaseSpec(cause, seconds)


def _confounder(rng: random.Random, plans: list[_JobPlan], t: float, span: float) -> EventSpec:
    kind = rng.choice(CONFOUNDERS)
    if kind == "busy_tier":
        used = {p.data_tier for p in plans} | {p.checkpoint_tier for p in plans}
        tier = "cold" if "cold" not in used else rng.choice(("cold",))
        secs = min(span - 30, rng.uniform(120, 600))
        return EventSpec("busy_tier", t + 15, max(30.0, secs), tier=tier)
    job = rng.choice(plans)
    if kind == "dip":
        secs = rng.uniform(12, 25)
        return EventSpec("dip", t + rng.uniform(30, max(31.0, span - 60)), secs, job_id=job.job_id)
    secs = min(span - 30, rng.uniform(60, 400))
    reason = rng.choice(("hw_thermal_slowdown", "sw_thermal_slowdown"))
    return EventSpec("thermal", t + 15, max(30.0, secs), job_id=job.job_id, reason=reason)
