"""/metrics and /healthz of a service whose page is rendered in the background (`gpufeed
fleet` after each cycle, `gpufeed scheduler` after each read): a scrape computes nothing,
it returns the last page, gzipped once per page when the client asks."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from gpufeed.exposition import CONTENT_TYPE
from gpufeed.web.compression import GzipMemo, body_response


def page_routes(page: Callable[[], bytes], problem: Callable[[], str]) -> list[web.RouteDef]:
    """`page()`: the last rendered exposition page; `problem()`: "" when healthy, else why
    not (/healthz answers 503 with it)."""
    memo = GzipMemo()

    async def metrics(request: web.Request) -> web.Response:
        body = page()
        # The page object is the memo's key: a new page is rendered, the gzip is made anew.
        return body_response(request, body, content_type=CONTENT_TYPE, source=body, memo=memo)

    async def healthz(_: web.Request) -> web.Response:
        why = problem()
        return web.Response(status=503 if why else 200, text=(why or "ok") + "\n")

    return [web.get("/metrics", metrics), web.get("/healthz", healthz)]
