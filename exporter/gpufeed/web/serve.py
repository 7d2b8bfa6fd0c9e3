"""Serve an aiohttp application on bound listening sockets with connection limits and the
web config (TLS, client certificates, basic auth, headers, rate limit): the one entry point
every gpufeed HTTP service (agent, fleet, scheduler) uses, so that none is left unguarded,
and the one that says where it listens."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

from aiohttp import web

from gpufeed.logonce import FLOOD_REPEAT_SECONDS, LogOnce
from gpufeed.web.auth import access_middleware
from gpufeed.web.connections import ConnectionLimits
from gpufeed.web.headers import response_headers_hook
from gpufeed.web.listener import HttpListener, loop_error_logger
from gpufeed.web.tlsreload import ReloadingTls
from gpufeed.web.webconfig import WebConfig, allowed_san

log = logging.getLogger("gpufeed.web")


@dataclass(frozen=True, slots=True)
class Serving:
    runner: web.AppRunner
    listener: HttpListener
    scheme: str  # https with the web config's TLS

    @property
    def ports(self) -> list[int]:
        return self.listener.ports

    @property
    def urls(self) -> list[str]:
        """scheme://host:port of every listening socket (the port the kernel chose for 0)."""
        return [
            f"{self.scheme}://{_host(sock)}:{sock.getsockname()[1]}"
            for sock in self.listener.sockets
        ]

    async def close(self) -> None:
        self.listener.close()
        await self.runner.cleanup()


async def serve(
    app: web.Application,
    sockets: list[socket.socket],
    *,
    limits: ConnectionLimits,
    web_config: WebConfig | None = None,
    page: str = "/metrics",
    detail: str = "",
) -> Serving:
    """Starts serving on `sockets` (bound and listening; closed by `Serving.close`) and logs
    "listening on URL`page`[, `detail`]" for each: a service started on port 0 names the port
    it got, and an operator sees at once whether it serves https."""
    config = web_config or WebConfig()
    access = access_middleware(config.basic_auth_users, config.rate_limit)
    if access is not None:
        app.middlewares.append(access)  # innermost: the app's own headers still apply
    app.on_response_prepare.append(response_headers_hook(dict(config.headers)))
    peer_check = None
    if config.tls is not None and config.tls.client_allowed_sans is not None:
        sans = config.tls.client_allowed_sans

        def peer_check(transport: asyncio.BaseTransport) -> bool:
            return allowed_san(transport.get_extra_info("peercert"), sans)

    errors = LogOnce(log, repeat_after_seconds=FLOOD_REPEAT_SECONDS)
    tls = ReloadingTls(config, config.tls, errors).context if config.tls is not None else None
    # Whatever else the loop reports (accept errors included) is rate-limited too.
    asyncio.get_running_loop().set_exception_handler(loop_error_logger(errors))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None  # set by setup()
    listener = HttpListener(
        runner.server,
        sockets,
        limits=limits,
        tls=tls,
        peer_check=peer_check,
        errors=errors,
    )
    listener.start()
    serving = Serving(runner, listener, "https" if config.tls is not None else "http")
    for url in serving.urls:
        log.info("listening on %s%s%s", url, page, f", {detail}" if detail else "")
    return serving


def _host(sock: socket.socket) -> str:
    host = str(sock.getsockname()[0])
    return f"[{host}]" if ":" in host else host
