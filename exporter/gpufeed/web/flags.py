"""The web flags of every gpufeed HTTP service (`gpufeed agent`, `gpufeed fleet`, `gpufeed
scheduler`), declared and read once, here: where to listen, the web config file (TLS, client
certificates, basic auth, headers, rate limit) and the connection limits. A service that
serves HTTP adds them with `add_web_flags`, reads them with `web_settings` before it opens
anything else, and binds with `bind_listen_socket`, so that a bad flag or file, or a port in
use, is one line and leaves nothing behind.

Nothing here imports aiohttp: the commands register their flags at every start of the CLI.
"""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass

from gpufeed.web.connections import ConnectionLimits
from gpufeed.web.webconfig import WebConfig, load_web_config

DEFAULT_HOST = "0.0.0.0"


class WebFlagError(ValueError):
    """A bad web flag: one line that names the flag and its value (exit status 2)."""


class ListenError(OSError):
    """The listen address cannot be bound (in use, not this host's): one line, exit 1."""


@dataclass(frozen=True, slots=True)
class WebSettings:
    """What the web flags say, checked: a service serves with exactly this."""

    host: str
    port: int  # 0: any free port (the start line names the one the kernel gave)
    limits: ConnectionLimits
    web_config: WebConfig | None  # None: plain HTTP to anyone


def add_web_flags(p: argparse.ArgumentParser, *, default_port: int, listen_help: str) -> None:
    """--web.listen-address, --web.config.file, --web.max-connections, --web.header-timeout
    and --web.idle-timeout, with the same meaning and defaults on every service. Each help
    names its default itself (`%(default)s`), so that it reads the same under any formatter."""
    d = ConnectionLimits()
    p.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=f"{DEFAULT_HOST}:{default_port}",
        metavar="HOST:PORT",
        help=f"{listen_help} (port 0: any free port, named in the start log line; "
        "default %(default)s)",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help=(
            "TLS, client certificates, basic auth, headers and a rate limit for every HTTP "
            "endpoint, in the Prometheus exporter-toolkit format (docs/security.md); "
            "plain HTTP without it"
        ),
    )
    p.add_argument(
        "--web.max-connections",
        dest="web_max_connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help=(
            "most HTTP connections held at once (lowered to fit the descriptor limit); "
            "beyond it the stalest (slowest to send its request, else longest idle) is "
            "closed (default %(default)s)"
        ),
    )
    p.add_argument(
        "--web.header-timeout",
        dest="web_header_timeout",
        type=float,
        default=d.header_timeout_seconds,
        metavar="SECONDS",
        help="close a connection whose request header is not complete in this time "
        "(default %(default)s)",
    )
    p.add_argument(
        "--web.idle-timeout",
        dest="web_idle_timeout",
        type=float,
        default=d.idle_timeout_seconds,
        metavar="SECONDS",
        help="close a keep-alive connection that starts no new request in this time "
        "(default %(default)s)",
    )


def parse_listen_address(value: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT; an empty host (":9843") is every IPv4 address, and an
    IPv6 host is written in brackets ("[::1]:9842")."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise WebFlagError(f"--web.listen-address {value!r}: expected HOST:PORT")
    port = int(port_text)
    if not 0 <= port < 65536:
        # 0 asks the kernel for a free port (tests, several services on one host); the
        # "listening on" log line names the port it got.
        raise WebFlagError(f"--web.listen-address {value!r}: port must be 0..65535")
    return host.strip("[]") or DEFAULT_HOST, port


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    if args.web_max_connections < 1:
        raise WebFlagError(f"--web.max-connections {args.web_max_connections}: must be at least 1")
    for flag, value in (
        ("--web.header-timeout", args.web_header_timeout),
        ("--web.idle-timeout", args.web_idle_timeout),
    ):
        if not 0 < value < float("inf"):  # also refuses nan
            raise WebFlagError(f"{flag} {value:g}: must be a positive number of seconds")
    return ConnectionLimits(
        max_connections=args.web_max_connections,
        header_timeout_seconds=args.web_header_timeout,
        idle_timeout_seconds=args.web_idle_timeout,
    )


def web_settings(args: argparse.Namespace) -> WebSettings:
    """The web flags of `args`, checked, and the web config file read. Raises WebFlagError
    or, for the file, WebConfigError (a ConfigError: file, line, key)."""
    host, port = parse_listen_address(args.listen_address)
    limits = connection_limits(args)
    path = args.web_config_file
    return WebSettings(host, port, limits, load_web_config(path) if path else None)


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """Binds the listen address before anything else is opened, so that a port in use
    leaves nothing behind and port 0 is resolved before anything is named after it."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = info[0]
        return socket.create_server(addr[:2], family=family, backlog=128)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
