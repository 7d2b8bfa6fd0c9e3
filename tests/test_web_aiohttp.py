"""What gpufeed.web relies on from aiohttp beyond its documented API (the list is in
gpufeed/web/listener.py's docstring), pinned: an aiohttp that changes one of them fails
here, naming it, instead of quietly leaking request bytes into error pages or a traceback
per bad request into the log (pyproject allows aiohttp>=3.9,<4).

The behaviour is checked on a real server: gpufeed.web.serve on 127.0.0.1:0, in process,
asked over real sockets."""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket

import aiohttp
import pytest
from aiohttp import web

from gpufeed.web.connections import ConnectionLimits
from gpufeed.web.serve import serve

AIOHTTP = f"aiohttp {aiohttp.__version__}"


def test_the_request_handler_is_public_and_takes_the_keywords_we_give() -> None:
    assert "RequestHandler" in web.__all__, f"{AIOHTTP}: web.RequestHandler is not public"
    params = inspect.signature(web.RequestHandler.__init__).parameters
    for name in ("loop", "keepalive_timeout", "access_log", "logger"):
        assert name in params, f"{AIOHTTP}: RequestHandler() takes no {name}="
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_handle_error_is_the_method_we_override() -> None:
    params = list(inspect.signature(web.RequestHandler.handle_error).parameters)
    assert params == ["self", "request", "status", "exc", "message"], (
        f"{AIOHTTP}: RequestHandler.handle_error{params}: _QuietRequestHandler overrides "
        "(request, status, exc, message)"
    )


async def _ask(port: int, data: bytes) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


async def _flood() -> dict[str, list[tuple[bytes, bytes]]]:
    async def boom(_: web.Request) -> web.Response:
        raise RuntimeError("a handler's bug")

    app = web.Application()
    app.add_routes([web.get("/boom", boom)])
    sock = socket.create_server(("127.0.0.1", 0))
    serving = await serve(app, [sock], limits=ConnectionLimits())
    port = serving.ports[0]
    try:
        return {
            "method": [await _ask(port, b"<x> / HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(3)],
            "header": [
                await _ask(port, b"GET / HTTP/1.1\r\nHost: x\r\n<script>\r\n\r\n")
                for _ in range(20)
            ],
            "boom": [
                await _ask(port, b"GET /boom HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                for _ in range(20)
            ],
        }
    finally:
        await serving.close()


def test_bad_requests_and_handler_errors_reach_our_page_and_our_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, "gpufeed.web"):
        answers = asyncio.run(_flood())
    for head, body in answers["method"] + answers["header"]:
        assert head.split(b" ")[1] == b"400", f"{AIOHTTP}: {head!r}"
        assert body == b"400 Bad Request\n", f"{AIOHTTP}: handle_error not ours: {body!r}"
        assert b"\r\nServer: gpufeed\r\n" in head, f"{AIOHTTP}: {head!r}"
    for head, body in answers["boom"]:
        assert head.split(b" ")[1] == b"500", head
        assert b"\r\nServer: gpufeed\r\n" in head and b"bug" not in body, (head, body)
    records = [
        r for r in caplog.records if r.name == "gpufeed.web" and r.levelno >= logging.WARNING
    ]
    bad = [r for r in records if "BadHttpMessage" in r.getMessage()]
    bugs = [r for r in records if "RuntimeError" in str(r.exc_info)]
    # one line per kind per 10 s, through the logger we give (`logger=`): a client's bad
    # request without a traceback, our own bug with one
    assert len(bad) == 1 and bad[0].exc_info is None, (
        f"{AIOHTTP}: {[r.getMessage() for r in records]}"
    )
    assert len(bugs) == 1 and bugs[0].levelno == logging.ERROR, (
        f"{AIOHTTP}: {[r.getMessage() for r in records]}"
    )
    assert len(records) == 2, [r.getMessage() for r in records]
