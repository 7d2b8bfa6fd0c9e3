"""A real VictoriaMetrics (Debian's `victoria-metrics`) for tests and benchmarks: started on
an ephemeral port read back from the child, with its own storage directory, loaded through
its import API.

`import_trace` converts a trace file (OpenMetrics, seconds) line by line into Prometheus
text with millisecond timestamps (`/api/v1/import/prometheus`); `import_lines` posts ready
JSON lines (`/api/v1/import`: one series per line with all its values, the cheapest to
generate and to ingest). `flush` makes what was imported searchable at once; `settle`
merges it, so that every later query reads the same stored digits.
"""

from __future__ import annotations

import os
import shutil
import time
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
        # -search.maxUniqueTimeseries stays at its default (300,000): a 1,000-node benchmark
        # fleet holds 312,000 series, and no call gpufeed makes matches more than one
        # family's (docs/fleet.md, TSDB limits)
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


def settle(base: str, timeout_s: float = 120.0) -> None:
    """Merges what was imported into as few parts as it takes and waits until no merge
    runs, so that every later query reads the same stored blocks: a background merge
    re-encodes blocks, and a value's last digits can change with it (tests/window_match.py).
    """
    with urllib.request.urlopen(base + "/internal/force_merge", timeout=120) as r:
        r.read()  # starts the merge and returns at once
    deadline = time.monotonic() + timeout_s
    last: tuple[int, int] | None = None
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now = _storage_parts(base)
        if now != last:
            last, quiet_since = now, time.monotonic()
        parts, merges = now
        if merges == 0 and (parts <= 1 or time.monotonic() - quiet_since >= 2.0):
            return
        time.sleep(0.2)
    raise AssertionError(f"VictoriaMetrics at {base} still merging after {timeout_s:g} s: {last}")


def _storage_parts(base: str) -> tuple[int, int]:
    """(data parts, merges running) of the storage, from the server's own /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    parts = merges = 0
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("vm_parts{") and 'type="storage/' in name:
            parts += int(float(value))
        elif name.startswith("vm_active_merges{") and 'type="storage/' in name:
            merges += int(float(value))
    return parts, merges


def data_bytes(storage: Path) -> int:
    return sum((Path(d) / f).stat().st_size for d, _, files in os.walk(storage) for f in files)
