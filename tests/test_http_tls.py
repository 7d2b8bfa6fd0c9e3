"""TLS, client certificates, basic auth, headers and the rate limit of --web.config.file on
every real service (the agent, the fleet and the scheduler: one web layer), with real
certificates (openssl), real HTTPS clients and a real Prometheus scraping the agent over TLS
with basic auth."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import ssl
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from http_helpers import (
    ERROR_PREFIX,
    PATHS,
    SERVICES,
    Agent,
    agent_process,
    get,
    service_process,
)
from procports import owned_server
from tls_helpers import Pki, make_pki

# bcrypt of "s3cret" (cost 10, as `htpasswd -nbBC 10 "" s3cret` makes it)
PASSWORD = "s3cret"
PASSWORD_HASH = "$2b$10$vKD5Wz0QHn0ZEw6efk5W7OWZEJwoW2kqjOOOY5nOS4PFR5hjEsfb."


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _web_config(pki: Pki, **extra: object) -> Path:
    doc: dict[str, object] = {
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
        "basic_auth_users": {"prometheus": PASSWORD_HASH},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    }
    doc.update(extra)
    path = pki.directory / f"web-{len(list(pki.directory.glob('web-*')))}.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


_UNHEALTHY = {("/healthz", "fleet"), ("/healthz", "scheduler")}


def _client(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _serving(agent: Agent, ctx: ssl.SSLContext, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert agent.proc.poll() is None, agent.log()
        try:
            if get(agent.port, context=ctx, headers=headers, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no HTTPS answer:\n{agent.log()}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_tls_and_basic_auth_guard_every_endpoint(tmp_path: Path, pki: Pki, kind: str) -> None:
    ctx = _client(pki)
    good = _auth("prometheus", PASSWORD)
    with service_process(kind, tmp_path, "--web.config.file", str(_web_config(pki))) as agent:
        _serving(agent, ctx, good)
        assert "listening on https://" in agent.log()
        for path in PATHS[kind]:
            status, headers, _ = get(agent.port, path, context=ctx, headers=good)
            # a fleet without its TSDB, a scheduler without Slurm: unhealthy, and say so
            assert status == 200 or (path, kind) in _UNHEALTHY, (path, status)
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert headers["Server"] == "gpufeed"
        for path in (*PATHS[kind], "/nothing"):
            status, headers, body = get(agent.port, path, context=ctx)
            assert status == 401 and headers["WWW-Authenticate"] == "Basic", path
            assert b"gpufeed_" not in body and b"windows" not in body
            assert headers["X-Content-Type-Options"] == "nosniff"
        for user, password in (("prometheus", "wrong"), ("nobody", PASSWORD), ("", "")):
            assert get(agent.port, context=ctx, headers=_auth(user, password))[0] == 401
        with pytest.raises(OSError):  # plain HTTP on the TLS port gets no page
            get(agent.port, timeout=3)
        assert agent.proc.poll() is None


def _request(path: str, auth: dict[str, str], version: str = "1.1", close: bool = False) -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in auth.items()]
    lines += ["Connection: close"] if close else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _exchange(port: int, ctx: ssl.SSLContext, data: bytes) -> list[bytes]:
    """The status codes of the answers to `data`, sent at once on one TLS connection."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        conn.sendall(data)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return re.findall(rb"^HTTP/1\.[01] (\d{3}) ", reply, re.M)


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_every_request_of_a_connection_is_checked(tmp_path: Path, pki: Pki, kind: str) -> None:
    """Pipelined requests (good credentials first, then none, then wrong ones, on the same
    connection) and HTTP/1.0: each request is judged on its own credentials."""
    ctx = _client(pki)
    good, wrong = _auth("prometheus", PASSWORD), _auth("prometheus", "x")
    with service_process(kind, tmp_path, "--web.config.file", str(_web_config(pki))) as agent:
        _serving(agent, ctx, good)
        pipelined = b"".join(
            [
                _request("/metrics", good),
                _request("/metrics", {}),
                _request("/healthz", wrong),
                _request("/metrics", good, close=True),
            ]
        )
        assert _exchange(agent.port, ctx, pipelined) == [b"200", b"401", b"401", b"200"]
        assert _exchange(agent.port, ctx, _request("/metrics", {}, "1.0")) == [b"401"]
        assert _exchange(agent.port, ctx, _request("/metrics", good, "1.0")) == [b"200"]
        assert agent.proc.poll() is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_client_certificates_and_allowed_sans(tmp_path: Path, pki: Pki, kind: str) -> None:
    config = _web_config(
        pki,
        tls_server_config={
            "cert_file": "server.crt",
            "key_file": "server.key",
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": "ca.crt",
            "client_allowed_sans": ["prometheus.example"],
            "min_version": "TLS12",
        },
        basic_auth_users={},
    )
    with service_process(kind, tmp_path, "--web.config.file", str(config)) as agent:
        _serving(agent, _client(pki, pki.client_cert, pki.client_key), {})
        assert get(agent.port, context=_client(pki, pki.client_cert, pki.client_key))[0] == 200
        for refused in (
            _client(pki),  # no certificate
            _client(pki, pki.other_client_cert, pki.other_client_key),  # another CA
            _client(pki, pki.wrong_san_cert, pki.wrong_san_key),  # a SAN not allowed
        ):
            with pytest.raises(OSError):
                get(agent.port, context=refused, timeout=3)
        assert get(agent.port, context=_client(pki, pki.client_cert, pki.client_key))[0] == 200


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_rate_limit_answers_429_beyond_the_burst(tmp_path: Path, pki: Pki, kind: str) -> None:
    config = _web_config(pki, basic_auth_users={}, rate_limit={"interval": "10s", "burst": 3})
    with service_process(kind, tmp_path, "--web.config.file", str(config)) as agent:
        _serving(agent, _client(pki), {})  # takes one or more of the burst
        statuses = [get(agent.port, "/healthz", context=_client(pki))[0] for _ in range(4)]
        assert statuses.count(429) >= 2 and statuses[-1] == 429, statuses


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n",
            "cannot read certificate",
        ),
        ("basic_auth_users:\n  alice: plaintext\n", "expected a bcrypt hash"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: Yes\n",
            "client_auth_type",
        ),
    ],
)
def test_a_wrong_web_config_stops_the_service_with_one_line(
    tmp_path: Path, pki: Pki, text: str, message: str, kind: str
) -> None:
    path = pki.directory / "bad-web.yml"
    path.write_text(text)
    with service_process(kind, tmp_path, "--web.config.file", str(path)) as agent:
        assert agent.proc.wait(30) == 2
        lines = agent.log().strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"{ERROR_PREFIX[kind]}{path}: line ") and message in lines[0]


@pytest.mark.slow
def test_prometheus_scrapes_the_agent_over_tls_with_basic_auth(tmp_path: Path, pki: Pki) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus not found (Debian package prometheus; `make promtool`)"
    with agent_process(tmp_path, "--web.config.file", str(_web_config(pki))) as agent:
        _serving(agent, _client(pki), _auth("prometheus", PASSWORD))
        scrape = {
            "job_name": "gpufeed",
            "scheme": "https",
            "tls_config": {"ca_file": str(pki.ca)},
            "basic_auth": {"username": "prometheus", "password": PASSWORD},
            "static_configs": [{"targets": [f"127.0.0.1:{agent.port}"]}],
        }
        wrong = dict(
            scrape,
            job_name="wrong-password",
            basic_auth={"username": "prometheus", "password": "x"},
        )
        prom_cfg = tmp_path / "prometheus.yml"
        prom_cfg.write_text(
            yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape, wrong]})
        )
        args = [
            prometheus,
            f"--config.file={prom_cfg}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}",
            "--web.listen-address=127.0.0.1:0",
        ]
        with owned_server(args, "/-/ready", tmp_path / "prometheus.log") as (_, url):
            deadline = time.monotonic() + 30
            health: dict[str, str] = {}
            while time.monotonic() < deadline:
                with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=5) as resp:
                    targets = json.load(resp)["data"]["activeTargets"]
                health = {t["labels"]["job"]: t["health"] for t in targets}
                if health.get("gpufeed") == "up" and health.get("wrong-password") == "down":
                    break
                time.sleep(0.5)
            assert health == {"gpufeed": "up", "wrong-password": "down"}, health
            query = urllib.parse.urlencode({"query": 'gpufeed_build_info{job="gpufeed"}'})
            with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as resp:
                assert json.load(resp)["data"]["result"], "no gpufeed series scraped"


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_a_rotated_certificate_is_served_without_a_restart(
    tmp_path: Path, pki: Pki, kind: str
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki.server_cert, live / "server.crt")
    shutil.copy(pki.server_key, live / "server.key")
    config = live / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    new = make_pki(tmp_path / "new-pki")
    with service_process(kind, tmp_path, "--web.config.file", str(config)) as agent:
        _serving(agent, _client(pki), {})
        for name, source in (("server.key", new.server_key), ("server.crt", new.server_cert)):
            staged = live / f".{name}"
            shutil.copy(source, staged)
            os.replace(staged, live / name)  # as a renewal tool or a Kubernetes secret does
        _serving(agent, _client(new), {})  # the new certificate, same process
        with pytest.raises(ssl.SSLError):
            get(agent.port, context=_client(pki), timeout=3)
        (live / "server.crt").write_text("not a certificate\n")  # a broken renewal
        time.sleep(1.5)
        assert get(agent.port, context=_client(new))[0] == 200  # the last good one stays
        assert "keeping the previous certificate" in agent.log()
        assert agent.proc.poll() is None
