"""A data stall whose re-reads stopped hitting the page cache says so in its evidence.

The shapes are the job_cache collector's: the job's requested and fetched read bytes
(/proc/PID/io rchar and read_bytes) and, per tier, its open files' size and the bytes memory
reclaim evicted from them (cachestat). Healthy, the page cache serves 95% of what the job
reads; in the fault the dataset has outgrown memory: 10% hits, three quarters of the open
shard evicted, the hot tier's read latency 10x and the job waiting for data. A control run
with the same tier stall but a warm cache must not blame the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from correlator_helpers import T0, analyze_text, trace_text
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from test_correlator_evidence import (
    INST,
    JOB,
    Counters,
    cpu,
    healthy_host,
    in_fault,
    only_window,
    phases,
    psi,
    tier,
)

SHARD = 8.0 * 2**30
HEALTHY_REQUESTED = 240e6  # bytes per second the job's reads return


def cache_counters(requested: float, hit: float) -> dict[str, float]:
    return {
        f"gpufeed_job_cache_requested_read_bytes_total{{{JOB},{INST}}}": requested,
        f"gpufeed_job_cache_fetched_read_bytes_total{{{JOB},{INST}}}": requested * (1 - hit),
    }


def residency(evicted: float) -> list[tuple[str, float | None]]:
    lab = f'{JOB},tier="hot",{INST}'
    return [
        (f"gpufeed_job_cache_open_file_bytes{{{lab}}}", SHARD),
        (f"gpufeed_job_cache_evicted_bytes{{{lab}}}", evicted),
    ]


def run(
    tmp_path: object,
    fault_hit: float,
    fault_evicted: float,
    extra: tuple[tuple[str, float], ...] = (),
    extra_at: Callable[[float], Iterable[tuple[str, float | None]]] | None = None,
) -> tuple[str, dict[str, str]]:
    """`extra`: constant samples beside the node's; `extra_at(s)`: samples at s seconds."""
    c = Counters()

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        host = healthy_host(s)
        if in_fault(s):
            requested = 60e6
            job = {**phases(0.2, 0.8), **cache_counters(requested, fault_hit)}
            host.update(tier("hot", requested * (1 - fault_hit) + 1e6, 0.0, 0.004))
            host.update(cpu(0.05, 0.08))
            host.update(psi(0.02, 0.6))
            gauges = residency(fault_evicted)
        else:
            job = {**phases(0.93, 0.07), **cache_counters(HEALTHY_REQUESTED, 0.95)}
            gauges = residency(0.0)
        yield from c.advance(s, {**job, **host})
        yield from gauges
        yield from extra
        if extra_at is not None:
            yield from extra_at(s)

    trace: Callable[[float], Iterable[tuple[str, float | None]]] = gen
    w = only_window(analyze_text(trace_text(trace, 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert dict(w.evidence).get(Ctx.DATA_TIER) == "hot"
    return w.summary, {k: str(v) for k, v in w.evidence}


def test_a_dataset_that_outgrew_memory_is_named_in_the_evidence(tmp_path: object) -> None:
    summary, ev = run(tmp_path, fault_hit=0.1, fault_evicted=0.75 * SHARD)
    assert abs(float(ev[F.JOB_CACHE_HIT_RATIO]) - 0.1) < 0.05, ev
    assert abs(float(ev[F.JOB_CACHE_EVICTED_RATIO]) - 0.75) < 0.05, ev
    assert "re-reads stopped hitting the page cache" in summary, summary


def test_a_tier_stall_with_a_warm_cache_does_not_blame_the_cache(tmp_path: object) -> None:
    summary, ev = run(tmp_path, fault_hit=0.95, fault_evicted=0.0)
    assert F.JOB_CACHE_HIT_RATIO not in ev and F.JOB_CACHE_EVICTED_RATIO not in ev, ev
    assert "page cache" not in summary, summary
