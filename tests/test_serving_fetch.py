"""What a job can make the root agent fetch (issue 26), against real HTTP servers on
loopback ports the kernel picks: no redirect is followed and its target never contacted;
a server that trickles its answer fails at the deadline and the administrator's endpoint
is scraped all the same; a body over the limit is refused; endpoints that never answer in
time cannot crowd out one that does; and neither `close()` nor the agent's shutdown waits
on a fetch in flight."""

from __future__ import annotations

import contextlib
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd
from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.serving import ServingCollector
from gpufeed.config import AgentConfig, ConfigError, ServingConfig, parse_config
from gpufeed.model import Family, iter_samples
from gpufeed.serving.endpoints import DeclaredServing, ServingEndpoint
from procports import wait_listening
from tls_helpers import make_pki

VLLM = (Path(__file__).parent / "fixtures" / "serving" / "vllm-v0.prom").read_bytes()
TRICKLE_SECONDS = 0.2  # one byte this often: each read is quick, the answer never ends

Answer = Callable[[BaseHTTPRequestHandler, threading.Event], None]


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the fetches these tests cut short break the server's writes


class Server:
    """A real HTTP server answering every GET with `answer`; counts the requests."""

    def __init__(
        self, answer: Answer, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> None:
        self.stop = threading.Event()
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.paths.append(self.path)
                answer(self, outer.stop)

            def log_message(self, *args: object) -> None:
                pass

        self._srv = _Quiet((host, 0), Handler)
        if tls is not None:
            self._srv.socket = tls.wrap_socket(self._srv.socket, server_side=True)
        self.scheme = "http" if tls is None else "https"
        self.host, self.port = host, self._srv.server_address[1]
        threading.Thread(target=self._srv.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, path: str = "/metrics") -> str:
        return f"{self.scheme}://{self.host}:{self.port}{path}"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self.stop.set()  # ends the trickles, so no thread of the code under test hangs on
        self._srv.shutdown()
        self._srv.server_close()


@contextlib.contextmanager
def serving(
    answer: Answer, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
) -> Iterator[Server]:
    s = Server(answer, host, tls)
    try:
        yield s
    finally:
        s.close()


def metrics(body: bytes = VLLM, chunked: bool = False) -> Answer:
    def answer(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        if chunked:  # no Content-Length: the size is only known once it has been read
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for i in range(0, len(body), 65536):
                part = body[i : i + 65536]
                h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            h.wfile.write(b"0\r\n\r\n")
        else:
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

    return answer


def redirect(location: str, status: int) -> Answer:
    def answer(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.send_response(status)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return answer


def trickle(where: str) -> Answer:
    """Headers or body one byte every TRICKLE_SECONDS, until the server is closed."""

    def answer(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        if where == "headers":
            h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Pad: ")
        else:
            h.send_response(200)
            h.send_header("Content-Length", "1000000")
            h.end_headers()
            h.wfile.write(b"vllm:num_requests_waiting 1\n")
        while not stop.wait(TRICKLE_SECONDS):
            h.wfile.write(b"a" if where == "headers" else b"#")

    return answer


def other_host() -> str:
    """Another loopback address (Linux answers on all of 127/8), standing in for a host
    the job must not reach; 127.0.0.1 itself where it cannot be bound."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.2", 0))
        except OSError:
            return "127.0.0.1"
    return "127.0.0.2"


def collector(
    admin: tuple[ServingEndpoint, ...] = (),
    declared: dict[str, str] | None = None,
    timeout: float = 0.5,
    **limits: int,
) -> ServingCollector:
    """The real collector: `admin` from the config, `declared` job id -> URL from jobs."""
    table = {j: DeclaredServing(j, u) for j, u in (declared or {}).items()}
    cfg = AgentConfig(serving=ServingConfig(admin, timeout, **limits))
    return ServingCollector(CollectorContext(config=cfg), lambda: table)


def collect_once(c: ServingCollector) -> list[Family]:
    try:
        return c.collect()
    finally:
        c.close()


def values(fams: list[Family], name: str) -> dict[tuple[str, str], float]:
    """(endpoint, job_id or gpu) -> value of family `name`."""
    out = {}
    for s in iter_samples(fams):
        if s.name == name:
            d = dict(s.labels)
            out[(d["endpoint"], d.get("job_id") or d.get("gpu", ""))] = s.value
    return out


def failures(fams: list[Family]) -> dict[tuple[str, str, str], float]:
    """(endpoint, job_id, reason) -> count."""
    out = {}
    for s in iter_samples(fams):
        if s.name == "gpufeed_serving_scrape_failures_total":
            d = dict(s.labels)
            out[(d["endpoint"], d.get("job_id", ""), d["reason"])] = s.value
    return out


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_refused_and_never_followed(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26 item 1: a job's loopback server answered 302 to another host, and the
    agent fetched and exported that host's numbers."""
    with serving(metrics(), other_host()) as target:
        with serving(redirect(target.url(), status)) as job_server:
            fams = collect_once(collector(declared={"chat": job_server.url()}))
        assert target.paths == []  # never contacted
    ep = (job_server.endpoint, "chat")
    assert values(fams, "gpufeed_serving_up") == {ep: 0.0}
    assert values(fams, "gpufeed_serving_requests_waiting") == {}
    assert failures(fams) == {(*ep, "redirect"): 1.0}
    assert f"redirect to {target.url()!r} refused (HTTP {status};" in caplog.text


def test_not_even_a_redirect_to_the_same_server_is_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A vLLM whose metrics app was a Starlette Mount sent /metrics on to /metrics/: the
    URL to declare is the one the metrics are at, and the message says where that is."""
    to_slash = redirect("/metrics/", 307)

    def answer(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        (metrics() if h.path == "/metrics/" else to_slash)(h, stop)

    with serving(answer) as srv:
        fams = collect_once(collector(declared={"chat": srv.url()}))
        assert srv.paths == ["/metrics"]
        assert values(
            collect_once(collector(declared={"chat": srv.url("/metrics/")})), "gpufeed_serving_up"
        ) == {(srv.endpoint, "chat"): 1.0}
    assert failures(fams) == {(srv.endpoint, "chat", "redirect"): 1.0}
    assert "redirect to '/metrics/' refused (HTTP 307; declare the URL" in caplog.text


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_answer_fails_at_the_deadline_and_the_admins_endpoint_is_scraped(
    where: str,
) -> None:
    """Issue 26 item 2: 8 URLs that send a byte every 0.2 s held all 8 fetch threads for
    good and the administrator's endpoint was never scraped again. Now each fetch ends at
    its deadline (0.5 s) and the next interval fetches every endpoint again."""
    with serving(metrics()) as admin, serving(trickle(where)) as slow:
        c = collector(
            (ServingEndpoint(admin.url(), "admin-job"),),
            {f"job-{i}": slow.url(f"/t{i}") for i in range(8)},
            timeout=0.5,
        )
        try:
            for tick in range(3):
                t0 = time.monotonic()
                fams = c.collect()
                took = time.monotonic() - t0
                assert took < 0.5 + 0.4, f"tick {tick} took {took:.2f} s"
                up = values(fams, "gpufeed_serving_up")
                assert up.pop((admin.endpoint, "admin-job")) == 1.0, f"tick {tick}"
                assert up == {(slow.endpoint, f"job-{i}"): 0.0 for i in range(8)}
                assert values(fams, "gpufeed_serving_requests_waiting") == {
                    (admin.endpoint, "admin-job"): 7.0
                }
                time.sleep(0.2)  # the rest of a 1 s interval
        finally:
            c.close()
        fetched = list(slow.paths)
    got = failures(fams)
    assert {r for (_, _, r) in got} <= {"timeout", "busy"}
    assert sum(n for (_, _, r), n in got.items() if r == "timeout") >= 16
    assert len(fetched) >= 16, "a fetch that ran into its deadline was not freed"


def test_endpoints_that_never_answer_in_time_cannot_crowd_out_one_that_does() -> None:
    """Eight jobs' endpoints that trickle hold all eight of the jobs' threads to the
    deadline each interval; a ninth job's endpoint that answers is queued ahead of them
    from its second interval on (first, it was behind them: one interval lost at most)."""
    with serving(metrics()) as good, serving(trickle("body")) as slow:
        declared = {f"a-{i}": slow.url(f"/t{i}") for i in range(8)} | {"z-good": good.url()}
        c = collector(declared=declared, timeout=0.4)
        try:
            ups = []
            for _ in range(4):
                ups.append(values(c.collect(), "gpufeed_serving_up")[(good.endpoint, "z-good")])
                time.sleep(0.1)
        finally:
            c.close()
    assert ups[1:] == [1.0, 1.0, 1.0], ups


def test_a_body_over_the_limit_is_refused() -> None:
    """Issue 26 item 3. A job's endpoint may answer 1 MiB (serving.job_max_body_bytes), the
    administrator's 8 MiB (serving.max_body_bytes): 2 MiB from a job is refused, with a
    Content-Length (before the body is read) or chunked (once past the limit)."""
    big = VLLM + b"# padding\n" * ((2 << 20) // 10)
    with serving(metrics(big)) as sized, serving(metrics(big, chunked=True)) as chunked:
        urls = {"sized": sized.url(), "chunked": chunked.url()}
        admin = tuple(ServingEndpoint(u, f"admin-{j}") for j, u in urls.items())
        eps = {"sized": sized.endpoint, "chunked": chunked.endpoint}
        c = collector(admin, urls)
        try:
            fams = c.collect()
        finally:
            c.close()
        up = values(fams, "gpufeed_serving_up")
        for j, ep in eps.items():
            assert up[(ep, j)] == 0.0
            assert up[(ep, f"admin-{j}")] == 1.0
        assert {k: n for k, n in failures(fams).items()} == {
            (ep, j, "too_large"): 1.0 for j, ep in eps.items()
        }
        # the limits are the config's
        c = collector(admin, urls, max_body_bytes=1 << 20, job_max_body_bytes=4 << 20)
        try:
            up = values(c.collect(), "gpufeed_serving_up")
        finally:
            c.close()
        for j, ep in eps.items():
            assert (up[(ep, j)], up[(ep, f"admin-{j}")]) == (1.0, 0.0)


def test_body_limits_in_the_config() -> None:
    cfg = parse_config("serving:\n  max_body_bytes: 65536\n  job_max_body_bytes: 4096\n")
    assert (cfg.serving.max_body_bytes, cfg.serving.job_max_body_bytes) == (65536, 4096)
    assert parse_config("").serving.job_max_body_bytes == 1 << 20
    with pytest.raises(ConfigError, match="job_max_body_bytes"):
        parse_config("serving:\n  job_max_body_bytes: 100\n")


def serving_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gpufeed-serving")]


def test_close_returns_at_once_with_eight_trickling_fetches_in_flight() -> None:
    """Shutdown never waits on a fetch: `close()` aborts the 8 in flight (timeout 10 s),
    the interval waiting on them returns, and no fetch thread is left."""
    with serving(trickle("body")) as slow:
        eps = tuple(ServingEndpoint(slow.url(f"/t{i}"), f"job-{i}") for i in range(8))
        c = collector(eps, timeout=10.0)
        tick = threading.Thread(target=c.collect, daemon=True)
        tick.start()
        deadline = time.monotonic() + 5
        while len(slow.paths) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(slow.paths) == 8
        t0 = time.monotonic()
        c.close()
        assert time.monotonic() - t0 < 0.5
        tick.join(timeout=2.0)
        assert not tick.is_alive(), "the interval still waits on the aborted fetches"
        while serving_threads() and time.monotonic() < t0 + 2:
            time.sleep(0.01)
        assert serving_threads() == []


def test_the_agent_stops_at_once_with_eight_trickling_fetches_in_flight(tmp_path: Path) -> None:
    """Issue 26 item 2: SIGTERM logged "shutting down" and the agent stayed up 11.5
    minutes, its fetch threads joined at exit. The real agent process, 8 endpoints that
    trickle (serving.timeout_seconds 10): it exits within 3 s of SIGTERM, status 0."""
    with serving(trickle("body")) as slow:
        eps = "".join(f"    - {{url: '{slow.url(f'/t{i}')}', job_id: job-{i}}}\n" for i in range(8))
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(
            f"correlator:\n  windows_log: {tmp_path / 'windows.jsonl'}\n"
            f"serving:\n  timeout_seconds: 10\n  endpoints:\n{eps}"
        )
        args = ["--web.listen-address", "127.0.0.1:0", "--sdk.socket", str(tmp_path / "s")]
        proc = subprocess.Popen(
            gpufeed_cmd("agent", "--gpu.backend=off", "--config", str(cfg), *args),
            env=agent_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_listening(proc)
            deadline = time.monotonic() + 10
            while len(slow.paths) < 8 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(slow.paths) == 8
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            try:
                code = proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                pytest.fail("the agent was still up 3 s after SIGTERM")
            assert code == 0, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() - t0 < 3.0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_an_https_endpoint_of_the_administrator_is_read_and_bounded_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The administrator may name https: the handshake and the answer share the deadline."""
    pki = make_pki(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))  # the system's trust, plus our CA
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    with serving(metrics(), tls=tls) as good, serving(trickle("body"), tls=tls) as slow:
        eps = (ServingEndpoint(good.url(), "a"), ServingEndpoint(slow.url(), "b"))
        t0 = time.monotonic()
        fams = collect_once(collector(eps, timeout=0.5))
        assert time.monotonic() - t0 < 0.9
    assert values(fams, "gpufeed_serving_up") == {
        (good.endpoint, "a"): 1.0,
        (slow.endpoint, "b"): 0.0,
    }
    assert failures(fams) == {(slow.endpoint, "b", "timeout"): 1.0}
