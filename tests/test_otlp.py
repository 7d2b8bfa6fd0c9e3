"""OTLP push through the real OTLP/HTTP exporter to a real HTTP receiver on loopback."""

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpufeed.model import Families
from gpufeed.otlp import OtlpSink
from gpufeed.snapshot import Snapshot
from procports import refused_port


def test_snapshot_arrives_as_otlp_with_contract_names_and_host_resource() -> None:
    received: list[ExportMetricsServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            req = ExportMetricsServiceRequest()
            req.ParseFromString(body)
            received.append(req)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    f = Families()
    f.gauge("gpufeed_gpu_utilization_ratio", "util", {"gpu": "0", "uuid": "GPU-a"}, 0.42)
    f.counter("gpufeed_storage_read_bytes_total", "read", {"tier": "hot"}, 4096.0)
    f.histogram(
        "gpufeed_job_epoch_seconds", "epochs", {"job_id": "j"}, [(10.0, 1), (60.0, 3)], 95.0, 4
    )
    sink = OtlpSink(
        f"http://127.0.0.1:{server.server_address[1]}/v1/metrics",
        push_interval_seconds=0,
        host_name="node-7",
        instance="node-7:9842",
    )
    try:
        sink.write(Snapshot(1_700_000_000.0, tuple(f.build())))
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sink.close()
        server.shutdown()
    assert len(received) == 1
    rm = received[0].resource_metrics[0]
    attrs = {a.key: a.value.string_value for a in rm.resource.attributes}
    assert attrs["host.name"] == "node-7"
    # A Prometheus OTLP receiver makes service.instance.id the `instance` label: the same
    # name the agent's traces and windows carry.
    assert attrs["service.instance.id"] == "node-7:9842"
    metrics = {m.name: m for m in rm.scope_metrics[0].metrics}
    assert set(metrics) == {
        "gpufeed_gpu_utilization_ratio",
        "gpufeed_storage_read_bytes",
        "gpufeed_job_epoch_seconds",
    }
    util = metrics["gpufeed_gpu_utilization_ratio"].gauge.data_points[0]
    assert util.as_double == 0.42
    assert {a.key: a.value.string_value for a in util.attributes} == {"gpu": "0", "uuid": "GPU-a"}
    read = metrics["gpufeed_storage_read_bytes"].sum
    assert read.is_monotonic and read.data_points[0].as_double == 4096.0
    hist = metrics["gpufeed_job_epoch_seconds"].histogram.data_points[0]
    assert list(hist.explicit_bounds) == [10.0, 60.0]
    assert list(hist.bucket_counts) == [1, 2, 1]
    assert hist.count == 4 and hist.sum == 95.0
    assert util.time_unix_nano == 1_700_000_000 * 10**9


def test_unreachable_endpoint_blocks_neither_the_sampler_nor_shutdown() -> None:
    with refused_port() as port:
        unreachable_endpoint_blocks_nothing(f"http://127.0.0.1:{port}/v1/metrics")


def unreachable_endpoint_blocks_nothing(endpoint: str) -> None:
    # The default 10 s export timeout: the exporter retries with back-off within it.
    sink = OtlpSink(endpoint, push_interval_seconds=0)
    f = Families()
    f.gauge("gpufeed_host_cpus", "cpus", {}, 2)
    t0 = time.monotonic()
    sink.write(Snapshot(time.time(), tuple(f.build())))
    assert time.monotonic() - t0 < 0.2
    time.sleep(0.3)  # the export is now in its retry back-off
    t0 = time.monotonic()
    sink.close()
    assert time.monotonic() - t0 < 2.5, "shutdown must cut the retries short"
