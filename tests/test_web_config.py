"""--web.config.file in the exporter-toolkit format: what it accepts, and the one-line error
for what it does not (table-driven, with real certificates made by openssl)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from gpufeed.web.auth import TokenBucket, _basic_credentials
from gpufeed.web.webconfig import (
    RateLimit,
    WebConfigError,
    _go_duration,
    allowed_san,
    load_web_config,
    server_ssl_context,
)
from tls_helpers import Pki, make_pki

# htpasswd -nbBC 10 "" secret
SECRET_HASH = "$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _write(pki: Pki, text: str) -> Path:
    path = pki.directory / "web.yml"  # beside the certificates: relative names resolve
    path.write_text(text)
    return path


def test_the_toolkits_example_file_is_accepted(pki: Pki) -> None:
    cfg = load_web_config(
        _write(
            pki,
            f"""
tls_server_config:
  cert_file: server.crt
  key_file: {pki.server_key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [prometheus.example]
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  curve_preferences: [X25519]
  prefer_server_cipher_suites: false
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    X-Content-Type-Options: nosniff
    Strict-Transport-Security: max-age=31536000
    Content-Security-Policy: ""
basic_auth_users:
  alice: {SECRET_HASH}
rate_limit:
  interval: 1s
  burst: 20
""",
        )
    )
    assert cfg.tls is not None
    assert cfg.tls.min_version is ssl.TLSVersion.TLSv1_3
    assert cfg.tls.openssl_ciphers == ("ECDHE-ECDSA-AES128-GCM-SHA256",)
    assert cfg.tls.client_allowed_sans == ("prometheus.example",)
    assert dict(cfg.basic_auth_users) == {"alice": SECRET_HASH.encode()}
    assert cfg.headers == (
        ("X-Frame-Options", "deny"),
        ("X-Content-Type-Options", "nosniff"),
        ("Strict-Transport-Security", "max-age=31536000"),
    )  # a blank header is unset
    assert cfg.rate_limit == RateLimit(interval_seconds=1.0, burst=20)
    ctx = server_ssl_context(cfg.tls)
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.minimum_version is ssl.TLSVersion.TLSv1_3
    assert "secret" not in repr(cfg) and "PRIVATE" not in repr(cfg)


def test_inline_pem_and_an_empty_file(pki: Pki) -> None:
    cert = pki.server_cert.read_text().replace("\n", "\n    ")
    key = pki.server_key.read_text().replace("\n", "\n    ")
    cfg = load_web_config(
        _write(pki, f"tls_server_config:\n  cert: |\n    {cert}\n  key: |\n    {key}\n")
    )
    assert cfg.tls is not None and server_ssl_context(cfg.tls).verify_mode is ssl.CERT_NONE
    empty = load_web_config(_write(pki, "# nothing\n"))
    assert empty.tls is None and not empty.basic_auth_users and empty.rate_limit is None


BAD = [
    (
        "tls_server_config:\n  cert_file: server.crt\n",
        "line 1: tls_server_config: missing one of key or key_file",
    ),
    ("tls_server_config:\n  key_file: server.key\n", "missing one of cert or cert_file"),
    (
        "tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n",
        "line 2: tls_server_config.cert_file: cannot read certificate",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: client.key\n",
        "tls_server_config: cannot use the certificate, key or CA",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: Sometimes\n",
        "line 4: tls_server_config.client_auth_type: invalid value 'Sometimes'",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.crt\n",
        "RequireAnyClientCert (a client certificate that is not verified) is not supported",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n",
        "client CA's have been configured without a Client Auth Policy",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n",
        "RequireAndVerifyClientCert needs client_ca_file or client_ca",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n  client_allowed_sans: [a]\n",
        "client_allowed_sans: requires client_auth_type RequireAndVerifyClientCert",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS14\n",
        "line 4: tls_server_config.min_version: unknown TLS version 'TLS14'",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS13\n  max_version: TLS12\n",
        "min_version: is above max_version",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  cipher_suites: [TLS_NULL]\n",
        "unknown cipher: TLS_NULL",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  curve_preferences: [CurveP999]\n",
        "unknown curve: CurveP999",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  curve_preferences: [X25519, CurveP256]\n",
        "one curve only",
    ),
    (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  certfile: x\n",
        "line 4: tls_server_config.certfile: unknown key",
    ),
    (
        "tls_server_config:\n  cert: abc\n  cert_file: server.crt\n  key_file: server.key\n",
        "give cert or cert_file, not both",
    ),
    (
        "basic_auth_users:\n  alice: secret\n",
        "line 2: basic_auth_users.alice: expected a bcrypt hash",
    ),
    ("basic_auth_users: [alice]\n", "basic_auth_users: expected a mapping"),
    (
        "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
        "line 3: http_server_config.headers.X-Frame-Options: expected one of deny, sameorigin, got 'allow'",
    ),
    (
        "http_server_config:\n  headers:\n    Server: x\n",
        "HTTP header 'Server' can not be configured",
    ),
    ("http_server_config:\n  http2: maybe\n", "http_server_config.http2: expected true or false"),
    ("rate_limit:\n  interval: fast\n  burst: 1\n", "rate_limit.interval: invalid duration 'fast'"),
    ("rate_limit:\n  interval: 1s\n", "rate_limit.burst: must be at least 1"),
    ("tls_config:\n  cert_file: x\n", "line 1: tls_config: unknown key"),
    ("tls_server_config: [\n", "invalid YAML"),
    ("- a\n", "web config: expected a mapping"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_wrong_file_is_one_line_naming_file_line_and_key(
    pki: Pki, text: str, message: str
) -> None:
    path = _write(pki, text)
    with pytest.raises(WebConfigError) as err:
        load_web_config(path)
    assert str(err.value).startswith(f"{path}:"), err.value
    assert message in str(err.value) and "\n" not in str(err.value), err.value


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"web.yml: cannot read web config file"):
        load_web_config(tmp_path / "web.yml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("250ms", 0.25),
        ("1m30s", 90.0),
        ("0", 0.0),
        ("1.5h", 5400.0),
        ("", None),
        ("5", None),
        ("1d", None),
    ],
)
def test_go_durations(text: str, seconds: float | None) -> None:
    assert _go_duration(text) == seconds


def test_token_bucket_allows_a_burst_then_one_per_interval() -> None:
    now = [0.0]
    bucket = TokenBucket(RateLimit(interval_seconds=1.0, burst=3), clock=lambda: now[0])
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]
    now[0] += 1.0
    assert [bucket.allow() for _ in range(2)] == [True, False]


@pytest.mark.parametrize(
    ("header", "credentials"),
    [
        ("Basic YWxpY2U6c2VjcmV0", ("alice", "secret")),
        ("basic YWxpY2U6c2VjOnJldA==", ("alice", "sec:ret")),  # the password may hold ':'
        ("Bearer YWxpY2U6c2VjcmV0", None),
        ("Basic not-base64!", None),
        ("Basic YWxpY2U=", None),  # no ':'
        ("", None),
    ],
)
def test_basic_credentials(header: str, credentials: tuple[str, str] | None) -> None:
    assert _basic_credentials(header) == credentials


def test_allowed_sans_match_exactly_and_ips_in_any_spelling() -> None:
    cert = {"subjectAltName": (("DNS", "prometheus.example"), ("IP Address", "0:0:0:0:0:0:0:1\n"))}
    assert allowed_san(cert, ("prometheus.example",))
    assert allowed_san(cert, ("::1",))
    assert not allowed_san(cert, ("example",))
    assert not allowed_san(None, ("prometheus.example",))
