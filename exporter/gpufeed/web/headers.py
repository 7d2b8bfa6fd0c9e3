"""Response headers every gpufeed HTTP endpoint sends, whichever handler made the response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import hdrs, web

# What the Server header says: no Python or aiohttp version for a scanner to match.
SERVER_NAME = "gpufeed"


def response_headers_hook(
    extra: Mapping[str, str] | None = None,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An `on_response_prepare` signal handler: Server without versions, plus `extra`
    (the web config's http_server_config.headers)."""
    fixed = dict(extra or {})

    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[hdrs.SERVER] = SERVER_NAME
        response.headers.update(fixed)

    return hook
