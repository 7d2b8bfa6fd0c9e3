"""OTLP push (`--otlp.endpoint`): the same snapshot Prometheus scrapes, sent as OTLP/HTTP.

Gauges become OTLP gauges and counters cumulative monotonic sums. Counter names lose their
`_total` suffix, because a Prometheus OTLP receiver adds it back to monotonic sums, so the
names arriving in Prometheus are the contract's. No unit is set, for the same reason: the
unit is already in the name. The host is the resource attribute `host.name`; the agent's
`instance` is `service.instance.id`, which a Prometheus OTLP receiver turns into the
`instance` label, so OTLP series join the agent's traces and windows on it.

GPU families that the OpenTelemetry hardware semantic conventions name (hw.gpu.utilization,
hw.gpu.memory.*, hw.gpu.io, hw.energy, hw.power, hw.errors, hw.status) are sent under those
names, with the convention's units and hw.* attributes (gpufeed.otlp_hw has the table); the
rest keep gpufeed's names.

Export runs on its own thread: a slow or absent collector endpoint never delays sampling;
snapshots arriving while an export is in flight are skipped, not queued.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpufeed import __version__
from gpufeed.logonce import LogOnce
from gpufeed.model import Family, Sample
from gpufeed.otlp_hw import REPLACED, hw_metrics
from gpufeed.snapshot import Snapshot

log = logging.getLogger(__name__)


class OtlpSink:
    name = "otlp"

    def __init__(
        self,
        endpoint: str,
        *,
        push_interval_seconds: float = 15.0,
        host_name: str | None = None,
        instance: str | None = None,
        timeout_seconds: float = 10.0,
        exporter: Any = None,
    ) -> None:
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter(endpoint=endpoint, timeout=timeout_seconds)
        self._exporter = exporter
        self._endpoint = endpoint
        self._push_interval = push_interval_seconds
        self._host_name = host_name or socket.gethostname()
        self._instance = instance or self._host_name
        self._start_ns = time.time_ns()
        self._last_push = 0.0
        self._busy = threading.Lock()
        self._failing = LogOnce(log)  # one line per run of failed exports, and the recovery

    def write(self, snapshot: Snapshot) -> None:
        now = time.monotonic()
        if now - self._last_push < self._push_interval:
            return
        if not self._busy.acquire(blocking=False):
            return  # the previous export is still in flight: skip, never queue
        self._last_push = now
        threading.Thread(target=self._export, args=(snapshot,), daemon=True).start()

    def _export(self, snapshot: Snapshot) -> None:
        try:
            from opentelemetry.sdk.metrics.export import MetricExportResult

            result = self._exporter.export(
                to_metrics_data(snapshot, self._host_name, self._start_ns, self._instance)
            )
            if result == MetricExportResult.SUCCESS:
                self._failing.clear("export", "OTLP export to %s recovered", self._endpoint)
            else:
                self._failing.log(
                    logging.WARNING,
                    "export",
                    "OTLP export to %s failed; will retry next interval",
                    self._endpoint,
                )
        except Exception:
            self._failing.log(
                logging.ERROR,
                "export",
                "OTLP export to %s failed",
                self._endpoint,
                exc_info=True,
            )
        finally:
            self._busy.release()

    def close(self, wait_seconds: float = 2.0) -> None:
        """Shuts the exporter down first: that cuts short the retry back-off of an export in
        flight to a dead endpoint, which would otherwise hold the agent's exit for ~10 s.
        Then waits at most `wait_seconds` for that export to return."""
        try:
            self._exporter.shutdown()
        except Exception:
            log.debug("OTLP exporter shutdown failed", exc_info=True)
        if self._busy.acquire(timeout=wait_seconds):
            self._busy.release()
        else:
            log.warning(
                "OTLP export to %s still in flight at shutdown; not waiting", self._endpoint
            )


def to_metrics_data(
    snapshot: Snapshot, host_name: str, start_ns: int, instance: str | None = None
) -> Any:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    ts = int(snapshot.timestamp_seconds * 1e9)
    metrics: list[Any] = []
    for hw in hw_metrics(snapshot.families):
        points = [
            NumberDataPoint(
                attributes=dict(p.attributes),
                start_time_unix_nano=start_ns,
                time_unix_nano=ts,
                value=p.value,
            )
            for p in hw.points
        ]
        hw_data: Any
        if hw.instrument == "gauge":
            hw_data = Gauge(data_points=points)
        else:
            hw_data = Sum(
                data_points=points,
                aggregation_temporality=AggregationTemporality.CUMULATIVE,
                is_monotonic=hw.instrument == "counter",
            )
        metrics.append(Metric(name=hw.name, description=hw.description, unit=hw.unit, data=hw_data))
    for fam in snapshot.families:
        if not fam.samples or fam.name in REPLACED:
            continue
        data: Any
        name = fam.name
        if fam.type == "counter":
            name = name.removesuffix("_total")
            data = Sum(
                data_points=[_point(s, start_ns, ts, NumberDataPoint) for s in fam.samples],
                aggregation_temporality=AggregationTemporality.CUMULATIVE,
                is_monotonic=True,
            )
        elif fam.type == "histogram":
            data = Histogram(
                data_points=_histogram_points(fam, start_ns, ts, HistogramDataPoint),
                aggregation_temporality=AggregationTemporality.CUMULATIVE,
            )
        else:
            data = Gauge(
                data_points=[_point(s, start_ns, ts, NumberDataPoint) for s in fam.samples]
            )
        metrics.append(Metric(name=name, description=fam.help, unit="", data=data))
    resource = Resource.create(
        {
            "host.name": host_name,
            "service.name": "gpufeed-agent",
            "service.instance.id": instance or host_name,
        }
    )
    scope = InstrumentationScope("gpufeed", __version__)
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url="")],
                schema_url="",
            )
        ]
    )


def _point(s: Sample, start_ns: int, ts: int, cls: Any) -> Any:
    return cls(
        attributes=dict(s.labels), start_time_unix_nano=start_ns, time_unix_nano=ts, value=s.value
    )


def _histogram_points(fam: Family, start_ns: int, ts: int, cls: Any) -> list[Any]:
    # Regroup the flat _bucket/_sum/_count samples into one OTLP point per label set.
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in fam.samples:
        key = tuple(kv for kv in s.labels if kv[0] != "le")
        entry = series.setdefault(key, {"buckets": [], "sum": 0.0, "count": 0.0})
        if s.name.endswith("_bucket"):
            entry["buckets"].append((float(s.label("le")), s.value))
        elif s.name.endswith("_sum"):
            entry["sum"] = s.value
        elif s.name.endswith("_count"):
            entry["count"] = s.value
    points = []
    for key, entry in series.items():
        cumulative: Sequence[tuple[float, float]] = sorted(entry["buckets"])
        bounds = [le for le, _ in cumulative if le != float("inf")]
        counts, prev = [], 0.0
        for _, c in cumulative:
            counts.append(int(c - prev))
            prev = c
        if len(counts) == len(bounds):  # no +Inf bucket: the rest of the count is above
            counts.append(int(entry["count"] - prev))
        points.append(
            cls(
                attributes=dict(key),
                start_time_unix_nano=start_ns,
                time_unix_nano=ts,
                count=int(entry["count"]),
                sum=entry["sum"],
                bucket_counts=counts,
                explicit_bounds=bounds,
                min=None,
                max=None,
            )
        )
    return points
