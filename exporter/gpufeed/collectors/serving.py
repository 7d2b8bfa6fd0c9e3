"""The "serving" collector: demand of the node's inference servers (vLLM, Triton, TGI).

Each serving endpoint (the config's `serving.endpoints`, and the metrics URLs jobs declared
through the SDK or `gpufeed run --serving-metrics`) is scraped over HTTP every interval, all
at once, each within `serving.timeout_seconds`; `gpufeed.serving.stacks` reads the queue,
the batch and the KV cache from the text. A job that reports its demand itself (SDK
`Job.serving_demand`) is exported the same way, with server="sdk".

A job names its URL and the agent runs as root, so every fetch is bounded
(`gpufeed.serving.fetch`: no redirect, one deadline, a body limit) and runs in a lane of its
own (`gpufeed.serving.pool`): the administrator's endpoints never wait behind a job's. In
its lane, an endpoint that answered last time goes first and one that held its thread to
the deadline last, so endpoints that never answer in time cannot crowd out those that do.
An endpoint whose last fetch is still running is not fetched again until it has ended.

A failing endpoint is `gpufeed_serving_up` 0 with its demand absent (not zero: an
unreachable server's queue is unknown, and an empty queue would read as low demand) and
one more `gpufeed_serving_scrape_failures_total`; the other endpoints and collectors are
served as usual.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpufeed.catalogue import spec
from gpufeed.collectors.base import CollectorContext
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family
from gpufeed.serving.endpoints import (
    MAX_ENDPOINTS,
    MAX_ENDPOINTS_PER_JOB,
    DeclaredServing,
    ServingEndpoint,
    url_problem,
)
from gpufeed.serving.fetch import TIMEOUT, Abort, FetchError, fetch_lines
from gpufeed.serving.pool import Lane, Task
from gpufeed.serving.stacks import Demand, metric_names, parse_serving_lines

log = logging.getLogger(__name__)

P = "gpufeed_serving_"
UP = spec(P + "up")
WAITING = spec(P + "requests_waiting")
RUNNING = spec(P + "requests_running")
KV_CACHE = spec(P + "kv_cache_usage_ratio")
COMPLETED = spec(P + "requests_completed_total")
FAILURES = spec(P + "scrape_failures_total")
FAMILIES = (UP, WAITING, RUNNING, KV_CACHE, COMPLETED, FAILURES)
ADMIN_WORKERS = 8  # threads for the administrator's endpoints
JOB_WORKERS = 8  # threads for the endpoints jobs declared, all jobs together
# Past the deadline, how long a tick waits for the fetches' own timeouts to be recorded
# before it gives up on them (and aborts them).
WAIT_SLACK_SECONDS = 0.05
SDK_SERVER = "sdk"  # the `server` and `endpoint` of demand a job reports itself
# the reason of an endpoint not fetched this interval: its last fetch has not ended, or the
# lane's threads were all held by slower endpoints until the deadline
BUSY = "busy"
UNRECOGNISED = "unrecognised"
# An endpoint's place in its lane's queue, from its last scrape: answered (whatever it
# said) first, then not tried, then those that held their thread to the deadline.
ANSWERED, UNTRIED, SLOW = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Failure:
    """A scrape that gave no demand: the reason (the failure counter's label) and what to
    log."""

    reason: str
    message: str


# endpoint -> what one scrape gave: the demand, or why not
Outcome = Demand | Failure
DeclaredLookup = Callable[[], Mapping[str, DeclaredServing]]


class ServingCollector:
    name = "serving"

    def __init__(self, context: CollectorContext, declared: DeclaredLookup | None = None) -> None:
        self._config = context.config.serving
        self._declared = declared
        self._admin: Lane[Outcome] | None = None
        self._jobs: Lane[Outcome] | None = None
        # the last fetch of each endpoint, until it has ended
        self._in_flight: dict[ServingEndpoint, Task[Outcome]] = {}
        self._rank: dict[ServingEndpoint, int] = {}  # ANSWERED, UNTRIED or SLOW
        self._failures: dict[tuple[str, str, str, str], int] = {}
        self._warn = LogOnce(log)

    def endpoints(self) -> tuple[list[ServingEndpoint], list[DeclaredServing]]:
        """The endpoints to scrape now (config first, then the jobs' own, bounded), and the
        jobs that report their demand themselves."""
        out = list(self._config.endpoints)
        reporting: list[DeclaredServing] = []
        declared = self._declared() if self._declared is not None else {}
        per_job: dict[str, int] = {}
        for job_id, d in sorted(declared.items()):
            if d.requests_waiting is not None:
                reporting.append(d)
            if not d.url or url_problem(d.url, loopback_only=True) is not None:
                continue  # the SDK server refused such a URL already; never fetched
            if any(e.url == d.url and e.job_id == job_id for e in out):
                continue
            per_job[job_id] = per_job.get(job_id, 0) + 1
            if len(out) >= MAX_ENDPOINTS or per_job[job_id] > MAX_ENDPOINTS_PER_JOB:
                self._warn.log(
                    logging.WARNING,
                    ("max_endpoints", job_id),
                    "serving endpoint %s of job %r not scraped: at most %d per node, %d per job",
                    d.url,
                    job_id,
                    MAX_ENDPOINTS,
                    MAX_ENDPOINTS_PER_JOB,
                )
                continue
            out.append(ServingEndpoint(d.url, job_id))
        return out, reporting

    def collect(self) -> list[Family]:
        endpoints, reporting = self.endpoints()
        outcomes = self._scrape(endpoints)
        f = Families()
        for m in FAMILIES:
            f.declare_spec(m)
        problems: list[str] = []
        for e, got in zip(endpoints, outcomes, strict=True):
            for labels in _label_sets(e):
                if isinstance(got, Failure):
                    key = (labels.get("job_id", ""), labels.get("gpu", ""), e.endpoint, got.reason)
                    self._failures[key] = self._failures.get(key, 0) + 1
                    if e.server:
                        labels = {**labels, "server": e.server}
                    f.put(UP, labels, 0.0)
                else:
                    _put_demand(f, {**labels, "server": got.server}, got)
            if isinstance(got, Failure):
                problems.append(f"serving endpoint {e.url}: {got.message}")
        for d in reporting:
            labels = {"job_id": d.job_id, "server": SDK_SERVER, "endpoint": SDK_SERVER}
            _put_demand(
                f, labels, Demand(SDK_SERVER, d.requests_waiting or 0.0, d.requests_running)
            )
        # an endpoint no longer declared (its job ended) takes its failure counts with it
        current = {
            (ls.get("job_id", ""), ls.get("gpu", ""), e.endpoint)
            for e in endpoints
            for ls in _label_sets(e)
        }
        self._failures = {k: n for k, n in self._failures.items() if k[:3] in current}
        for (job_id, gpu, endpoint, reason), n in sorted(self._failures.items()):
            labels = {"endpoint": endpoint, "reason": reason}
            labels |= {k: v for k, v in (("job_id", job_id), ("gpu", gpu)) if v}
            f.put(FAILURES, labels, n)
        self._warn.report(logging.WARNING, problems)
        return f.build()

    def _scrape(self, endpoints: list[ServingEndpoint]) -> list[Outcome]:
        """One outcome per endpoint, within `timeout_seconds` (and WAIT_SLACK_SECONDS)."""
        if not endpoints:
            return []
        timeout = self._config.timeout_seconds
        deadline = time.monotonic() + timeout
        n_admin = len(self._config.endpoints)  # endpoints() puts the config's first
        order = sorted(range(len(endpoints)), key=lambda i: self._rank.get(endpoints[i], UNTRIED))
        tasks: dict[int, Task[Outcome] | Failure] = {}
        for i in order:
            e = endpoints[i]
            last = self._in_flight.get(e)
            if last is not None and not last.done.is_set():
                tasks[i] = Failure(BUSY, "its last scrape has not ended; not scraped again")
            else:
                tasks[i] = self._submit(e, i < n_admin, deadline)
        end = deadline + WAIT_SLACK_SECONDS
        ranked = [_outcome(tasks[i], end, timeout) for i in range(len(endpoints))]
        self._in_flight = {e: t for e, t in self._in_flight.items() if not t.done.is_set()}
        self._rank = {e: rank for e, (_, rank) in zip(endpoints, ranked, strict=True)}
        return [got for got, _ in ranked]

    def _submit(self, e: ServingEndpoint, admin: bool, deadline: float) -> Task[Outcome]:
        c = self._config
        if admin:
            if self._admin is None:
                self._admin = Lane("serving", ADMIN_WORKERS)
            lane, limit = self._admin, c.max_body_bytes
        else:
            if self._jobs is None:
                self._jobs = Lane("serving-jobs", JOB_WORKERS)
            lane, limit = self._jobs, c.job_max_body_bytes
        keep = tuple(n.encode() for n in metric_names(e.server))

        def run(abort: Abort) -> Outcome:
            return _scrape_one(e, deadline, limit, keep, abort)

        task: Task[Outcome] = Task(run, deadline)
        self._in_flight[e] = task
        lane.submit(task)
        return task

    def close(self) -> None:
        """Aborts the fetches in flight and returns at once: nothing waits on a fetch."""
        for lane in (self._admin, self._jobs):
            if lane is not None:
                lane.close()
        self._admin = self._jobs = None
        self._in_flight = {}
        self._rank = {}


def _outcome(t: Task[Outcome] | Failure, end: float, timeout: float) -> tuple[Outcome, int]:
    """What `t` gave by `end` (a monotonic time), and the endpoint's rank for the next
    interval; a fetch that has not ended by then is aborted."""
    if isinstance(t, Failure):
        return t, SLOW
    if not t.done.wait(max(0.0, end - time.monotonic())):
        t.abort.abort()  # its thread is free again at once; the endpoint `busy` until then
        return Failure(TIMEOUT, f"no answer within {timeout} s"), SLOW
    got = t.outcome
    if got is None:  # still queued at the deadline
        return Failure(BUSY, "not scraped: its lane's threads were held to the deadline"), UNTRIED
    slow = isinstance(got, Failure) and got.reason == TIMEOUT
    return got, SLOW if slow else ANSWERED


def _scrape_one(
    e: ServingEndpoint, deadline: float, limit_bytes: int, keep: tuple[bytes, ...], abort: Abort
) -> Outcome:
    lines = fetch_lines(
        e.url, deadline_monotonic=deadline, max_body_bytes=limit_bytes, keep=keep, abort=abort
    )
    try:
        with contextlib.closing(lines):
            got = parse_serving_lines(lines, e.server)
    except FetchError as exc:
        return Failure(exc.reason, str(exc))
    if got is None:
        return Failure(UNRECOGNISED, "no queue metric of a serving stack gpufeed knows")
    return got


def _label_sets(e: ServingEndpoint) -> list[dict[str, str]]:
    """One label set per GPU the endpoint serves on (or one for its job)."""
    base = {"endpoint": e.endpoint} | ({"job_id": e.job_id} if e.job_id else {})
    return [base | {"gpu": g} for g in e.gpus] if e.gpus else [base]


def _put_demand(f: Families, labels: dict[str, str], d: Demand) -> None:
    f.put(UP, labels, 1.0)
    f.put(WAITING, labels, d.requests_waiting)
    f.put(RUNNING, labels, d.requests_running)
    f.put(KV_CACHE, labels, d.kv_cache_usage_ratio)
    f.put(COMPLETED, labels, d.requests_completed)
