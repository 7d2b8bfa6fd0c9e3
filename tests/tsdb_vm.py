"""A VictoriaMetrics that can be stopped and started again on the same port (a TSDB outage
under a running client), for data in the recent past: tests/victoria.py's binary and
import, plus `-search.latencyOffset=0s` so that what was just imported is answered."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

try:
    from procports import stop, wait_listening, wait_ready
    from victoria import binary
except ImportError:  # imported as tests.tsdb_vm (bench/fleet_outage.py)
    from tests.procports import stop, wait_listening, wait_ready
    from tests.victoria import binary


class RestartableVictoria:
    def __init__(self, data: Path, extra_args: Sequence[str] = ()) -> None:
        self.data = data
        self.extra_args = list(extra_args)  # e.g. -httpAuth.username=... (a server that asks)
        self.port = 0  # ephemeral at the first start, the same one after
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            binary(),
            f"-storageDataPath={self.data}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-search.latencyOffset=0s",
            "-search.disableCache",
            "-retentionPeriod=100y",
            "-loggerLevel=ERROR",
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = wait_listening(self.proc)
        wait_ready(self.url + "/health", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def shift_trace(trace: str, offset_seconds: float) -> str:
    """The trace moved in time by `offset_seconds` (OpenMetrics, timestamps in seconds)."""
    out = []
    for line in trace.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        head, value, ts = line.rsplit(" ", 2)
        out.append(f"{head} {value} {float(ts) + offset_seconds:.3f}")
    return "\n".join(out) + "\n"
