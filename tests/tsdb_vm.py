"""A real VictoriaMetrics (Debian's `victoria-metrics`) for tests and benchmarks: started on
an ephemeral port (or a given one, to restart it where a client expects it), loaded through
its import API with trace lines shifted in time."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from procports import stop, wait_listening, wait_ready

BINARY = "victoria-metrics"


def available() -> bool:
    return shutil.which(BINARY) is not None


class VictoriaMetrics:
    def __init__(self, data: Path, port: int = 0) -> None:
        self.data = data
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            BINARY,
            f"-storageDataPath={self.data}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-search.latencyOffset=0s",  # the tests query right after they import
            "-search.disableCache",
            "-retentionPeriod=100y",
            "-loggerLevel=ERROR",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = wait_listening(self.proc)
        wait_ready(self.url + "/health", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None

    def import_lines(self, lines: Iterable[str], batch: int = 50_000) -> None:
        """Prometheus text lines with timestamps in milliseconds, posted in batches."""
        buf: list[str] = []
        for line in lines:
            buf.append(line)
            if len(buf) >= batch:
                self._post(buf)
                buf = []
        if buf:
            self._post(buf)
        with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=60):
            pass

    def _post(self, lines: list[str]) -> None:
        body = ("\n".join(lines) + "\n").encode()
        req = urllib.request.Request(self.url + "/api/v1/import/prometheus", data=body)
        with urllib.request.urlopen(req, timeout=300) as r:
            assert r.status in (200, 204), r.status


def shifted(trace: str, offset_seconds: float) -> Iterator[str]:
    """A trace's samples (OpenMetrics, seconds) as import lines (milliseconds), moved by
    `offset_seconds`."""
    for line in trace.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value, ts = line.rsplit(" ", 2)
        yield f"{head} {value} {round((float(ts) + offset_seconds) * 1000)}"


def shift_trace(trace: str, offset_seconds: float) -> str:
    """The trace itself moved by `offset_seconds` (for the offline analysis to compare)."""
    out = []
    for line in trace.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        head, value, ts = line.rsplit(" ", 2)
        out.append(f"{head} {value} {float(ts) + offset_seconds:.3f}")
    return "\n".join(out) + "\n"
