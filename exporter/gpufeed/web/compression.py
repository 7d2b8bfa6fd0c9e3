"""gzip for the large bodies (/metrics, /api/windows), compressed once per body, not once
per request: Prometheus asks for gzip on every scrape, and several scrapers (or dashboards
polling /api/windows) would otherwise each pay the compression on the event loop."""

from __future__ import annotations

import gzip
from typing import Final

from aiohttp import hdrs, web

# Smaller bodies are sent as they are: the gzip header and a round of zlib cost more than
# the bytes they save.
MIN_GZIP_BYTES: Final = 1024


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header admits gzip (RFC 9110: `gzip;q=0` refuses it,
    `*` stands for every coding not named)."""
    star: float | None = None
    for item in accept_encoding.split(","):
        name, _, params = item.partition(";")
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        coding = name.strip().lower()
        if coding in ("gzip", "x-gzip"):
            return quality > 0
        if coding == "*":
            star = quality
    return star is not None and star > 0


class GzipMemo:
    """The gzip of the last body given, kept while the same `source` object comes again
    (the rendered snapshot, or the windows of one correlator step)."""

    __slots__ = ("_gzipped", "_source")

    def __init__(self) -> None:
        self._source: object = None
        self._gzipped = b""

    def gzipped(self, source: object, body: bytes) -> bytes:
        if source is not self._source:
            self._gzipped = gzip.compress(body, compresslevel=6, mtime=0)
            self._source = source
        return self._gzipped


def body_response(
    request: web.Request,
    body: bytes,
    *,
    content_type: str,
    source: object,
    memo: GzipMemo,
) -> web.Response:
    """`body`, gzipped when the client asks for it and it is large enough to gain."""
    headers = {hdrs.CONTENT_TYPE: content_type, hdrs.VARY: hdrs.ACCEPT_ENCODING}
    if len(body) >= MIN_GZIP_BYTES and accepts_gzip(request.headers.get(hdrs.ACCEPT_ENCODING, "")):
        headers[hdrs.CONTENT_ENCODING] = "gzip"
        return web.Response(body=memo.gzipped(source, body), headers=headers)
    return web.Response(body=body, headers=headers)
