"""`--web.config.file`: TLS, basic auth, response headers and a request rate limit, in the
format of the Prometheus exporter toolkit (node_exporter's `--web.config.file`), so that one
file and one set of habits serve every exporter on a node.

Field names and rules follow the toolkit (docs/web-configuration.md, web/tls_config.go):
unknown keys are errors, relative paths are relative to the file, client CAs need a client
auth type, `client_allowed_sans` needs a required client certificate, and only the listed
security headers may be set. Where Python's TLS cannot do what Go's does, the file is
refused with the reason rather than served differently: `RequestClientCert` and
`RequireAnyClientCert` (asking for a certificate without verifying it), and more than one
entry in `curve_preferences`. HTTP/2 is not served (`http2` is accepted and has no effect).
The certificate, key and client CA are read again when the file or one of them changes
(see `tlsreload`); users, headers and the rate limit are read at start.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufeed.config import ConfigError, compose_yaml, read_yaml_text


class WebConfigError(ConfigError):
    """A web config problem: file, line, key and what is wrong, in one line."""


TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# The toolkit's client_auth_type values (Go's tls.ClientAuthType names; RequireClientCert
# is its old name for RequireAnyClientCert).
CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
_UNVERIFIED_CLIENT_AUTH = frozenset(
    {"RequestClientCert", "RequireAnyClientCert", "RequireClientCert"}
)
_VERIFY_MODES: Mapping[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go's names of the cipher suites crypto/tls offers, with OpenSSL's name for each; the
# TLS 1.3 suites are accepted and, as in Go, not configurable (None).
CIPHER_SUITES: Mapping[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
CURVES: Mapping[str, str] = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
# The toolkit's settable response headers, with the values allowed where it restricts them.
HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_BCRYPT_HASH = re.compile(r"\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}")
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    client_ca_pem: bytes | None
    client_auth_type: str
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion
    openssl_ciphers: tuple[str, ...]
    prefer_server_cipher_suites: bool
    curve: str | None
    client_allowed_sans: tuple[str, ...] | None
    files: tuple[str, ...] = ()  # the certificate, key and CA files read, for reloading


@dataclass(frozen=True, slots=True)
class RateLimit:
    interval_seconds: float
    burst: int


@dataclass(frozen=True, slots=True)
class WebConfig:
    path: str = ""  # the file it was read from
    tls: TlsSettings | None = None
    # user -> bcrypt hash; empty: no authentication
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    headers: tuple[tuple[str, str], ...] = ()
    rate_limit: RateLimit | None = None


def load_web_config(path: str | Path) -> WebConfig:
    text, source = read_yaml_text(path, "web config file", WebConfigError)
    return dataclasses.replace(
        parse_web_config(text, source, base_dir=Path(path).parent), path=str(path)
    )


def parse_web_config(text: str, source: str, *, base_dir: Path) -> WebConfig:
    root = compose_yaml(text, source, WebConfigError)
    if root is None:
        return WebConfig()
    r = _Reader(source, base_dir)
    top = r.mapping(root, "")
    r.no_unknown(
        top, ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"), ""
    )
    return WebConfig(
        tls=r.tls(top.get("tls_server_config")),
        basic_auth_users=r.users(top.get("basic_auth_users")),
        headers=r.http(top.get("http_server_config")),
        rate_limit=r.rate_limit(top.get("rate_limit")),
    )


_Entry = tuple[yaml.Node, yaml.Node]


class _Reader:
    """Walks the composed YAML so that every error names its line and key."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir
        self.files: list[str] = []

    def fail(self, node: yaml.Node, key: str, msg: str) -> WebConfigError:
        return WebConfigError(f"{self.source}: line {node.start_mark.line + 1}: {key}: {msg}")

    def mapping(self, node: yaml.Node, key: str) -> dict[str, _Entry]:
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key or "web config", "expected a mapping of keys to values")
        out: dict[str, _Entry] = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.fail(k, key or "web config", "keys must be plain strings")
            if k.value in out:
                raise self.fail(k, _join(key, k.value), "duplicate key")
            out[k.value] = (k, v)
        return out

    def no_unknown(self, m: dict[str, _Entry], known: tuple[str, ...], prefix: str) -> None:
        for name, (knode, _) in m.items():
            if name not in known:
                raise self.fail(
                    knode, _join(prefix, name), f"unknown key (known: {', '.join(known)})"
                )

    def value(
        self, m: dict[str, _Entry], key: str, prefix: str, kind: type | tuple[type, ...], what: str
    ) -> Any:
        if key not in m:
            return None
        _, node = m[key]
        value = yaml.safe_load(yaml.serialize(node)) if isinstance(node, yaml.ScalarNode) else node
        if value is None:
            return None
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(node, _join(prefix, key), f"expected {what}")
        if not isinstance(value, kind):
            raise self.fail(node, _join(prefix, key), f"expected {what}")
        return value

    def strings(
        self, m: dict[str, _Entry], key: str, prefix: str
    ) -> list[tuple[yaml.Node, str]] | None:
        if key not in m:
            return None
        _, node = m[key]
        if not isinstance(node, yaml.SequenceNode) or not all(
            isinstance(n, yaml.ScalarNode) for n in node.value
        ):
            raise self.fail(node, _join(prefix, key), "expected a list of strings")
        return [(n, str(n.value)) for n in node.value]

    def pem(
        self, m: dict[str, _Entry], inline: str, file: str, prefix: str, what: str
    ) -> bytes | None:
        text = self.value(m, inline, prefix, str, "a PEM string")
        path = self.value(m, file, prefix, str, "a file name")
        if text and path:
            raise self.fail(
                m[inline][0], _join(prefix, inline), f"give {inline} or {file}, not both"
            )
        if path:
            full = self.base_dir / str(path)
            self.files.append(str(full))
            try:
                return full.read_bytes()
            except OSError as exc:
                raise self.fail(
                    m[file][1],
                    _join(prefix, file),
                    f"cannot read {what} {full}: {exc.strerror or exc}",
                ) from exc
        return str(text).encode() if text else None

    def tls(self, entry: _Entry | None) -> TlsSettings | None:
        if entry is None:
            return None
        p = "tls_server_config"
        m = self.mapping(entry[1], p)
        self.no_unknown(
            m,
            (
                "cert",
                "key",
                "client_ca",
                "cert_file",
                "key_file",
                "client_auth_type",
                "client_ca_file",
                "client_allowed_sans",
                "min_version",
                "max_version",
                "cipher_suites",
                "prefer_server_cipher_suites",
                "curve_preferences",
            ),
            p,
        )
        if not m:
            return None
        cert = self.pem(m, "cert", "cert_file", p, "certificate")
        key = self.pem(m, "key", "key_file", p, "key")
        ca = self.pem(m, "client_ca", "client_ca_file", p, "client CA")
        if cert is None:
            raise self.fail(entry[0], p, "missing one of cert or cert_file")
        if key is None:
            raise self.fail(entry[0], p, "missing one of key or key_file")
        auth = self.value(m, "client_auth_type", p, str, "a string") or "NoClientCert"
        where = m.get("client_auth_type", entry)[1]
        if auth not in CLIENT_AUTH_TYPES:
            raise self.fail(
                where,
                f"{p}.client_auth_type",
                f"invalid value {auth!r} (one of {', '.join(CLIENT_AUTH_TYPES)})",
            )
        if auth in _UNVERIFIED_CLIENT_AUTH:
            raise self.fail(
                where,
                f"{p}.client_auth_type",
                f"{auth} (a client certificate that is not verified) is not supported: use "
                "RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file",
            )
        if ca is not None and auth == "NoClientCert":
            raise self.fail(
                where,
                f"{p}.client_auth_type",
                "client CA's have been configured without a Client Auth Policy",
            )
        if ca is None and auth != "NoClientCert":
            raise self.fail(
                where, f"{p}.client_auth_type", f"{auth} needs client_ca_file or client_ca"
            )
        sans = self.strings(m, "client_allowed_sans", p)
        if sans is not None and auth != "RequireAndVerifyClientCert":
            raise self.fail(
                m["client_allowed_sans"][0],
                f"{p}.client_allowed_sans",
                "requires client_auth_type RequireAndVerifyClientCert",
            )
        versions = []
        for key_name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
            name = self.value(m, key_name, p, str, "a string") or default
            if name not in TLS_VERSIONS:
                raise self.fail(
                    m[key_name][1],
                    f"{p}.{key_name}",
                    f"unknown TLS version {name!r} (one of {', '.join(TLS_VERSIONS)})",
                )
            versions.append(TLS_VERSIONS[name])
        if versions[0] > versions[1]:
            raise self.fail(m["min_version"][1], f"{p}.min_version", "is above max_version")
        ciphers = []
        for node, name in self.strings(m, "cipher_suites", p) or []:
            if name not in CIPHER_SUITES:
                raise self.fail(node, f"{p}.cipher_suites", f"unknown cipher: {name}")
            if (openssl := CIPHER_SUITES[name]) is not None:
                ciphers.append(openssl)
        curves = self.strings(m, "curve_preferences", p) or []
        for node, name in curves:
            if name not in CURVES:
                raise self.fail(node, f"{p}.curve_preferences", f"unknown curve: {name}")
        if len(curves) > 1:
            raise self.fail(
                m["curve_preferences"][1],
                f"{p}.curve_preferences",
                "gpufeed can restrict the key exchange to one curve only (Python's ssl): give one",
            )
        prefer = self.value(m, "prefer_server_cipher_suites", p, bool, "true or false")
        settings = TlsSettings(
            cert_pem=cert,
            key_pem=key,
            client_ca_pem=ca,
            client_auth_type=auth,
            min_version=versions[0],
            max_version=versions[1],
            openssl_ciphers=tuple(ciphers),
            prefer_server_cipher_suites=True if prefer is None else prefer,
            curve=CURVES[curves[0][1]] if curves else None,
            client_allowed_sans=tuple(s for _, s in sans) if sans is not None else None,
            files=tuple(self.files),
        )
        try:
            server_ssl_context(settings)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise self.fail(entry[0], p, f"cannot use the certificate, key or CA: {exc}") from exc
        return settings

    def users(self, entry: _Entry | None) -> dict[str, bytes]:
        if entry is None:
            return {}
        out: dict[str, bytes] = {}
        for user, (knode, vnode) in self.mapping(entry[1], "basic_auth_users").items():
            hashed = vnode.value if isinstance(vnode, yaml.ScalarNode) else None
            found = _BCRYPT_HASH.fullmatch(hashed or "")
            if found is None or not 4 <= int(found.group(1)) <= 31:
                raise self.fail(
                    knode,
                    f"basic_auth_users.{user}",
                    "expected a bcrypt hash (htpasswd -nBC 10 \"\" | tr -d ':\\n')",
                )
            out[user] = str(hashed).encode()
        return out

    def http(self, entry: _Entry | None) -> tuple[tuple[str, str], ...]:
        if entry is None:
            return ()
        p = "http_server_config"
        m = self.mapping(entry[1], p)
        self.no_unknown(m, ("http2", "headers"), p)
        self.value(m, "http2", p, bool, "true or false")  # accepted; HTTP/2 is not served
        if "headers" not in m:
            return ()
        out = []
        for name, (knode, vnode) in self.mapping(m["headers"][1], f"{p}.headers").items():
            if name not in HEADERS:
                raise self.fail(
                    knode, f"{p}.headers", f"HTTP header {name!r} can not be configured"
                )
            value = vnode.value if isinstance(vnode, yaml.ScalarNode) else None
            if not isinstance(value, str) or "\n" in value or "\r" in value:
                raise self.fail(vnode, f"{p}.headers.{name}", "expected a one-line string")
            allowed = HEADERS[name]
            if allowed and value not in allowed:
                raise self.fail(
                    vnode,
                    f"{p}.headers.{name}",
                    f"expected one of {', '.join(allowed)}, got {value!r}",
                )
            if value:  # blank: unset, as in the toolkit
                out.append((name, value))
        return tuple(out)

    def rate_limit(self, entry: _Entry | None) -> RateLimit | None:
        if entry is None:
            return None
        p = "rate_limit"
        m = self.mapping(entry[1], p)
        self.no_unknown(m, ("interval", "burst"), p)
        text = self.value(m, "interval", p, (str, int), "a duration such as 1s or 100ms")
        interval = _go_duration(str(text)) if text is not None else 0.0
        if interval is None:
            raise self.fail(
                m["interval"][1], f"{p}.interval", f"invalid duration {text!r} (e.g. 1s, 100ms)"
            )
        burst = self.value(m, "burst", p, int, "an integer") or 0
        if interval == 0:
            return None  # 0 disables the limiter, as in the toolkit
        if burst < 1:
            raise self.fail(
                m.get("burst", entry)[1], f"{p}.burst", "must be at least 1 with an interval"
            )
        return RateLimit(interval_seconds=interval, burst=burst)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _go_duration(text: str) -> float | None:
    """Seconds of a Go duration ("1s", "1m30s", "250ms", "0"); None if it is not one."""
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(text):
        part = _GO_DURATION_PART.match(text, pos)
        if part is None:
            return None
        total += float(part.group(1)) * _GO_DURATION_UNITS[part.group(2)]
        pos = part.end()
    return total if text else None


def server_ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """The server-side TLS context of the settings (certificate and key checked here)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = tls.min_version
    ctx.maximum_version = tls.max_version
    _load_cert_chain(ctx, tls.cert_pem, tls.key_pem)
    if tls.openssl_ciphers:
        ctx.set_ciphers(":".join(tls.openssl_ciphers))
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve is not None:
        ctx.set_ecdh_curve(tls.curve)
    if tls.client_ca_pem is not None:
        ctx.load_verify_locations(cadata=tls.client_ca_pem.decode("ascii", "replace"))
    ctx.verify_mode = _VERIFY_MODES[tls.client_auth_type]
    return ctx


def _load_cert_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """OpenSSL reads a certificate and key from files only: anonymous in-memory files keep
    an inline key off the disk."""
    fds = []
    try:
        for name, data in (("cert", cert_pem), ("key", key_pem)):
            fd = os.memfd_create(f"gpufeed-{name}")
            fds.append(fd)
            os.write(fd, data)
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)


def allowed_san(peercert: Mapping[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Whether a verified client certificate names one of `allowed` among its subject
    alternative names (DNS, IP address, email or URI, compared exactly as the toolkit does)."""
    if not peercert:
        return False
    names = {_canonical(value) for _, value in peercert.get("subjectAltName", ())}
    return any(_canonical(name) in names for name in allowed)


def _canonical(name: str) -> str:
    """IP addresses in one spelling (OpenSSL writes IPv6 uncompressed, Go compressed)."""
    try:
        return str(ipaddress.ip_address(name.strip()))
    except ValueError:
        return name
