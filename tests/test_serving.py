"""Serving demand: the stacks' exposition parsed (fixtures in the real metric names), the
collector against real HTTP endpoints (a bad one never spoils the others), the config and
the SDK's serving declaration over the real socket."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd
from gpufeed import sdk
from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.serving import ServingCollector
from gpufeed.config import AgentConfig, ConfigError, ServingConfig, parse_config
from gpufeed.jobs import wire
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import Family, iter_samples
from gpufeed.serving.endpoints import ServingEndpoint, url_problem
from gpufeed.serving.stacks import Demand, parse_serving_metrics

FIXTURES = Path(__file__).parent / "fixtures" / "serving"


@pytest.mark.parametrize(
    ("fixture", "server", "want"),
    [
        ("vllm-v0.prom", "", Demand("vllm", 7.0, 12.0, 0.8734, 1234.0)),
        # V1: summed over engines; the newer KV-cache name wins over the deprecated one
        ("vllm-v1.prom", "", Demand("vllm", 0.0, 1.0, 0.0125, 80.0)),
        # Triton: pending summed over models; no running or KV-cache gauge
        ("triton.prom", "", Demand("triton", 25.0, None, None, 41123.0)),
        ("tgi.prom", "", Demand("tgi", 0.0, 4.0, None, 5198.0)),
        ("tgi.prom", "tgi", Demand("tgi", 0.0, 4.0, None, 5198.0)),
        ("tgi.prom", "vllm", None),  # the stack named is not what the endpoint is
    ],
)
def test_each_stack_is_read_from_its_own_names(fixture: str, server: str, want: Demand) -> None:
    assert parse_serving_metrics((FIXTURES / fixture).read_text(), server) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", None),
        ("# only comments\n", None),
        ("up 1\nnode_load1 0.5\n", None),
        # a label value with a brace and spaces; a timestamp after the value
        ('vllm:num_requests_waiting{model_name="a} b"} 3 1700000000000\n', Demand("vllm", 3.0)),
        # garbage lines are skipped, NaN and negative values are not demand
        ("vllm:num_requests_waiting{\nvllm:num_requests_waiting x\n", None),
        ("vllm:num_requests_waiting NaN\nvllm:num_requests_waiting -1\n", None),
        ("vllm:num_requests_waiting 2\nvllm:num_requests_running NaN\n", Demand("vllm", 2.0)),
    ],
)
def test_odd_text(text: str, want: Demand | None) -> None:
    assert parse_serving_metrics(text) == want


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body, status = self.server.reply()  # type: ignore[attr-defined]
        if status == 0:
            time.sleep(10.0)  # never answers within the collector's timeout
            status = 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_endpoint() -> Iterator[tuple[str, list[tuple[bytes, int]]]]:
    """A real HTTP server on an ephemeral port; the test sets what it answers."""
    answer = [((FIXTURES / "vllm-v0.prom").read_bytes(), 200)]
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    srv.reply = lambda: answer[0]  # type: ignore[attr-defined]
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", answer
    srv.shutdown()
    srv.server_close()


def samples(fams: list[Family], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in iter_samples(fams) if s.name == name}


def collector(*endpoints: ServingEndpoint, timeout: float = 0.3) -> ServingCollector:
    cfg = AgentConfig(serving=ServingConfig(tuple(endpoints), timeout))
    return ServingCollector(CollectorContext(config=cfg))


def test_collector_reads_a_real_endpoint_and_a_bad_one_spoils_nothing(
    http_endpoint: tuple[str, list[tuple[bytes, int]]],
) -> None:
    url, answer = http_endpoint
    port = url.split(":")[2].split("/")[0]
    dead = "http://127.0.0.1:9/metrics"  # discard: nothing listens
    # 2 s: a loaded runner can take longer than the default 0.3 s to answer a 500, which
    # then counts as unreachable (seen in CI); the no-answer case still shows the bound
    c = collector(ServingEndpoint(url, "chat-1"), ServingEndpoint(dead, "", ("3",)), timeout=2.0)
    try:
        fams = c.collect()
        ep = ("endpoint", f"127.0.0.1:{port}")
        labels = (ep, ("job_id", "chat-1"), ("server", "vllm"))
        assert samples(fams, "gpufeed_serving_up") == {
            labels: 1.0,
            (("endpoint", "127.0.0.1:9"), ("gpu", "3")): 0.0,
        }
        # the dead endpoint's demand is absent, not zero
        assert samples(fams, "gpufeed_serving_requests_waiting") == {labels: 7.0}
        assert samples(fams, "gpufeed_serving_requests_running") == {labels: 12.0}
        assert samples(fams, "gpufeed_serving_kv_cache_usage_ratio") == {labels: 0.8734}
        assert samples(fams, "gpufeed_serving_requests_completed_total") == {labels: 1234.0}
        fail = (("endpoint", "127.0.0.1:9"), ("gpu", "3"), ("reason", "unreachable"))
        assert samples(fams, "gpufeed_serving_scrape_failures_total") == {fail: 1.0}
        # an HTTP error, text without a queue metric, no answer in time: each counted
        for body, status, reason in (
            (b"oops", 500, "status"),
            (b"up 1\n", 200, "unrecognised"),
            (b"", 0, "timeout"),
        ):
            answer[0] = (body, status)
            t0 = time.monotonic()
            fams = c.collect()
            # bounded by the 2 s timeout (the server answers after 10 s); 5 s leaves room
            assert time.monotonic() - t0 < 5.0, "a slow endpoint holds the scrape up"
            assert samples(fams, "gpufeed_serving_up")[(ep, ("job_id", "chat-1"))] == 0.0
            assert samples(fams, "gpufeed_serving_requests_waiting") == {}
            got = samples(fams, "gpufeed_serving_scrape_failures_total")
            assert got[(ep, ("job_id", "chat-1"), ("reason", reason))] >= 1.0
    finally:
        c.close()


def test_an_endpoint_for_gpus_gives_one_series_per_gpu(
    http_endpoint: tuple[str, list[tuple[bytes, int]]],
) -> None:
    url, _ = http_endpoint
    c = collector(ServingEndpoint(url, "", ("0", "1"), "vllm"))
    try:
        got = samples(c.collect(), "gpufeed_serving_requests_waiting")
    finally:
        c.close()
    assert sorted(dict(k)["gpu"] for k in got) == ["0", "1"]
    assert set(got.values()) == {7.0}


def test_no_endpoint_no_series() -> None:
    c = collector()
    fams = c.collect()
    assert not list(iter_samples(fams))
    c.close()


def test_config_endpoints_and_their_errors() -> None:
    cfg = parse_config(
        "serving:\n  timeout_seconds: 0.2\n  endpoints:\n"
        "    - {url: 'http://10.1.2.3:8002/metrics', gpus: [0, 1], server: triton}\n"
        "    - {url: 'http://127.0.0.1:8000/metrics', job_id: chat}\n"
    )
    assert cfg.serving == ServingConfig(
        (
            ServingEndpoint("http://10.1.2.3:8002/metrics", "", ("0", "1"), "triton"),
            ServingEndpoint("http://127.0.0.1:8000/metrics", "chat"),
        ),
        0.2,
    )
    for text, message in (
        ("  - {url: 'http://h/m'}\n", "needs job_id or gpus"),
        ("  - {job_id: a}\n", "needs url"),
        ("  - {url: 'file:///etc/passwd', job_id: a}\n", "expected http://"),
        ("  - {url: 'http://h/m', job_id: a, server: ollama}\n", "expected one of vllm"),
        ("  - {url: 'http://h/m', gpus: [x]}\n", "expected GPU indexes"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config("serving:\n  endpoints:\n" + text.replace("  -", "    -"))


@pytest.mark.parametrize(
    ("url", "loopback_only", "ok"),
    [
        ("http://127.0.0.1:8000/metrics", True, True),
        ("http://[::1]:8000/metrics", True, True),
        ("http://localhost:3000/metrics", True, True),
        ("http://10.0.0.5:8000/metrics", True, False),  # a job may not point elsewhere
        ("http://169.254.169.254/latest/meta-data", True, False),
        ("https://127.0.0.1/metrics", True, False),
        ("https://10.0.0.5/metrics", False, True),  # the administrator may
        ("http://user:pw@127.0.0.1/metrics", False, False),
        ("http://127.0.0.1:70000/", False, False),
    ],
)
def test_which_urls_may_be_scraped(url: str, loopback_only: bool, ok: bool) -> None:
    assert (url_problem(url, loopback_only=loopback_only) is None) == ok


def test_wire_round_trip_and_refusals() -> None:
    for msg in (
        wire.Message(wire.KIND_SERVING, "j", "n", phase="declare", location="http://127.0.0.1:8/m"),
        wire.Message(wire.KIND_SERVING, "j", "n", phase="declare"),
        wire.Message(wire.KIND_SERVING, "j", "n", phase="demand", requests_waiting=4.0),
        wire.Message(
            wire.KIND_SERVING, "j", "n", phase="demand", requests_waiting=0.0, requests_running=9.0
        ),
    ):
        assert wire.decode_datagram(wire.encode(msg)) == [msg]
    h = wire.HEADER
    bad_url = b"http://10.0.0.1/m"
    for data, reason in (
        (h.pack(wire.MAGIC, 1, 10, 0, len(bad_url), 1, 1, 0.0, 0.0, 0) + b"jn" + bad_url, "schema"),
        (h.pack(wire.MAGIC, 1, 10, 2, 0, 1, 1, 0.0, 0.0, 0) + b"jn", "phase"),
        (h.pack(wire.MAGIC, 1, 10, 1, 0, 1, 1, 1.5, 0.0, 0) + b"jn", "schema"),
        (h.pack(wire.MAGIC, 1, 10, 1, 0, 1, 1, -1.0, 0.0, 0) + b"jn", "schema"),
        (h.pack(wire.MAGIC, 1, 10, 1, 0, 1, 1, float("nan"), 0.0, 0) + b"jn", "schema"),
        (h.pack(wire.MAGIC, 1, 9, 0, 3, 1, 1, 0.0, -1.0, -1) + b"jnabc", "schema"),
    ):
        assert wire.decode_datagram(data) == reason


def test_sdk_declares_serving_and_reports_demand(tmp_path: Path) -> None:
    """The SDK over the real socket to the agent's server, and on to the collector."""
    assert (sdk.KIND_SERVING, sdk.SERVING_DECLARE, sdk.SERVING_DEMAND) == (
        wire.KIND_SERVING,
        0,
        1,
    )
    assert sdk._MAX_SERVING_REQUESTS == wire.MAX_SERVING_REQUESTS
    srv = SdkServer(
        str(tmp_path / "sdk.sock"), max_jobs=8, max_messages_per_second=10000, grace_seconds=60
    )
    srv.start()
    try:
        job = sdk.Job(
            "chat", srv.socket_path, serving=True, metrics_url="http://127.0.0.1:9/metrics"
        )
        other = sdk.Job("batch", srv.socket_path, job_id="batch-1")
        job.serving_demand(waiting=5, running=2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got = srv.serving_by_job()
            if job.job_id in got and got[job.job_id].requests_waiting is not None:
                break
            time.sleep(0.01)
        got = srv.serving_by_job()
        assert set(got) == {job.job_id}  # a job that did not declare is not serving
        d = got[job.job_id]
        assert (d.url, d.requests_waiting, d.requests_running) == (
            "http://127.0.0.1:9/metrics",
            5.0,
            2.0,
        )
        c = ServingCollector(CollectorContext(), srv.serving_by_job)
        fams = c.collect()
        sdk_labels = (("endpoint", "sdk"), ("job_id", job.job_id), ("server", "sdk"))
        assert samples(fams, "gpufeed_serving_requests_waiting") == {sdk_labels: 5.0}
        # its declared URL is scraped too (nothing listens there: up 0)
        up = samples(fams, "gpufeed_serving_up")
        assert up[(("endpoint", "127.0.0.1:9"), ("job_id", job.job_id))] == 0.0
        assert up[sdk_labels] == 1.0
        with pytest.raises(ValueError, match="longer than"):
            sdk.Job("x", srv.socket_path, metrics_url="http://127.0.0.1/" + "a" * 300)
        job.close()
        other.close()
        # the job is gone: its endpoint is not scraped, its failure counts go with it
        deadline = time.monotonic() + 5
        while srv.serving_by_job() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not list(iter_samples(c.collect()))
        c.close()
    finally:
        srv.stop()


def test_gpufeed_run_declares_the_command_a_serving_job(tmp_path: Path) -> None:
    """`gpufeed run --serving-metrics URL -- COMMAND`: the launcher declares the job, under
    the id the command's own processes resolve, while the command runs; a URL off this
    host is refused with one line before anything runs."""
    srv = SdkServer(
        str(tmp_path / "sdk.sock"), max_jobs=8, max_messages_per_second=10000, grace_seconds=60
    )
    srv.start()
    url = "http://127.0.0.1:8000/metrics"
    ids = tmp_path / "ids"
    prog = (
        f"import time, gpufeed.sdk as s; open({str(ids)!r}, 'w').write(s.resolve_job_id('x'))\n"
        "time.sleep(3)"
    )
    cmd = [*gpufeed_cmd("run"), "--socket", srv.socket_path, "--serving-metrics", url]
    try:
        proc = subprocess.Popen([*cmd, "--", sys.executable, "-c", prog], env=agent_env())
        deadline = time.monotonic() + 10
        got: dict[str, object] = {}
        while time.monotonic() < deadline and not (got and ids.exists()):
            got = dict(srv.serving_by_job())
            time.sleep(0.05)
        assert proc.wait(timeout=30) == 0
        assert list(got) == [ids.read_text()], (got, ids.read_text())
        assert [d.url for d in got.values()] == [url]  # type: ignore[attr-defined]
        while srv.serving_by_job() and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        assert srv.serving_by_job() == {}  # the launcher closed the job with its command
    finally:
        srv.stop()
    bad = subprocess.run(
        [*cmd[:-1], "http://10.0.0.1/metrics", "--", sys.executable, "-c", "pass"],
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "gpufeed run: --serving-metrics: a job may only declare metrics on this host's "
        "loopback, not '10.0.0.1'"
    )
