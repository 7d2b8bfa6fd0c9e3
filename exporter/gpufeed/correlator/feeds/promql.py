"""Loading a node's contract series from any Prometheus-compatible range-query API.

Works against Prometheus, VictoriaMetrics, Thanos and Mimir: only `/api/v1/label/.../values`
and `/api/v1/query_range` are used. Each used metric is queried as
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
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from gpufeed.correlator.engine.node import USED_METRICS, NodeSeries

MAX_POINTS = 10_000
INSTANCE_BATCH = 16
THREADS = 8
TIMEOUT_SECONDS = 60.0


class PromError(RuntimeError):
    """The server refused or failed a query; the message says which and why."""


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


def _get(base: str, path: str, params: list[tuple[str, str]]) -> Any:
    url = base.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        detail = ""
        with contextlib.suppress(ValueError, OSError):
            detail = json.loads(e.read()).get("error", "")
        raise PromError(f"{path}: HTTP {e.code} {detail}".strip()) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PromError(f"{base}{path}: {e}") from None
    if body.get("status") != "success":
        raise PromError(f"{path}: {body.get('error', 'query failed')}")
    warnings = body.get("warnings")
    if warnings:
        # Thanos and Mimir answer "success" with warnings when a store or querier did not
        # answer (a partial response): analysing that would pass gaps off as complete.
        text = "; ".join(str(w) for w in warnings)
        raise PromError(f"{path}: the answer may be incomplete, the server warns: {text}")
    return body["data"]


def instances(base: str, start: float, end: float, match: str) -> list[str]:
    inner = _matchers(match)
    sel = '{__name__=~"gpufeed_.+"' + (f",{inner}" if inner else "") + "}"
    data = _get(
        base,
        "/api/v1/label/instance/values",
        [("match[]", sel), ("start", f"{start:.3f}"), ("end", f"{end:.3f}")],
    )
    return sorted(str(x) for x in data)


def _chunks(start: float, end: float, step: float) -> Iterator[tuple[float, float]]:
    span = step * (MAX_POINTS - 1)
    t = start
    while t <= end:
        e = min(end, t + span)
        yield t, e
        t = e + step


def load_range(
    base: str, start: float, end: float, step: float, match: str = ""
) -> dict[str, NodeSeries]:
    """Every node's used series over [start, end] at `step` resolution."""
    if end <= start:
        raise ValueError("--end must be after --start")
    if step <= 0:
        raise ValueError("--step must be positive")
    insts = instances(base, start, end, match)
    inner = _matchers(match)
    tasks: list[tuple[str, str, float, float]] = []
    for i in range(0, len(insts), INSTANCE_BATCH):
        batch = insts[i : i + INSTANCE_BATCH]
        alt = "|".join(re.escape(x) for x in batch).replace("\\", "\\\\").replace('"', '\\"')
        sel = f'instance=~"{alt}"' + (f",{inner}" if inner else "")
        for metric in USED_METRICS:
            for s, e in _chunks(start, end, step):
                tasks.append((metric, sel, s, e))

    def run(task: tuple[str, str, float, float]) -> tuple[str, list[dict[str, Any]]]:
        metric, sel, s, e = task
        # just under one step: each step sees only the samples that fell inside it
        q = f"last_over_time({metric}{{{sel}}}[{max(int(step * 1000) - 1, 1)}ms])"
        data = _get(
            base,
            "/api/v1/query_range",
            [("query", q), ("start", f"{s:.3f}"), ("end", f"{e:.3f}"), ("step", f"{step:g}")],
        )
        return metric, data.get("result", [])

    nodes: dict[str, NodeSeries] = {}
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        results = list(pool.map(run, tasks))  # in task order: chunks stay in time order
    for metric, result in results:
        for item in result:
            labels = {k: str(v) for k, v in item.get("metric", {}).items()}
            labels.pop("__name__", None)
            inst = labels.pop("instance", "")
            node = nodes.get(inst)
            if node is None:
                node = nodes[inst] = NodeSeries(inst)
            series = node.route(metric, labels)
            if series is None:
                continue
            values = item.get("values", [])
            ts = array("d", (float(t) for t, _ in values))
            vs = array("d", (float(v) for _, v in values))
            series.extend_sorted(ts, vs)
    return nodes
