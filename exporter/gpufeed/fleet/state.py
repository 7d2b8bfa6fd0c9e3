"""The fleet's durable state beside its windows log (`LOG.state.json`): the boundary of the
last completed cycle (the cursor) and the ledger totals up to it, written atomically after
the cycle's windows are on disk. A restart resumes at the next boundary; a kill between the
windows and the state means the next start redoes that cycle, and skips the windows the
log already has (a cycle gives the same windows every time it runs)."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field

from gpufeed.correlator.outputs.windowlog import fsync_dir
from gpufeed.fleet.ledger import LedgerKey, LedgerSlice

VERSION = 1


@dataclass(slots=True)
class FleetState:
    cursor_seconds: float | None = None  # boundary of the last completed cycle
    gpu_seconds: dict[LedgerKey, float] = field(default_factory=dict)
    allocated_gpu_seconds: dict[str, float] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)  # job -> last boundary with GPUs

    def add(self, boundary: float, ledger: LedgerSlice, retention_seconds: float) -> None:
        for k, v in ledger.gpu_seconds.items():
            self.gpu_seconds[k] = self.gpu_seconds.get(k, 0.0) + v
        for job, v in ledger.allocated_gpu_seconds.items():
            self.allocated_gpu_seconds[job] = self.allocated_gpu_seconds.get(job, 0.0) + v
            self.last_seen[job] = boundary
        # a job gone for the retention leaves the ledger (its series end; bounded memory)
        gone = {j for j, t in self.last_seen.items() if boundary - t > retention_seconds}
        for job in gone:
            del self.last_seen[job]
            self.allocated_gpu_seconds.pop(job, None)
        if gone:
            self.gpu_seconds = {k: v for k, v in self.gpu_seconds.items() if k[0] not in gone}
        self.cursor_seconds = boundary


class StateError(ValueError):
    """The state file exists but cannot be used; the message says why, in one line."""


def state_path(log_path: str) -> str:
    return log_path + ".state.json"


def load_state(path: str) -> FleetState:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return FleetState()
    except (OSError, ValueError) as e:
        raise StateError(
            f"fleet state {path} is unreadable ({e}); move it away to start over"
        ) from None
    try:
        if raw.get("version") != VERSION:
            raise ValueError(f"version {raw.get('version')!r}, expected {VERSION}")
        return FleetState(
            cursor_seconds=None if raw["cursor"] is None else float(raw["cursor"]),
            gpu_seconds={(str(j), str(s), str(c)): float(v) for j, s, c, v in raw["gpu_seconds"]},
            allocated_gpu_seconds={str(k): float(v) for k, v in raw["allocated"].items()},
            last_seen={str(k): float(v) for k, v in raw["last_seen"].items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StateError(
            f"fleet state {path} is not valid ({e}); move it away to start over"
        ) from None


def save_state(path: str, state: FleetState) -> None:
    """Atomically: a temporary file, fsynced, renamed over the old one, directory fsynced."""
    body = {
        "version": VERSION,
        "cursor": state.cursor_seconds,
        "gpu_seconds": [[j, s, c, v] for (j, s, c), v in sorted(state.gpu_seconds.items())],
        "allocated": dict(sorted(state.allocated_gpu_seconds.items())),
        "last_seen": dict(sorted(state.last_seen.items())),
    }
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path)
