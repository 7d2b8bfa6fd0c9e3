"""A real VictoriaMetrics (Debian's `victoria-metrics`) for tests and benchmarks: started on
an ephemeral port read back from the child, with its own storage directory, loaded through
its import API.

`import_trace` converts a trace file (OpenMetrics, seconds) line by line into Prometheus
text with millisecond timestamps (`/api/v1/import/prometheus`); `import_lines` posts ready
JSON lines (`/api/v1/import`: one series per line with all its values, the cheapest to
generate and to ingest). `flush` makes what was imported searchable at once.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

try:
    from procports import owned_server
except ImportError:  # imported as tests.victoria (the benchmarks)
    from tests.procports import owned_server

BODY_BYTES = 8 << 20  # posted in bodies of about this size


def binary() -> str:
    """The victoria-metrics binary; fails (never skips) when it is missing."""
    path = shutil.which("victoria-metrics")
    if path is None:
        raise AssertionError(
            "victoria-metrics is not installed: `make promtool` installs Debian's package"
        )
    return path


@contextmanager
def victoria(storage: Path, log: Path | None = None) -> Iterator[str]:
    """Yields the base URL of a VictoriaMetrics storing under `storage`; stops it after."""
    args = [
        binary(),
        "-httpListenAddr=127.0.0.1:0",
        f"-storageDataPath={storage}",
        "-retentionPeriod=100y",  # the traces lie in the past
        # imported history must be answered as it is, not from a cache of earlier answers
        "-search.disableCache",
        "-loggerLevel=ERROR",
    ]
    with owned_server(args, "/health", log) as (_, url):
        yield url


def _post(url: str, body: bytes, headers: Mapping[str, str] | None = None) -> None:
    req = urllib.request.Request(url, data=body, method="POST", headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()


def _post_chunks(url: str, lines: Iterable[str], headers: Mapping[str, str] | None = None) -> int:
    buf: list[str] = []
    size = 0
    n = 0
    for line in lines:
        buf.append(line)
        size += len(line)
        n += 1
        if size >= BODY_BYTES:
            _post(url, "".join(buf).encode(), headers)
            buf, size = [], 0
    if buf:
        _post(url, "".join(buf).encode(), headers)
    return n


def import_trace(base: str, trace: Path, headers: Mapping[str, str] | None = None) -> int:
    """Posts every sample of a trace file (with `headers`: a server that asks for
    credentials); returns how many."""

    def lines() -> Iterator[str]:
        with trace.open(encoding="utf-8") as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                head, ts = line.rsplit(" ", 1)
                yield f"{head} {round(float(ts) * 1000)}\n"

    n = _post_chunks(base + "/api/v1/import/prometheus", lines(), headers)
    flush(base, headers)
    return n


def import_lines(base: str, lines: Iterable[str]) -> int:
    """Posts JSON lines of the `/api/v1/import` format; returns how many series."""
    n = _post_chunks(base + "/api/v1/import", lines)
    flush(base)
    return n


def flush(base: str, headers: Mapping[str, str] | None = None) -> None:
    req = urllib.request.Request(base + "/internal/force_flush", headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()


def data_bytes(storage: Path) -> int:
    return sum((Path(d) / f).stat().st_size for d, _, files in os.walk(storage) for f in files)
