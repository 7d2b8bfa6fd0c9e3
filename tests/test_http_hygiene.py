"""What the agent's HTTP responses say and cost: no versions in Server, no request bytes in
error pages, strict JSON from /api/windows, gzip when asked, and /api/windows rendered once
per correlator step (4 polling clients used to raise /metrics p50 from 1 to 20 ms)."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import logging
import math
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.outputs.api import WindowsJson
from gpufeed.web.compression import accepts_gzip
from http_helpers import (
    PATHS,
    SERVICES,
    agent_process,
    get,
    percentile,
    service_process,
    timed_scrapes,
    wait_until_serving,
)

HELPERS = Path(__file__).parent / "helpers"
HUGE = "<1e999>"


def _strict_json(body: bytes) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(body, parse_constant=refuse)


def _window(i: int, **changes: Any) -> dict[str, Any]:
    w: dict[str, Any] = {
        "instance": "node-a:9842",
        "gpu": str(i % 8),
        "uuid": f"GPU-{i % 8:04d}",
        "job_id": f"job-{i // 50}",
        "start": 1_700_000_000.0 + 100 * i,
        "end": 1_700_000_060.0 + 100 * i,
        "cause": "data_loading",
        "confidence": 0.9,
        "mean_utilization": 0.12,
        "evidence": {"summary": "reads from the cold tier", "cold_read_bytes_per_second": 1e9},
        "simulated": True,  # the test agent is a simulated node: it reads only such windows
    }
    w.update(changes)
    return w


def _agent_config(tmp_path: Path, windows: list[dict[str, Any]]) -> Path:
    log = tmp_path / "windows.jsonl"
    # A number too large for a float is valid JSON that Python reads as infinity: the
    # way a non-finite value still reaches the agent from its log (NaN lines are skipped).
    text = "".join(json.dumps(w) + "\n" for w in windows)
    log.write_text(text.replace(f'"{HUGE}"', "1e999"))
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {log}\n")
    return cfg


@pytest.mark.parametrize(
    ("header", "gzip_ok"),
    [
        ("gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("GZIP", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("deflate, br", False),
        ("", False),
        ("*", True),
        ("*;q=0", False),
        ("identity, *;q=0.1", True),
        ("gzip;q=0, *", False),  # named codings win over *
        ("gzip;q=bogus", False),
    ],
)
def test_accept_encoding(header: str, gzip_ok: bool) -> None:
    assert accepts_gzip(header) is gzip_ok


class _Processor:
    """The processor's side WindowsJson reads: windows() and a generation counter."""

    def __init__(self, closed: list[Window] | None = None) -> None:
        self.generation = 0
        self.calls = 0
        self.closed = closed or []

    def windows(self, limit: int) -> tuple[list[Window], list[Window]]:
        self.calls += 1
        return self.closed[-limit:], []


def test_windows_json_is_built_once_per_correlator_step_and_limit() -> None:
    proc = _Processor()
    bodies = WindowsJson(proc, simulated=True)  # type: ignore[arg-type]
    first = bodies.body(200)
    assert bodies.body(200) is first and proc.calls == 1
    bodies.body(10)
    assert proc.calls == 2
    proc.generation += 1
    assert bodies.body(200) is not first and proc.calls == 3
    for limit in range(100):  # many limits: memory stays bounded
        bodies.body(limit)
    assert len(bodies._bodies) <= 8
    assert _strict_json(first) == {"windows": [], "open": [], "simulated": True}


def test_windows_json_writes_non_finite_numbers_as_null() -> None:
    nan = float("nan")
    window = Window.from_json(_window(0, mean_utilization=nan, confidence=math.inf))
    window = dataclasses.replace(window, evidence=(("read_bytes_per_second", nan), ("n", 2.0)))
    doc = _strict_json(WindowsJson(_Processor([window]), simulated=False).body(10))  # type: ignore[arg-type]
    (got,) = doc["windows"]
    assert got["mean_utilization"] is None and got["confidence"] is None
    assert got["evidence"]["read_bytes_per_second"] is None and got["evidence"]["n"] == 2.0


@pytest.mark.slow
def test_headers_error_pages_gzip_and_strict_json(tmp_path: Path) -> None:
    windows = [
        _window(0, mean_utilization=HUGE),
        _window(1, evidence={"summary": "x", "read_bytes_per_second": HUGE, "r": -1e3}),
        *(_window(i) for i in range(2, 40)),
    ]
    cfg = _agent_config(tmp_path, windows)
    with agent_process(tmp_path, "--config", str(cfg)) as agent:
        wait_until_serving(agent)
        port = agent.port

        status, headers, plain = get(port, "/metrics")
        assert status == 200 and headers["Server"] == "gpufeed", headers
        assert "Content-Encoding" not in headers
        status, headers, packed = get(port, "/metrics", headers={"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip" and "Accept-Encoding" in headers["Vary"]
        unpacked = gzip.decompress(packed).decode()
        families = {ln.split()[2] for ln in plain.decode().splitlines() if ln.startswith("# TYPE")}
        assert families == {
            ln.split()[2] for ln in unpacked.splitlines() if ln.startswith("# TYPE")
        }
        _, headers, _ = get(port, "/metrics", headers={"Accept-Encoding": "gzip;q=0"})
        assert "Content-Encoding" not in headers

        status, headers, body = get(port, "/api/windows?limit=1000")
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        doc = _strict_json(body)
        assert len(doc["windows"]) == 40 and doc["simulated"] is True
        assert doc["windows"][0]["mean_utilization"] is None  # absent, not zero, not NaN
        assert doc["windows"][1]["evidence"]["read_bytes_per_second"] is None
        assert doc["windows"][1]["evidence"]["r"] == -1e3
        assert doc["windows"][2]["mean_utilization"] == 0.12
        _, headers, packed = get(port, "/api/windows", headers={"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip"
        assert _strict_json(gzip.decompress(packed)) == _strict_json(get(port, "/api/windows")[2])

        status, headers, body = get(port, "/nothing-here")
        assert status == 404 and headers["Server"] == "gpufeed"

        # A malformed request: aiohttp's own page quoted the request's bytes back.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"<script>alert(1)</script> / HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        head, _, page = reply.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"400", reply
        assert b"script" not in page and b"alert" not in page, reply
        assert b"\r\nServer: gpufeed\r\n" in head, head
        log = agent.log()
        assert "Traceback" not in log and "alert" not in log, log


def _raw(port: int, data: bytes) -> tuple[bytes, bytes]:
    """(head, page) of the server's answer to `data` on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, page = reply.partition(b"\r\n\r\n")
    return head, page


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_every_service_says_gpufeed_and_never_quotes_a_bad_request(
    tmp_path: Path, kind: str
) -> None:
    """No Python or aiohttp version in Server (the fleet and the scheduler said `Python/3.11
    aiohttp/3.14.5`), fixed error pages, and a flood of bad requests logged once."""
    with service_process(kind, tmp_path) as svc:
        wait_until_serving(svc)
        for path in (*PATHS[kind], "/nothing-here"):
            status, headers, _ = get(svc.port, path)
            assert headers["Server"] == "gpufeed", (path, headers)
        assert status == 404
        head, page = _raw(svc.port, b"<script>alert(1)</script> / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.split(b" ")[1] == b"400" and b"\r\nServer: gpufeed\r\n" in head, head
        assert page == b"400 Bad Request\n", page
        for _ in range(50):  # a header line without a colon: aiohttp logs it as an error
            head, page = _raw(svc.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nalert(2)\r\n\r\n")
            assert head.split(b" ")[1] == b"400" and b"alert" not in page, head + page
        assert get(svc.port)[0] == 200
        log = svc.log()
        assert "Traceback" not in log and "alert" not in log, log
        bad = [ln for ln in log.splitlines() if "Error handling request" in ln]
        assert len(bad) == 1, log  # rate-limited: one line per kind per 10 s


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
@pytest.mark.slow
def test_polling_windows_clients_do_not_slow_metrics(tmp_path: Path) -> None:
    cfg = _agent_config(tmp_path, [_window(i) for i in range(1000)])
    with agent_process(tmp_path, "--config", str(cfg)) as agent:
        wait_until_serving(agent)
        idle, errors = timed_scrapes(agent.port, 60, pause_seconds=0.02)
        assert not errors
        pollers = subprocess.Popen(
            [
                sys.executable,
                str(HELPERS / "loop_clients.py"),
                str(agent.port),
                "/api/windows?limit=1000",
                "4",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert pollers.stdout is not None
            assert pollers.stdout.readline().startswith("ready")
            loaded, errors = timed_scrapes(agent.port, 60, pause_seconds=0.02)
        finally:
            out, _ = pollers.communicate(input="", timeout=30)
        idle_p50, loaded_p50 = percentile(idle, 50), percentile(loaded, 50)
        figures = (
            f"/metrics p50 {idle_p50 * 1000:.1f} ms alone, {loaded_p50 * 1000:.1f} ms with 4 "
            f"clients polling 1,000 windows ({out.strip()}), p99 "
            f"{percentile(idle, 99) * 1000:.1f} / {percentile(loaded, 99) * 1000:.1f} ms"
        )
        print(figures)
        assert not errors, figures
        # Generous: the pollers share the CPU with the agent; 0.1.0 was 20x.
        assert loaded_p50 < 4 * idle_p50 + 0.002, figures


def test_error_pages_never_quote_the_parsers_message() -> None:
    """Older aiohttp versions (and parsers) put the offending bytes into the exception's
    message, which aiohttp's page for a 400 repeats: the page must be fixed text."""
    from types import SimpleNamespace

    from aiohttp import web
    from aiohttp.http_exceptions import BadHttpMessage

    from gpufeed.logonce import LogOnce
    from gpufeed.web.listener import _QuietRequestHandler, _ServerLog

    async def page() -> tuple[bytes, str]:
        server = web.Server(lambda request: None)  # type: ignore[arg-type, return-value]
        handler = _QuietRequestHandler(
            server,
            loop=asyncio.get_running_loop(),
            logger=_ServerLog(LogOnce(logging.getLogger("test.quiet"), repeat_after_seconds=10.0)),  # type: ignore[arg-type]
        )
        request = SimpleNamespace(writer=SimpleNamespace(output_size=0), headers={}, remote="x")
        exc = BadHttpMessage("Invalid method encountered:\n\n  b'<script>alert(1)</script>'")
        response = handler.handle_error(request, 400, exc, exc.message)
        assert isinstance(response, web.Response) and response.body is not None
        return bytes(response.body), response.headers["Server"]  # type: ignore[arg-type]

    body, server_header = asyncio.run(page())
    assert body == b"400 Bad Request\n" and server_header == "gpufeed"
