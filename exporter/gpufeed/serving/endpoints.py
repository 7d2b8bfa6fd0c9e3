"""Where a serving job's metrics are: the endpoints the agent scrapes, and their checks.

An endpoint comes from the agent's config (`serving.endpoints`: any http(s) URL the
administrator names, for a job id or for GPUs) or from the job itself (SDK
`Job(..., serving=True, metrics_url=...)`, `gpufeed run --serving-metrics`). A URL a job
declares must be plain http on this host's loopback: the agent runs as root, and a process
must not be able to make it fetch from anywhere else (another host, a cloud metadata
service).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_URL_BYTES = 255  # a declared URL's length (the SDK's wire carries at most this)
MAX_ENDPOINTS = 64  # on one node, config and jobs together
MAX_ENDPOINTS_PER_JOB = 16
# the range of serving.max_body_bytes and serving.job_max_body_bytes
MIN_BODY_BYTES = 4 << 10
MAX_BODY_BYTES = 64 << 20
LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True, slots=True)
class ServingEndpoint:
    """One serving endpoint to scrape: its job (or ""), the GPUs it serves on (or ()), and
    its stack where known ("" = recognised from the metric names)."""

    url: str
    job_id: str = ""
    gpus: tuple[str, ...] = ()
    server: str = ""

    @property
    def endpoint(self) -> str:
        """The `endpoint` label: host:port (bounded, and no credentials or query)."""
        return endpoint_label(self.url)


def endpoint_label(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    default = 443 if parts.scheme == "https" else 80
    return f"{host}:{port if port is not None else default}"


def url_problem(url: str, *, loopback_only: bool) -> str | None:
    """Why `url` cannot be scraped, or None. Jobs may only name plain http on loopback."""
    if not url or len(url.encode()) > MAX_URL_BYTES or not url.isascii() or not url.isprintable():
        return f"expected an http:// URL of at most {MAX_URL_BYTES} printable ASCII characters"
    if " " in url:
        return "a URL has no spaces"
    parts = urlsplit(url)
    schemes = ("http",) if loopback_only else ("http", "https")
    if parts.scheme not in schemes or not parts.hostname:
        return f"expected {' or '.join(s + '://HOST[:PORT]/PATH' for s in schemes)}, got {url!r}"
    try:
        parts.port  # noqa: B018 (raises for a port out of range)
    except ValueError:
        return f"bad port in {url!r}"
    if parts.username or parts.password:
        return "credentials in the URL are not accepted"
    if loopback_only and not is_loopback(parts.hostname):
        return f"a job may only declare metrics on this host's loopback, not {parts.hostname!r}"
    return None


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class DeclaredServing:
    """What a job's own processes said about serving (SDK wire kind SERVING): the metrics
    URL it declared ("" = none), and the demand it reported itself (None = not reported)."""

    job_id: str
    url: str = ""
    requests_waiting: float | None = None
    requests_running: float | None = None
