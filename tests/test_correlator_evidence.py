"""What a window's evidence and summary say, on the shapes the lab's real runs export.

The job is a CPU-only program under `gpufeed run` (an SDK job: phases and steps from the
SDK, its bytes from /proc/PID/io, so tier="unattributed"), on a node with a hot data tier
and a warm checkpoint tier. Each test plays one of the lab's real faults:
- a checkpoint to the warm tier: the evidence names the warm tier, not "unattributed";
- the data tier throttled: the summary names the tier and says I/O pressure once;
- a CPU quota on the job's cgroup while the host idles: the summary says the quota
  throttled the job (cgroup cpu.stat) and that the host was idle, not "CPUs saturated".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import pytest

from correlator_helpers import T0, analyze_text, snapshots_of, trace_text
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.live import CorrelatorProcessor

INST = 'instance="n1:9400"'
JOB = 'job_id="r-4242"'
FAULT = (600.0, 900.0)  # seconds into the trace
CPUS = 16


def in_fault(s: float) -> bool:
    return FAULT[0] <= s < FAULT[1]


class Counters:
    """Monotonic counters advanced by rate * elapsed time, as the agent exports them."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.last: float | None = None

    def advance(self, s: float, rates: dict[str, float]) -> Iterable[tuple[str, float]]:
        dt = 0.0 if self.last is None else s - self.last
        self.last = s
        for series, r in rates.items():
            self.values[series] = self.values.get(series, 0.0) + r * dt
        return list(self.values.items())


Rates = Callable[[float], dict[str, float]]


def node(job: Rates, host: Rates) -> Callable[[float], Iterable[tuple[str, float | None]]]:
    """A trace generator: the job's and the node's counters at rates given per second."""
    c = Counters()

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        yield from c.advance(s, {**job(s), **host(s)})

    return gen


def phases(compute: float, data_wait: float, checkpoint: float = 0.0) -> dict[str, float]:
    out = {
        f'gpufeed_job_phase_seconds_total{{{JOB},phase="{p}",{INST}}}': v
        for p, v in (("compute", compute), ("data_wait", data_wait), ("checkpoint", checkpoint))
    }
    out[f"gpufeed_job_steps_total{{{JOB},{INST}}}"] = 20.0 * compute
    return out


def job_io(read: float, written: float) -> dict[str, float]:
    lab = f'{JOB},tier="unattributed",{INST}'
    return {
        f"gpufeed_job_storage_read_bytes_total{{{lab}}}": read,
        f"gpufeed_job_storage_written_bytes_total{{{lab}}}": written,
    }


def tier(name: str, read: float, written: float, read_latency: float) -> dict[str, float]:
    """A tier's diskstats-shaped counters: 64 KiB reads at `read_latency` seconds each."""
    lab = f'tier="{name}",mountpoint="/lab/{name}",{INST}'
    reads = read / 65536.0
    busy = min(reads * read_latency, 1.0)
    return {
        f"gpufeed_storage_read_bytes_total{{{lab}}}": read,
        f"gpufeed_storage_written_bytes_total{{{lab}}}": written,
        f"gpufeed_storage_reads_completed_total{{{lab}}}": reads,
        f"gpufeed_storage_read_time_seconds_total{{{lab}}}": reads * read_latency,
        f"gpufeed_storage_writes_completed_total{{{lab}}}": written / 524288.0,
        f"gpufeed_storage_write_time_seconds_total{{{lab}}}": written / 524288.0 * 0.002,
        f"gpufeed_storage_io_time_seconds_total{{{lab}}}": busy,
    }


def cpu(busy: float, iowait: float = 0.01) -> dict[str, float]:
    """CPU seconds per second by mode over CPUS logical CPUs, `busy` of them in user."""
    modes = {"user": busy, "iowait": iowait, "idle": 1.0 - busy - iowait}
    return {
        f'gpufeed_host_cpu_seconds_total{{mode="{m}",{INST}}}': CPUS * share
        for m, share in modes.items()
    }


def psi(cpu_some: float, io_some: float) -> dict[str, float]:
    return {
        f'gpufeed_host_pressure_waiting_seconds_total{{resource="cpu",{INST}}}': cpu_some,
        f'gpufeed_host_pressure_waiting_seconds_total{{resource="io",{INST}}}': io_some,
        f'gpufeed_host_pressure_waiting_seconds_total{{resource="memory",{INST}}}': 0.0,
    }


HEALTHY_READ = 12e6  # bytes per second the input pipeline reads from the hot tier


def healthy_host(s: float) -> dict[str, float]:
    return {
        **tier("hot", HEALTHY_READ, 0.0, 0.0004),
        **tier("warm", 0.0, 2e5, 0.0004),
        **cpu(0.12),
        **psi(0.02, 0.01),
    }


def only_window(ws: list[Window]) -> Window:
    inside = [w for w in ws if w.end_seconds - T0 > FAULT[0] and w.start_seconds - T0 < FAULT[1]]
    assert len(inside) == 1, [(w.cause, w.start_seconds - T0, w.summary) for w in ws]
    return inside[0]


def test_checkpoint_evidence_names_the_tier_the_job_wrote_to(tmp_path: object) -> None:
    """torch.save every step to the warm tier: the job's bytes are unattributed (no
    device in /proc/PID/io), the warm tier's writes rise with them."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.25, 0.05, 0.7), **job_io(HEALTHY_READ * 0.25, 150e6)}
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4)}

    def host(s: float) -> dict[str, float]:
        h = healthy_host(s)
        if in_fault(s):
            h.update(tier("hot", HEALTHY_READ * 0.25, 0.0, 0.0004))
            h.update(tier("warm", 0.0, 160e6, 0.0004))
        return h

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.CHECKPOINTING
    ev = dict(w.evidence)
    assert ev.get(Ctx.CHECKPOINT_TIER) == "warm", w.evidence
    assert "warm tier" in w.summary and "unattributed" not in w.summary, w.summary


def blkio_throttled_hot_tier(s: float) -> dict[str, float]:
    """The host while a blkio read limit holds the hot tier in the fault: reads wait in the
    cgroup's throttle, so the tier's latency stays normal; its read rate falls, I/O pressure
    rises, the CPUs idle."""
    h = healthy_host(s)
    if in_fault(s):
        h.update(tier("hot", 5e5, 0.0, 0.0004))
        h.update(cpu(0.03, 0.05))
        h.update(psi(0.02, 0.95))
    return h


def test_data_stall_summary_names_the_tier_and_says_io_pressure_once(tmp_path: object) -> None:
    """A blkio read limit on the hot tier: the requests wait in the cgroup's throttle
    before they reach the device, so the tier's own latency and busy time stay normal;
    only the read rate falls, I/O pressure rises and the job waits for input."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.1, 0.9), **job_io(5e5, 1e4)}
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4)}

    w = only_window(analyze_text(trace_text(node(job, blkio_throttled_hot_tier), 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING
    assert dict(w.evidence).get(Ctx.DATA_TIER) == "hot"
    head = w.summary.split(":", 1)[0]
    assert "hot tier" in head, w.summary
    assert w.summary.count("I/O pressure") == 1, w.summary


def cgroup_cpu(periods: float, throttled: float, throttled_s: float, usage_s: float):
    lab = f"{JOB},{INST}"
    return {
        f"gpufeed_job_cpu_periods_total{{{lab}}}": periods,
        f"gpufeed_job_cpu_throttled_periods_total{{{lab}}}": throttled,
        f"gpufeed_job_cpu_throttled_seconds_total{{{lab}}}": throttled_s,
        f"gpufeed_job_cpu_usage_seconds_total{{{lab}}}": usage_s,
    }


def test_cpu_quota_stall_says_the_quota_throttled_the_job_on_an_idle_host(
    tmp_path: object,
) -> None:
    """cpu.max 20000/100000 on the job's cgroup: the input workers are throttled in most
    100 ms periods, PSI's CPU pressure counts the throttled job, the host is 90% idle."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {
                **phases(0.2, 0.8),
                **job_io(HEALTHY_READ * 0.2, 1e4),
                **cgroup_cpu(10.0, 9.0, 2.7, 0.2),
            }
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4), **cgroup_cpu(10.0, 0.0, 0, 1.9)}

    def host(s: float) -> dict[str, float]:
        h = healthy_host(s)
        if in_fault(s):
            h.update(tier("hot", HEALTHY_READ * 0.2, 0.0, 0.0004))
            h.update(cpu(0.08))
            h.update(psi(0.9, 0.01))
        return h

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.PREPROCESSING
    ev = dict(w.evidence)
    assert abs(float(ev[F.JOB_CPU_THROTTLED_RATIO]) - 0.9) < 0.02, w.evidence
    assert abs(float(ev[F.HOST_CPU_IDLE_RATIO]) - 0.91) < 0.02, w.evidence
    assert "saturated" not in w.summary, w.summary
    assert re.search(r"CPU quota throttled it (89|90)% of periods \(cgroup cpu.stat\)", w.summary)
    assert "host 91% idle" in w.summary, w.summary


def test_cpu_saturated_host_still_says_saturated(tmp_path: object) -> None:
    """No quota (no cgroup cpu series): the CPUs themselves are busy; the old words stay."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.2, 0.8), **job_io(HEALTHY_READ * 0.2, 1e4)}
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4)}

    def host(s: float) -> dict[str, float]:
        h = healthy_host(s)
        if in_fault(s):
            h.update(tier("hot", HEALTHY_READ * 0.2, 0.0, 0.0004))
            h.update(cpu(0.97, 0.0))
            h.update(psi(0.8, 0.01))
        return h

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.PREPROCESSING
    assert "CPUs are saturated" in w.summary and "quota" not in w.summary, w.summary


def threads_cpu(running: float, waiting: float) -> dict[str, float]:
    """The job's threads' schedstat sums, seconds per second."""
    lab = f"{JOB},{INST}"
    return {
        f"gpufeed_job_cpu_running_seconds_total{{{lab}}}": running,
        f"gpufeed_job_cpu_waiting_seconds_total{{{lab}}}": waiting,
    }


def saturated_host(s: float) -> dict[str, float]:
    """A host other work keeps 97% busy (PSI cpu 80%) in healthy time as in the fault."""
    return {**healthy_host(s), **cpu(0.97, 0.0), **psi(0.8, 0.01)}


@pytest.mark.parametrize("io_pressure", [0.01, 0.6])
@pytest.mark.parametrize("run_queue", [True, False])
def test_cpu_hogs_on_a_saturated_host_are_named_by_the_jobs_run_queue_wait(
    tmp_path: object, run_queue: bool, io_pressure: float
) -> None:
    """Hogs in the job's cgroup on a host that was already saturated: host CPU busy and PSI
    do not rise above their healthy level, so without the job's own run-queue wait nothing
    stands out (`unknown`, the defect seen in the lab; now at most the job's own word that it
    waits for input, in its input pipeline). With it: `preprocessing`, "the
    job's threads waited for a CPU 90% of the time", headline "the CPUs are saturated" (no
    quota throttled it). I/O pressure from other work during the stall does not turn it
    into a data stall: the job's own threads say why its input is late."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            rq = threads_cpu(0.2, 1.8) if run_queue else {}
            return {**phases(0.2, 0.8), **job_io(HEALTHY_READ * 0.2, 1e4), **rq}
        rq = threads_cpu(1.2, 0.6) if run_queue else {}
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4), **rq}

    def host(s: float) -> dict[str, float]:
        h = saturated_host(s)
        if in_fault(s):
            h.update(tier("hot", HEALTHY_READ * 0.2, 0.0, 0.0004))
            h.update(psi(0.82, io_pressure))
        return h

    ws = analyze_text(trace_text(node(job, host), 1500), tmp_path)
    if not run_queue:
        if io_pressure < 0.1:
            # no node signal stands out: at most the job's own word that it waits for
            # input (issue 23), in its input pipeline, naming no tier
            got = {(w.cause, dict(w.evidence).get(Ctx.DATA_SOURCE)) for w in ws}
            own = (Cause.DATA_LOADING, "input_pipeline")
            assert got <= {(Cause.UNKNOWN, None), own}, [(w.cause, w.summary) for w in ws]
            assert all(Ctx.DATA_TIER not in dict(w.evidence) for w in ws), ws
        return
    w = only_window(ws)
    assert w.cause is Cause.PREPROCESSING, w.summary
    assert abs(float(dict(w.evidence)[F.JOB_CPU_WAIT_RATIO]) - 0.9) < 0.02, w.evidence
    assert re.search(r"the job's threads waited for a CPU (89|90)% of the time", w.summary)
    assert "CPUs are saturated" in w.summary and "quota" not in w.summary, w.summary


def test_cpu_quota_with_io_pressure_from_other_work_stays_preprocessing(tmp_path: object) -> None:
    """The heavier quota run the lab named data_loading for 41 s of 100: the job waits for
    input 90% of the time and other tenants' I/O raises the host's PSI io meanwhile. The
    quota throttling the job's own threads decides; the summary says quota, not storage."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {
                **phases(0.1, 0.9),
                **job_io(HEALTHY_READ * 0.1, 1e4),
                **cgroup_cpu(10.0, 9.5, 2.9, 0.05),
                **threads_cpu(0.05, 0.6),
            }
        return {
            **phases(0.93, 0.07),
            **job_io(HEALTHY_READ, 1e4),
            **cgroup_cpu(10.0, 0.0, 0, 1.9),
            **threads_cpu(1.2, 0.2),
        }

    def host(s: float) -> dict[str, float]:
        h = healthy_host(s)
        if in_fault(s):
            h.update(tier("hot", HEALTHY_READ * 0.1, 0.0, 0.0004))
            h.update(cpu(0.08))
            h.update(psi(0.9, 0.5))
        return h

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.PREPROCESSING, w.summary
    assert "CPU quota throttled it" in w.summary and "saturated" not in w.summary, w.summary


def test_throttled_tier_stays_data_loading_when_the_jobs_threads_do_not_wait(
    tmp_path: object,
) -> None:
    """A blkio read limit on a host other work keeps busy: the input workers sleep on I/O
    and wake briefly, and on most wakeups wait for a CPU, so of their own (small) runnable
    time two thirds is waiting, as much as starved workers (the lab's short throttle
    scenario was named preprocessing that way). Against the CPU time the job usually
    wants it is little: the data stall is still named, with the tier."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.1, 0.9), **job_io(5e5, 1e4), **threads_cpu(0.05, 0.1)}
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4), **threads_cpu(1.0, 0.4)}

    w = only_window(analyze_text(trace_text(node(job, blkio_throttled_hot_tier), 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert F.JOB_CPU_WAIT_RATIO not in dict(w.evidence), w.evidence


def job_tier_reads(name: str, read: float) -> dict[str, float]:
    """The job's reads from one tier as its cgroup's io accounting gives them."""
    lab = f'{JOB},tier="{name}",{INST}'
    return {
        f"gpufeed_job_storage_read_bytes_total{{{lab}}}": read,
        f"gpufeed_job_storage_written_bytes_total{{{lab}}}": 0.0,
    }


def test_contended_tier_says_most_of_its_reads_are_not_the_jobs(tmp_path: object) -> None:
    """Another tenant reads the job's data tier at depth on a device of finite capacity:
    the tier reads 2 MB/s, the job gets 0.4 MB/s of it (its cgroup's accounting), each read
    waits 20x longer. data_loading, tier hot, evidence "80% of the hot tier's reads are not
    the job's" and a headline that says the tier is shared. In healthy time the job is the
    tier's only reader (share 0)."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.35, 0.65), **job_tier_reads("hot", 4e5)}
        return {**phases(0.93, 0.07), **job_tier_reads("hot", 1.2e6)}

    def host(s: float) -> dict[str, float]:
        h = {**healthy_host(s), **tier("hot", 1.2e6, 0.0, 0.0004)}
        if in_fault(s):
            h.update(tier("hot", 2e6, 0.0, 0.008))
            h.update(psi(0.02, 0.6))
        return h

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING, w.summary
    ev = dict(w.evidence)
    assert ev.get(Ctx.DATA_TIER) == "hot", w.evidence
    assert abs(float(ev[F.DATA_TIER_FOREIGN_READ_SHARE]) - 0.8) < 0.03, w.evidence
    head = w.summary.split(":", 1)[0]
    assert head.endswith("waits for data from the hot tier, shared with another reader"), head


def tenant_disk(s: float, latency: float = 0.0004) -> dict[str, float]:
    """The host's shared disk (`unassigned`: no tiers configured), which other work reads
    at 20 MB/s in healthy time as in the fault; the job's data never comes from it."""
    return tier("unassigned", 20e6, 1e6, latency)


def test_other_tenants_latency_on_a_disk_the_job_does_not_read_is_not_its_data_tier(
    tmp_path: object,
) -> None:
    """Issue 23: a job under `gpufeed run` that reads nothing while it sleeps in its
    loader (its 30 MB of imports were read before it trained; /proc/PID/io says so) on a
    host whose shared disk other work makes 6.6x slower meanwhile, with I/O pressure. The
    disk is not the job's data tier: no window names it, and the host's I/O pressure does
    not say "storage" for a job that reads no tier."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.05, 0.95), **job_io(0.0, 1e3)}
        return {**phases(0.93, 0.07), **job_io(0.0, 1e3)}

    def host(s: float) -> dict[str, float]:
        h = {**healthy_host(s), **tenant_disk(s)}
        if in_fault(s):
            h.update(tenant_disk(s, 0.0004 * 6.6))
            h.update(psi(0.02, 0.4))
        return h

    ws = analyze_text(trace_text(node(job, host), 1500), tmp_path)
    assert ws, "the job's stall opened no window"
    for w in ws:
        assert dict(w.evidence).get(Ctx.DATA_TIER) != "unassigned", (w.cause, w.summary)
        assert "unassigned" not in w.summary, w.summary
        assert F.IO_PRESSURE_WHILE_WAITING_FOR_INPUT not in dict(w.evidence), w.evidence


def io_processes(n: int) -> dict[str, float]:
    """The agent's count of the processes it sums the job's /proc/PID/io over (its input
    workers included): a gauge, so the counters' rate helper must not advance it."""
    return {f"gpufeed_job_io_processes{{{JOB},{INST}}}": float(n)}


@pytest.mark.parametrize("counted", [True, False], ids=["workers-counted", "older-agent"])
def test_a_sleeping_loader_beside_other_works_disk_load_is_its_input_pipeline(
    tmp_path: object, counted: bool
) -> None:
    """Issue 23: a sleep in `__getitem__` while a test suite loads the host's disk (I/O
    pressure 56%, iowait 25% on the recorded run). The agent sums the job's workers with
    it (`gpufeed_job_io_processes`) and they read nothing: the host's I/O stall is other
    work's, and the wait is the job's own input pipeline (it was `unknown`). From an agent
    that did not count its workers (no such gauge) nothing shows the job reads no tier:
    then the host's stall still keeps the wait from being told as the pipeline's, and no
    window names storage or a tier either way."""

    def job(s: float) -> dict[str, float]:
        shares = phases(0.05, 0.95) if in_fault(s) else phases(0.93, 0.07)
        return {**shares, **job_io(0.0, 1e3)}

    def host(s: float) -> dict[str, float]:
        h = {**healthy_host(s), **tenant_disk(s)}
        if in_fault(s):
            h.update(tenant_disk(s, 0.0004 * 6.6))
            h.update(psi(0.02, 0.56))
            h.update(cpu(0.3, iowait=0.25))
        return h

    gen = node(job, host)

    def with_gauge(t: float) -> Iterable[tuple[str, float | None]]:
        yield from gen(t)
        if counted:
            yield from io_processes(3).items()

    w = only_window(analyze_text(trace_text(with_gauge, 1500), tmp_path))
    ev = dict(w.evidence)
    assert Ctx.DATA_TIER not in ev, w.evidence
    if counted:
        assert (w.cause, ev.get(Ctx.DATA_SOURCE)) == (Cause.DATA_LOADING, "input_pipeline"), (
            w.summary
        )
        assert F.IO_PRESSURE_RATIO not in ev or not ev[F.IO_PRESSURE_RATIO], w.evidence
    else:
        assert not (w.cause is Cause.DATA_LOADING and Ctx.DATA_SOURCE not in ev), w.summary
        assert w.cause is Cause.UNKNOWN, w.summary


def test_uncounted_input_workers_behind_a_read_limit_are_storage(tmp_path: object) -> None:
    """The lab's mn2-tier-throttle: the job's /proc/PID/io counts nothing, in healthy time
    as in the fault (its DataLoader workers read unseen until they are reaped), while the
    hot tier, which reads 12 MB/s in healthy time, falls to 0.5 MB/s under a blkio read
    limit with I/O pressure. The tier slowed with the job: data_loading from the hot tier,
    never "no storage signal explains the wait" beside the host's I/O pressure."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.1, 0.9), **job_io(0.0, 1e3)}
        return {**phases(0.93, 0.07), **job_io(0.0, 1e3)}

    w = only_window(analyze_text(trace_text(node(job, blkio_throttled_hot_tier), 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert dict(w.evidence).get(Ctx.DATA_TIER) == "hot", w.evidence
    assert "no storage" not in w.summary, w.summary


def test_unattributed_reads_name_the_tier_that_carries_them_not_a_busier_one(
    tmp_path: object,
) -> None:
    """The job's bytes come from /proc/PID/io (no device): a read limit on the hot tier
    slows them to 0.5 MB/s while another tenant, which reads the scratch tier at 20 MB/s in
    healthy time too, makes that tier 8x slower. Both tiers read as much as the job does;
    the hot one carries the job's bytes (it reads about what the job reads, and carried its
    usual reads in healthy time): the window names hot, never scratch."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**phases(0.1, 0.9), **job_io(5e5, 1e4)}
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4)}

    def host(s: float) -> dict[str, float]:
        h = {**blkio_throttled_hot_tier(s), **tier("scratch", 20e6, 0.0, 0.0004)}
        if in_fault(s):
            h.update(tier("scratch", 30e6, 0.0, 0.0032))
        return h

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert dict(w.evidence).get(Ctx.DATA_TIER) == "hot", w.evidence
    assert "scratch" not in w.summary, w.summary


def test_a_job_waiting_for_its_input_with_no_node_signal_is_its_input_pipeline(
    tmp_path: object,
) -> None:
    """Issue 23's first stall: an unmodified PyTorch script under `gpufeed run` trains for
    120 s, then sleeps 0.05 s per item in its Dataset's __getitem__ for 150 s. The job says
    it waits for its input 95% of the time; nothing on the node moves (its dataset is in
    memory: it reads nothing; CPUs, PSI and the disk as in healthy time). That is
    data_loading inside the job's own input pipeline, naming no tier, and the summary says
    how much the job waits (it was `unknown`, "no signal stands out")."""

    def stalled(s: float) -> bool:
        return 120.0 <= s < 270.0

    def job(s: float) -> dict[str, float]:
        if stalled(s):
            return {**phases(0.05, 0.95), **job_io(0.0, 1e3)}
        return {**phases(0.93, 0.07), **job_io(0.0, 1e3)}

    text = trace_text(node(job, healthy_host), 400)
    ws = analyze_text(text, tmp_path)
    inside = [w for w in ws if w.end_seconds - T0 > 120.0 and w.start_seconds - T0 < 270.0]
    assert len(inside) == 1, [(w.cause, w.summary) for w in ws]
    (w,) = inside
    ev = dict(w.evidence)
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert ev.get(Ctx.DATA_SOURCE) == "input_pipeline", w.evidence
    assert Ctx.DATA_TIER not in ev, w.evidence
    assert "inside its own input pipeline" in w.summary, w.summary
    assert re.search(r"job waits for input 9\d% of the time", w.summary), w.summary

    # live, the open window's gauge says where the wait is: its alert's route (job owners)
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), interval_seconds=5.0)
    sources: set[tuple[str, str]] = set()
    for snap in snapshots_of(text):
        for fam in proc.process(snap):  # type: ignore[arg-type]
            for smp in fam.samples:
                if smp.name == "gpufeed_gpu_underutilization_cause":
                    sources.add((smp.label("cause"), smp.label("data_source")))
    proc.close()
    assert sources == {("data_loading", "input_pipeline")}, sources


@pytest.mark.parametrize("starved_by", ["quota", "run_queue"])
def test_the_jobs_own_cpu_starvation_decides_on_a_host_busy_with_cpus_and_disks(
    tmp_path: object, starved_by: str
) -> None:
    """Issue 23: a real PyTorch job whose cgroup CPU quota starves its input workers was
    named preprocessing for only 30% of the fault while the host was busy with other work
    (package installs and test suites: CPUs and disks at once). Here the other work keeps
    the CPUs 97% busy throughout and, during the fault, makes the disk under the job's hot
    tier 5x slower and busy, with I/O pressure. The job's own starvation (its quota
    throttles it in 60% of periods, or its threads wait for a CPU 90% of the time) decides:
    preprocessing, not the tier's latency from other work."""

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            own = (
                cgroup_cpu(10.0, 6.0, 1.8, 0.3) if starved_by == "quota" else threads_cpu(0.2, 1.8)
            )
            return {**phases(0.2, 0.8), **job_io(HEALTHY_READ * 0.2, 1e4), **own}
        own = cgroup_cpu(10.0, 0.0, 0, 1.9) if starved_by == "quota" else threads_cpu(1.2, 0.6)
        return {**phases(0.93, 0.07), **job_io(HEALTHY_READ, 1e4), **own}

    def host(s: float) -> dict[str, float]:
        h = saturated_host(s)
        if in_fault(s):
            h.update(tier("hot", HEALTHY_READ * 0.2, 0.0, 0.002))  # others' I/O, same disk
            h.update(psi(0.82, 0.5))
        return h

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.PREPROCESSING, w.summary


@pytest.mark.parametrize("healthy_s", [600.0, 45.0])
def test_a_sleeping_loader_on_a_host_others_saturate_is_not_preprocessing(
    tmp_path: object, healthy_s: float
) -> None:
    """Issue 23's sleep in __getitem__, live on a host other test suites drove to 100% busy
    during the stall: the job's threads hardly ask for a CPU any more (run + wait 0.012
    CPU-seconds a second against 0.6 in healthy time) and do not wait for one, so the
    host's busy CPUs are not why its input is late: data_loading in its input pipeline,
    not preprocessing "the CPUs are saturated". Also 45 s after the job began (a live run
    measured so), before any healthy median exists."""
    stall = (healthy_s, healthy_s + 300.0)

    def stalled(s: float) -> bool:
        return stall[0] <= s < stall[1]

    def job(s: float) -> dict[str, float]:
        if stalled(s):
            return {**phases(0.05, 0.95), **job_io(0.0, 1e3), **threads_cpu(0.01, 0.002)}
        return {**phases(0.93, 0.07), **job_io(0.0, 1e3), **threads_cpu(0.55, 0.05)}

    def host(s: float) -> dict[str, float]:
        h = healthy_host(s)
        if stalled(s):
            h.update(cpu(0.99, 0.0))
            h.update(psi(0.65, 0.01))
        return h

    ws = analyze_text(trace_text(node(job, host), stall[1] + 300.0), tmp_path)
    inside = [w for w in ws if w.end_seconds - T0 > stall[0] and w.start_seconds - T0 < stall[1]]
    assert len(inside) == 1, [(w.cause, w.summary) for w in ws]
    (w,) = inside
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert dict(w.evidence).get(Ctx.DATA_SOURCE) == "input_pipeline", w.evidence
    assert "saturated" not in w.summary, w.summary


def test_a_read_limit_on_the_jobs_tier_before_its_healthy_cpu_wait_is_known_is_storage(
    tmp_path: object,
) -> None:
    """The lab's short scenario on a loaded host: a blkio read limit on the job's own hot
    tier 50 s after the job began (before two minutes of healthy history: no median of
    its threads' run-queue wait). The limit holds the reads before the device (the tier's
    latency, busy time and queue stay as in healthy time); the node stalls on I/O while
    the job waits for its input 60% of the time. Its two loader workers sleep on their
    reads and wake briefly, and on a host other work keeps busy they wait for a CPU at
    most wakeups (80% of their runnable time). That wait, with nothing to rise above, must
    not explain the job's own stalled reads away: data_loading on the hot tier (it was
    preprocessing, the job's CPU evidence outranking the node's I/O stall)."""

    def job(s: float) -> dict[str, float]:
        lab = f'{JOB},tier="hot",{INST}'
        stalled = 50.0 <= s < 120.0
        read = 5e5 if stalled else 1.3e6
        own = threads_cpu(0.03, 0.12) if stalled else threads_cpu(0.07, 0.05)
        return {
            **(phases(0.4, 0.6) if stalled else phases(0.93, 0.07)),
            f"gpufeed_job_storage_read_bytes_total{{{lab}}}": read,
            f"gpufeed_job_storage_written_bytes_total{{{lab}}}": 0.0,
            **own,
        }

    def host(s: float) -> dict[str, float]:
        stalled = 50.0 <= s < 120.0
        h = {**saturated_host(s), **tier("hot", 5e5 if stalled else 1.3e6, 0.0, 0.0004)}
        if stalled:
            h.update(psi(0.8, 0.6))
        return h

    ws = analyze_text(trace_text(node(job, host), 170), tmp_path)
    inside = [w for w in ws if w.end_seconds - T0 > 50.0 and w.start_seconds - T0 < 120.0]
    assert len(inside) == 1, [(w.cause, w.start_seconds - T0, w.summary) for w in ws]
    (w,) = inside
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert dict(w.evidence).get(Ctx.DATA_TIER) == "hot", w.evidence
