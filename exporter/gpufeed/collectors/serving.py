"""The "serving" collector: demand of the node's inference servers (vLLM, Triton, TGI).

Each serving endpoint (the config's `serving.endpoints`, and the metrics URLs jobs declared
through the SDK or `gpufeed run --serving-metrics`) is scraped over HTTP every interval, all
at once, each within `serving.timeout_seconds`; `gpufeed.serving.stacks` reads the queue,
the batch and the KV cache from the text. A job that reports its demand itself (SDK
`Job.serving_demand`) is exported the same way, with server="sdk".

A failing endpoint is `gpufeed_serving_up` 0 with its demand absent (not zero: an
unreachable server's queue is unknown, and an empty queue would read as low demand) and
one more `gpufeed_serving_scrape_failures_total`; the other endpoints and collectors are
served as usual.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait

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
from gpufeed.serving.stacks import Demand, parse_serving_metrics

log = logging.getLogger(__name__)

P = "gpufeed_serving_"
UP = spec(P + "up")
WAITING = spec(P + "requests_waiting")
RUNNING = spec(P + "requests_running")
KV_CACHE = spec(P + "kv_cache_usage_ratio")
COMPLETED = spec(P + "requests_completed_total")
FAILURES = spec(P + "scrape_failures_total")
FAMILIES = (UP, WAITING, RUNNING, KV_CACHE, COMPLETED, FAILURES)
MAX_BODY_BYTES = 8 << 20  # a vLLM with many LoRA adapters and histograms: a few 100 KB
MAX_WORKERS = 8
SDK_SERVER = "sdk"  # the `server` and `endpoint` of demand a job reports itself

# endpoint -> what one scrape gave: the demand, or the failure reason
Outcome = Demand | str
DeclaredLookup = Callable[[], Mapping[str, DeclaredServing]]


def fetch_metrics(url: str, timeout_seconds: float) -> str:
    """The text at `url`; raises OSError (unreachable, timeout) or urllib's HTTPError."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with urllib.request.urlopen(req, timeout=timeout_seconds) as resp:
        body: bytes = resp.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise OSError(f"more than {MAX_BODY_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


class ServingCollector:
    name = "serving"

    def __init__(
        self,
        context: CollectorContext,
        declared: DeclaredLookup | None = None,
        fetch: Callable[[str, float], str] = fetch_metrics,
    ) -> None:
        self._config = context.config.serving
        self._declared = declared
        self._fetch = fetch
        self._pool: ThreadPoolExecutor | None = None
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
                if isinstance(got, str):
                    key = (labels.get("job_id", ""), labels.get("gpu", ""), e.endpoint, got)
                    self._failures[key] = self._failures.get(key, 0) + 1
                    if e.server:
                        labels = {**labels, "server": e.server}
                    f.put(UP, labels, 0.0)
                else:
                    _put_demand(f, {**labels, "server": got.server}, got)
            if isinstance(got, str):
                problems.append(f"serving endpoint {e.url}: {got}")
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
        if not endpoints:
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="gpufeed-serving")
        timeout = self._config.timeout_seconds
        futures = [self._pool.submit(self._one, e, timeout) for e in endpoints]
        # each fetch has its own timeout; this bound only guards against a stuck resolver
        wait(futures, timeout=timeout * 2 + 0.5)
        return [fu.result() if fu.done() else "unreachable" for fu in futures]

    def _one(self, e: ServingEndpoint, timeout: float) -> Outcome:
        try:
            text = self._fetch(e.url, timeout)
        except urllib.error.HTTPError:
            return "status"
        except (OSError, ValueError):
            return "unreachable"
        got = parse_serving_metrics(text, e.server)
        return got if got is not None else "unrecognised"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


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
