"""Serve an aiohttp application on bound listening sockets with connection limits (and TLS
when given): the one entry point every gpufeed HTTP endpoint uses."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass

from aiohttp import web

from gpufeed.logonce import RateLimitedLogger
from gpufeed.web.connections import ConnectionLimits
from gpufeed.web.listener import HttpListener, loop_error_logger

log = logging.getLogger("gpufeed.web")


@dataclass(frozen=True, slots=True)
class Serving:
    runner: web.AppRunner
    listener: HttpListener

    @property
    def ports(self) -> list[int]:
        return self.listener.ports

    async def close(self) -> None:
        self.listener.close()
        await self.runner.cleanup()


async def serve(
    app: web.Application,
    sockets: list[socket.socket],
    *,
    limits: ConnectionLimits,
    ssl_context: ssl.SSLContext | None = None,
) -> Serving:
    """Starts serving on `sockets` (bound and listening; closed by `Serving.close`)."""
    errors = RateLimitedLogger(log)
    # Whatever else the loop reports (accept errors included) is rate-limited too.
    asyncio.get_running_loop().set_exception_handler(loop_error_logger(errors))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None  # set by setup()
    listener = HttpListener(
        runner.server, sockets, limits=limits, ssl_context=ssl_context, errors=errors
    )
    listener.start()
    return Serving(runner, listener)
