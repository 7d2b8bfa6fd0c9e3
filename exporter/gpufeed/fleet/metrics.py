"""The fleet's /metrics page, rendered once per cycle from what the cycle found and the
ledger totals (a scrape returns those bytes; it computes nothing)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufeed import catalogue as cat
from gpufeed.exposition import render_text
from gpufeed.fleet.cycle import CycleResult
from gpufeed.fleet.state import FleetState
from gpufeed.model import Families

SPECS = {m.name: m for m in cat.CATALOGUE if m.group == "fleet"}


@dataclass(frozen=True, slots=True)
class Price:
    per_gpu_hour: float
    currency: str


@dataclass(frozen=True, slots=True)
class Progress:
    lag_seconds: float
    cycles_ok_total: int
    cycles_failed_total: int
    windows_total: int
    cycle_duration_seconds: float | None


def render(
    state: FleetState, last: CycleResult | None, progress: Progress, price: Price | None
) -> bytes:
    f = Families()
    for m in SPECS.values():
        f.declare_spec(m)
    put = f.put
    if last is not None:
        for h in last.held_back:
            labels = {
                "job_id": h.job_id,
                "culprit_instance": h.culprit_instance,
                "culprit_gpu": h.culprit_gpu,
                "culprit_rank": h.culprit_rank,
                "cause": h.cause,
            }
            put(SPECS["gpufeed_fleet_job_culprit_info"], _present(labels), 1.0)
            put(SPECS["gpufeed_fleet_job_waiting_gpus"], {"job_id": h.job_id}, h.waiting_gpus)
        for x in last.imbalanced:
            labels = {"job_id": x.job_id, "reason": x.reason, "pipeline_stage": x.pipeline_stage}
            put(SPECS["gpufeed_fleet_job_imbalance_info"], _present(labels), 1.0)
        for job, cause, n in last.underutilized_gpus:
            put(SPECS["gpufeed_fleet_job_underutilized_gpus"], {"job_id": job, "cause": cause}, n)
        put(SPECS["gpufeed_fleet_jobs"], {}, len(last.jobs))
        put(SPECS["gpufeed_fleet_cycle_queries"], {}, last.queries)
        put(SPECS["gpufeed_fleet_cycle_points"], {}, last.points)
    for job, v in sorted(state.allocated_gpu_seconds.items()):
        put(SPECS["gpufeed_fleet_job_allocated_gpu_seconds_total"], {"job_id": job}, v)
    for (job, st, culprit_cause), v in sorted(state.gpu_seconds.items()):
        labels = _present({"job_id": job, "state": st, "culprit_cause": culprit_cause})
        put(SPECS["gpufeed_fleet_job_gpu_seconds_total"], labels, v)
        if price is not None:
            money = v / 3600.0 * price.per_gpu_hour
            put(
                SPECS["gpufeed_fleet_job_cost_total"], {**labels, "currency": price.currency}, money
            )
    put(SPECS["gpufeed_fleet_lag_seconds"], {}, progress.lag_seconds)
    put(SPECS["gpufeed_fleet_cursor_timestamp_seconds"], {}, state.cursor_seconds)
    put(SPECS["gpufeed_fleet_cycles_total"], {"result": "ok"}, progress.cycles_ok_total)
    put(SPECS["gpufeed_fleet_cycles_total"], {"result": "error"}, progress.cycles_failed_total)
    put(SPECS["gpufeed_fleet_cycle_duration_seconds"], {}, progress.cycle_duration_seconds)
    put(SPECS["gpufeed_fleet_windows_total"], {}, progress.windows_total)
    return render_text(f.build())


def _present(labels: dict[str, str]) -> dict[str, str]:
    """Optional labels are left out where unknown (absent, not empty)."""
    return {k: v for k, v in labels.items() if v or k in ("job_id", "state", "cause", "reason")}
