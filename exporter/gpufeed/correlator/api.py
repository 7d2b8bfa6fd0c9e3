"""`/api/windows`: recent closed and currently open windows as JSON (aiohttp)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from gpufeed.correlator.live import CorrelatorProcessor

MAX_LIMIT = 10_000


def windows_payload(
    processor: CorrelatorProcessor, limit: int = 200, *, simulated: bool = False
) -> dict[str, Any]:
    closed, open_ = processor.windows(limit)
    payload: dict[str, Any] = {
        "windows": [w.to_json() for w in closed],
        "open": [w.to_json() for w in open_],
    }
    if simulated:  # windows of a simulated node must never pass for real ones
        payload["simulated"] = True
    return payload


def windows_routes(
    processor: CorrelatorProcessor, *, simulated: bool = False
) -> list[web.RouteDef]:
    """Routes to add to the agent's aiohttp app: `app.add_routes(windows_routes(p))`."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "200"))
        except ValueError:
            return web.json_response({"error": "limit must be an integer"}, status=400)
        limit = max(0, min(limit, MAX_LIMIT))
        return web.json_response(windows_payload(processor, limit, simulated=simulated))

    return [web.get("/api/windows", handle)]
