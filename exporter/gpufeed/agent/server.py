"""The agent's HTTP face: /metrics (the latest rendered snapshot), /healthz and a landing page.

A scrape never waits on a collector: it returns the bytes the sampler rendered last.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Handler

from gpufeed import __version__
from gpufeed.agent.sampler import Sampler
from gpufeed.exposition import CONTENT_TYPE
from gpufeed.web.compression import GzipMemo, body_response

SAMPLER_KEY = web.AppKey("sampler", Sampler)
BANNER_KEY = web.AppKey("banner", str)
GZIP_KEY = web.AppKey("metrics_gzip", GzipMemo)


def build_app(
    sampler: Sampler, *, banner: str = "", extra_routes: Iterable[web.RouteDef] = ()
) -> web.Application:
    app = web.Application(middlewares=[_simulated_header] if banner else [])
    app[SAMPLER_KEY] = sampler
    app[BANNER_KEY] = banner
    app[GZIP_KEY] = GzipMemo()
    app.add_routes(
        [
            web.get("/metrics", _metrics),
            web.get("/healthz", _healthz),
            web.get("/", _index),
            *extra_routes,
        ]
    )
    return app


@web.middleware
async def _simulated_header(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every response of a simulated node says so, whichever handler made it."""
    response = await handler(request)
    response.headers["X-Gpufeed-Simulated"] = "true"
    return response


async def _metrics(request: web.Request) -> web.Response:
    latest = request.app[SAMPLER_KEY].latest
    if latest is None:
        return web.Response(status=503, text="no sample taken yet\n")
    # One gzip per rendered snapshot, however many scrapers ask for it.
    return body_response(
        request, latest.text, content_type=CONTENT_TYPE, source=latest, memo=request.app[GZIP_KEY]
    )


async def _healthz(request: web.Request) -> web.Response:
    sampler = request.app[SAMPLER_KEY]
    latest = sampler.latest
    stalled = sampler.stall_reason(time.time())
    if stalled or latest is None:
        return web.Response(status=503, text=f"{stalled}\n")
    failed = [s.name for s in latest.snapshot.statuses if not s.success]
    text = "ok\n" if not failed else f"ok (collectors failing: {', '.join(failed)})\n"
    return web.Response(text=text)


async def _index(request: web.Request) -> web.Response:
    banner = request.app[BANNER_KEY]
    latest = request.app[SAMPLER_KEY].latest
    rows = ""
    if latest is not None:
        for st in latest.snapshot.statuses:
            state = "ok" if st.success else f"FAILED: {html.escape(st.error)}"
            rows += (
                f"<tr><td>{html.escape(st.name)}</td><td>{st.duration_seconds * 1000:.1f} ms</td>"
                f"<td>{state}</td></tr>"
            )
    banner_html = (
        f'<p style="background:#c00;color:#fff;padding:8px;font-weight:bold">'
        f"{html.escape(banner)}</p>"
        if banner
        else ""
    )
    # Link only the pages this agent serves (/api/windows exists with the correlator on).
    served = {r.canonical for r in request.app.router.resources()}
    links = " · ".join(
        f'<a href="{path}">{path}</a>'
        for path in ("/metrics", "/healthz", "/api/windows")
        if path in served
    )
    body = f"""<!doctype html><html><head><title>gpufeed agent</title></head><body>
{banner_html}<h1>gpufeed agent {__version__}</h1>
<p>{links}</p>
<table><tr><th>collector</th><th>last duration</th><th>state</th></tr>{rows}</table>
</body></html>"""
    return web.Response(text=body, content_type="text/html")
