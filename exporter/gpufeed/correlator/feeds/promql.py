"""Loading a node's contract series from any Prometheus-compatible range-query API.

Works against Prometheus, VictoriaMetrics, Thanos and Mimir: only `/api/v1/label/.../values`,
`/api/v1/series` and `/api/v1/query_range` are used. Each used metric is queried as
`last_over_time(metric{instance=~"...",<match>}[step])`, so a value exists at a step only
if a sample fell in that step (no five-minute lookback smearing a lost series forward),
chunked in time so that no series exceeds `MAX_POINTS` points (Prometheus refuses more
than 11,000), with instances in batches and queries in parallel threads. Raw counter
values come back; the correlator computes rates itself, as for a trace file.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufeed.correlator.engine.node import (
    CLUSTER_METRICS,
    USED_METRICS,
    NodeSeries,
    cluster_key,
    put_in_order,
)
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.feeds.clock import SNAPSHOT_METRIC, Clocks, clock_of, restamp
from gpufeed.correlator.feeds.matrix import Decoder, Matrix

MAX_POINTS = 10_000
INSTANCE_BATCH = 16
JOB_SERIES_BATCH = 64  # instances per `/api/v1/series` call of the discovery
THREADS = 8
TIMEOUT_SECONDS = 60.0
# Answers worth asking again: the server is overloaded, restarting or behind a proxy that
# lost it. Anything else (a bad query, 4xx) fails the same way every time.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
REFUSED = (
    "(the server refused the credentials or the tenant: check --prometheus.user and "
    "--prometheus.password-file, --prometheus.bearer-token-file, --prometheus.header)"
)
# A 422 naming a limit: the query matched more series or samples than the server allows.
OVER_LIMIT = re.compile(r"exceed|too many|limit", re.IGNORECASE)
LIMITED = (
    "(a limit of the server's: raise VictoriaMetrics' -search.maxUniqueTimeseries, "
    "-search.maxSeries or -search.maxSamplesPerQuery, or Prometheus' --query.max-samples; "
    "or select fewer instances per process with --match, or for analyze --shard K/N)"
)


class PromError(RuntimeError):
    """The server refused or failed a query; the message says which and why."""


class _Transient(PromError):
    """A failure that may pass: connection refused or reset, a timeout, a 5xx or 429."""


@dataclass(frozen=True, slots=True)
class Retry:
    """How patiently one query is asked: `attempts` tries in all, waiting
    `first_backoff_seconds`, then twice that, ... (at most `max_backoff_seconds`) between
    them. The default rides out a TSDB restart of about half a minute."""

    attempts: int = 6
    first_backoff_seconds: float = 1.0
    max_backoff_seconds: float = 16.0
    timeout_seconds: float = TIMEOUT_SECONDS

    def backoff(self, attempt: int) -> float:
        return float(min(self.first_backoff_seconds * 2**attempt, self.max_backoff_seconds))


DEFAULT_RETRY = Retry()


def parse_time(text: str) -> float:
    """Unix seconds, or an RFC 3339 / ISO 8601 time (`2026-01-02T03:04:05Z`)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"not a time: {text!r} (unix seconds or RFC 3339)") from None


def _matchers(match: str) -> str:
    """The inside of a selector: '{a="b"}' or 'a="b"' -> 'a="b"'."""
    m = match.strip()
    if m.startswith("{") and m.endswith("}"):
        m = m[1:-1]
    return m.strip().strip(",")


def _get(
    base: str,
    path: str,
    params: list[tuple[str, str]],
    retry: Retry = DEFAULT_RETRY,
    decode: Decoder = json.loads,
) -> Any:
    """One API call's `data`, asked again with backoff while the failure may pass."""
    began = time.monotonic()
    for attempt in range(max(retry.attempts, 1)):
        try:
            return _get_once(base, path, params, retry.timeout_seconds, decode)
        except _Transient as e:
            if attempt + 1 >= retry.attempts:
                waited = time.monotonic() - began
                n = max(retry.attempts, 1)
                raise PromError(
                    f"{e} (gave up after {n} tr{'ies' if n > 1 else 'y'} over {waited:.0f} s)"
                ) from None
            time.sleep(retry.backoff(attempt))
    raise AssertionError("unreachable")


def _get_once(
    base: str, path: str, params: list[tuple[str, str]], timeout: float, decode: Decoder
) -> Any:
    url = base.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    # a ServerUrl (feeds/access.py) carries the tenant header, credentials and CA
    headers = {"Accept": "application/json", **getattr(base, "headers", {})}
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(
            req, timeout=timeout, context=getattr(base, "ssl_context", None)
        ) as r:
            body = decode(r.read())
    except urllib.error.HTTPError as e:
        detail = ""
        with contextlib.suppress(ValueError, OSError):
            detail = json.loads(e.read()).get("error", "")
        if e.code in (401, 403):  # asked again, the same credentials fail the same way
            detail = f"{detail} {REFUSED}".strip()
        elif e.code == 422 and OVER_LIMIT.search(detail):
            detail = f"{detail} {LIMITED}"
        kind = _Transient if e.code in RETRY_STATUSES else PromError
        raise kind(f"{path}: HTTP {e.code} {detail}".strip()) from None
    except ValueError as e:  # not JSON: a proxy's error page, a truncated body
        raise _Transient(f"{base}{path}: {e}") from None
    except (urllib.error.URLError, OSError) as e:
        if isinstance(getattr(e, "reason", e), ssl.SSLCertVerificationError):
            # the server's certificate is not trusted (--prometheus.ca-file): that stays so
            raise PromError(f"{base}{path}: {e}") from None
        raise _Transient(f"{base}{path}: {e}") from None
    if body.get("status") != "success":
        raise PromError(f"{path}: {body.get('error', 'query failed')}")
    warnings = body.get("warnings")
    if warnings:
        # Thanos and Mimir answer "success" with warnings when a store or querier did not
        # answer (a partial response): analysing that would pass gaps off as complete.
        text = "; ".join(str(w) for w in warnings)
        raise PromError(f"{path}: the answer may be incomplete, the server warns: {text}")
    return body["data"]


def instances(
    base: str, start: float, end: float, match: str, retry: Retry = DEFAULT_RETRY
) -> list[str]:
    """Every instance with a series of a family the correlator reads in [start, end] (no
    other instance has anything to analyse). One label-values call per family, never one
    over every family: a server caps the series one call may match (VictoriaMetrics'
    -search.maxUniqueTimeseries, 300,000 by default: a 1,000-node fleet holds more), and
    one family's series are what a fleet cycle's query of that family matches anyway."""
    inner = _matchers(match)
    span = [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]

    def of(metric: str) -> list[Any]:
        sel = f'{{__name__="{metric}"' + (f",{inner}" if inner else "") + "}"
        found: list[Any] = _get(
            base, "/api/v1/label/instance/values", [("match[]", sel), *span], retry
        )
        return found

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return sorted({str(x) for found in pool.map(of, USED_METRICS) for x in found})


def instance_jobs(
    base: str,
    start: float,
    end: float,
    match: str,
    insts: Sequence[str],
    retry: Retry = DEFAULT_RETRY,
) -> list[tuple[str, str]]:
    """(instance, job_id) of every `gpufeed_job_info` series of `insts` in the range: which
    instances a job spans (one series per job and GPU), asked for JOB_SERIES_BATCH instances
    at a time: `/api/v1/series` answers at most VictoriaMetrics' -search.maxSeries (30,000 by
    default), fewer than a large fleet's jobs and GPUs over a day."""
    inner = _matchers(match)
    span = [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]

    def of(batch: Sequence[str]) -> list[Any]:
        sel = "gpufeed_job_info{" + _instance_selector(batch, inner) + "}"
        found: list[Any] = _get(base, "/api/v1/series", [("match[]", sel), *span], retry)
        return found

    batches = [insts[i : i + JOB_SERIES_BATCH] for i in range(0, len(insts), JOB_SERIES_BATCH)]
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        pairs = {
            (str(d.get("instance", "")), str(d.get("job_id", "")))
            for found in pool.map(of, batches)
            for d in found
        }
    return sorted(p for p in pairs if p[0] and p[1])


def chunks(
    start: float, end: float, step: float, points: int = MAX_POINTS
) -> Iterator[tuple[float, float]]:
    """[start, end] cut into spans of at most `points` steps, all on the grid start + k *
    step: every chunking of a range sees the same instants with the same values."""
    span = step * (min(points, MAX_POINTS) - 1)
    t = start
    while t <= end:
        e = min(end, t + span)
        yield t, e
        t = e + step


def _instance_selector(insts: Sequence[str], inner: str) -> str:
    alt = "|".join(re.escape(x) for x in insts).replace("\\", "\\\\").replace('"', '\\"')
    return f'instance=~"{alt}"' + (f",{inner}" if inner else "")


def _range_params(metric: str, sel: str, s: float, e: float, step: float) -> list[tuple[str, str]]:
    # just under one step: each step sees only the samples that fell inside it
    q = f"last_over_time({metric}{{{sel}}}[{max(int(step * 1000) - 1, 1)}ms])"
    return [("query", q), ("start", f"{s:.3f}"), ("end", f"{e:.3f}"), ("step", f"{step:g}")]


def _query(
    base: str, metric: str, sel: str, s: float, e: float, step: float, retry: Retry
) -> list[dict[str, Any]]:
    data = _get(base, "/api/v1/query_range", _range_params(metric, sel, s, e, step), retry)
    result: list[dict[str, Any]] = data.get("result", [])
    return result


def query_every_instance(
    base: str,
    metric: str,
    match: str,
    span: tuple[float, float],
    step: float,
    retry: Retry,
    decode: Decoder,
) -> Matrix:
    """`metric` of every instance `match` selects over `span`, in one query: the answer
    names the instances (the fleet's cycles fetch a few steps of the whole fleet at once),
    decoded by `decode` (feeds/matrix.py: `matrix.decoder()`)."""
    params = _range_params(metric, _matchers(match), *span, step)
    data: Matrix | None = _get(base, "/api/v1/query_range", params, retry, decode)
    return data or []


def clocks_of(results: Sequence[list[dict[str, Any]]]) -> dict[str, dict[float, float]]:
    """Per instance, the snapshot each grid point holds (feeds/clock.py), from the answers
    of SNAPSHOT_METRIC."""
    out: dict[str, dict[float, float]] = {}
    for result in results:
        for item in result:
            inst = str(item.get("metric", {}).get("instance", ""))
            values = item.get("values", [])
            ts = (float(t) for t, _ in values)
            out.setdefault(inst, {}).update(clock_of(ts, (float(v) for _, v in values)))
    return out


def route_result(
    nodes: dict[str, NodeSeries],
    metric: str,
    result: list[dict[str, Any]],
    clocks: Clocks | None = None,
) -> int:
    """Appends one query's series to their nodes' columns (created on first sight), each
    point at the instant of the snapshot it holds where `clocks` know it (feeds/clock.py);
    returns how many points the answer held."""
    points = 0
    for item in result:
        labels = {k: str(v) for k, v in item.get("metric", {}).items()}
        labels.pop("__name__", None)
        inst = labels.pop("instance", "")
        node = nodes.get(inst)
        if node is None:
            node = put_in_order(nodes, inst, NodeSeries(inst))
        series = node.route(metric, labels)
        if series is None:
            continue
        values = item.get("values", [])
        points += len(values)
        ts = array("d", (float(t) for t, _ in values))
        vs = array("d", (float(v) for _, v in values))
        series.extend_sorted(*restamp(ts, vs, (clocks or {}).get(inst)))
    return points


def share_cluster(
    nodes: dict[str, NodeSeries], answers: Sequence[tuple[str, list[dict[str, Any]]]]
) -> int:
    """Routes the cluster scheduler's series (CLUSTER_METRICS, asked without the node
    selector) into one set of columns that every node of `nodes` shares; returns the points."""
    shared: dict[str, Series] = next((n.cluster for n in nodes.values() if n.cluster), {})
    points = 0
    for metric, result in answers:
        for item in result:
            labels = {k: str(v) for k, v in item.get("metric", {}).items()}
            values = item.get("values", [])
            points += len(values)
            series = shared.setdefault(cluster_key(metric, labels), Series())
            ts = array("d", (float(t) for t, _ in values))
            series.extend_sorted(ts, array("d", (float(v) for _, v in values)))
    for node in nodes.values():
        node.cluster = shared
    return points


def fetch_chunk(
    pool: ThreadPoolExecutor,
    base: str,
    insts: Sequence[str],
    span: tuple[float, float],
    step: float,
    match: str,
    nodes: dict[str, NodeSeries],
    retry: Retry = DEFAULT_RETRY,
) -> tuple[int, int]:
    """Every used metric of `insts` over `span` (within MAX_POINTS), into `nodes`; the
    queries run in `pool`, and each answer is routed (and freed) in metric order.
    Returns (queries, points) asked and received: what the chunk cost the server."""
    inner = _matchers(match)
    sels = [
        _instance_selector(insts[i : i + INSTANCE_BATCH], inner)
        for i in range(0, len(insts), INSTANCE_BATCH)
    ]
    s, e = span
    tasks = [(m, sel) for m in (SNAPSHOT_METRIC, *USED_METRICS) for sel in sels]
    tasks += [(m, inner) for m in CLUSTER_METRICS]  # the cluster's, not any node's
    answers = list(pool.map(lambda t: (t[0], _query(base, t[0], t[1], s, e, step, retry)), tasks))
    clocks = clocks_of([r for m, r in answers if m == SNAPSHOT_METRIC])
    points = 0
    cluster: list[tuple[str, list[dict[str, Any]]]] = []
    for metric, result in answers:
        if metric in CLUSTER_METRICS:
            cluster.append((metric, result))
        elif metric != SNAPSHOT_METRIC:
            points += route_result(nodes, metric, result, clocks)
    points += share_cluster(nodes, cluster)
    return len(tasks), points


def load_range(
    base: str,
    start: float,
    end: float,
    step: float,
    match: str = "",
    retry: Retry = DEFAULT_RETRY,
) -> dict[str, NodeSeries]:
    """Every node's used series over [start, end] at `step` resolution, all at once (the
    streamed analysis, `feeds/stream.py`, holds a bounded part at a time instead)."""
    if end <= start:
        raise ValueError("--end must be after --start")
    if step <= 0:
        raise ValueError("--step must be positive")
    insts = instances(base, start, end, match, retry)
    inner = _matchers(match)
    tasks: list[tuple[str, str, float, float]] = []
    for i in range(0, len(insts), INSTANCE_BATCH):
        sel = _instance_selector(insts[i : i + INSTANCE_BATCH], inner)
        for metric in (SNAPSHOT_METRIC, *USED_METRICS):
            for s, e in chunks(start, end, step):
                tasks.append((metric, sel, s, e))

    def run(task: tuple[str, str, float, float]) -> tuple[str, list[dict[str, Any]]]:
        metric, sel, s, e = task
        return metric, _query(base, metric, sel, s, e, step, retry)

    nodes: dict[str, NodeSeries] = {}
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        results = list(pool.map(run, tasks))  # in task order: chunks stay in time order
    clocks = clocks_of([r for m, r in results if m == SNAPSHOT_METRIC])
    for metric, result in results:
        if metric != SNAPSHOT_METRIC:
            route_result(nodes, metric, result, clocks)
    return nodes
