"""How to reach a Prometheus-compatible server: its URL plus what the server asks of every
request (a tenant header, basic auth or a bearer token, a private CA).

`ServerUrl` is a `str` (the base URL, so every function that takes `base: str` takes it
unchanged) that also carries the request headers and the TLS context; `promql` reads them
when it builds each request. Credentials are read from files, never from flags (flags show
in `ps`), once at start.
"""

from __future__ import annotations

import argparse
import base64
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class AccessError(ValueError):
    """A flag or a credentials file is unusable; the message says which, in one line."""


class ServerUrl(str):
    """A base URL with the headers and TLS context its requests need. It pickles (to the
    fleet's worker processes) as its URL, headers and CA file; the context is rebuilt."""

    headers: Mapping[str, str]
    ca_file: str
    ssl_context: ssl.SSLContext | None

    def __new__(
        cls, url: str, headers: Mapping[str, str] | None = None, ca_file: str = ""
    ) -> ServerUrl:
        self = super().__new__(cls, url)
        self.headers = dict(headers or {})
        self.ca_file = ca_file
        self.ssl_context = None
        if ca_file:
            try:
                self.ssl_context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as e:
                raise AccessError(f"--prometheus.ca-file {ca_file}: {e}") from None
        return self

    def __reduce__(self) -> tuple[type[ServerUrl], tuple[str, dict[str, str], str]]:
        return (ServerUrl, (str(self), dict(self.headers), self.ca_file))


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise AccessError(f"{what} {path}: {getattr(e, 'strerror', None) or e}") from None
    if not text:
        raise AccessError(f"{what} {path} is empty")
    return text


def build_server_url(
    url: str,
    header_args: Sequence[str] = (),
    *,
    basic_auth_user: str = "",
    basic_auth_password_file: str = "",
    bearer_token_file: str = "",
    ca_file: str = "",
) -> ServerUrl:
    """The ServerUrl the flags describe (`--prometheus.header NAME=VALUE`, repeatable: e.g.
    `X-Scope-OrgID=team-a` for Mimir or Cortex)."""
    if not url.startswith(("http://", "https://")):
        raise AccessError(f"--prometheus.url {url!r} must start with http:// or https://")
    headers: dict[str, str] = {}
    for item in header_args:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise AccessError(f"--prometheus.header {item!r} must be NAME=VALUE")
        headers[name.strip()] = value
    if bearer_token_file and basic_auth_user:
        raise AccessError("give basic auth or a bearer token, not both")
    if bearer_token_file:
        token = _read_secret(bearer_token_file, "--prometheus.bearer-token-file")
        headers["Authorization"] = f"Bearer {token}"
    if basic_auth_user:
        password = ""
        if basic_auth_password_file:
            password = _read_secret(basic_auth_password_file, "--prometheus.password-file")
        pair = f"{basic_auth_user}:{password}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    return ServerUrl(url, headers, ca_file)


def add_flags(add: Callable[..., Any]) -> None:
    """The flags saying how to reach the server, for every command that queries it
    (`gpufeed fleet`, `gpufeed analyze --prometheus`); `add` is a parser's add_argument."""
    add(
        "--prometheus.header",
        dest="headers",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header for every query (repeatable): X-Scope-OrgID=TENANT for Mimir/Cortex; "
        "VictoriaMetrics cluster takes the tenant in the URL (.../select/ACCOUNT/prometheus)",
    )
    add("--prometheus.user", dest="user", default="", help="basic auth user name")
    add("--prometheus.password-file", dest="password_file", default="", help="basic auth password")
    add("--prometheus.bearer-token-file", dest="token_file", default="", help="bearer token")
    add("--prometheus.ca-file", dest="ca_file", default="", help="CA bundle for an https URL")


def server_url(url: str, args: argparse.Namespace) -> ServerUrl:
    """The ServerUrl of `url` with what `add_flags`' flags say; raises AccessError."""
    return build_server_url(
        url,
        args.headers,
        basic_auth_user=args.user,
        basic_auth_password_file=args.password_file,
        bearer_token_file=args.token_file,
        ca_file=args.ca_file,
    )
