"""The open-windows record beside the windows log (`PATH.open`), so that a stop does not
lose the windows that were open.

While the agent runs, the windows open at the moment are saved (whole file written to a
temporary name, fsynced, renamed) whenever the set changes and at least every
`SAVE_EVERY_SECONDS` of sample time. On a clean stop (SIGTERM) the open windows are closed
at the last sample and logged; after a kill -9 the next start finds the record and logs
what it holds, closed at the last time it was saved, unless the log already has the window
(it closed after the record was saved). Either way the window says it was cut short:
evidence `interrupted` = "agent stopped". That is the truthful ending: nothing is known
about the GPU after the agent stopped looking, so the window is not resumed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace

from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.outputs.windowlog import fsync_dir
from gpufeed.correlator.outputs.windowlog_read import (
    MAX_LINE_BYTES,
    SIMULATED_KEY,
    BadLine,
    decode_line,
)

SAVE_EVERY_SECONDS = 15.0
INTERRUPTED = ("interrupted", "agent stopped")
# The record holds a few windows per GPU; a file bigger than this is not ours.
MAX_RECORD_BYTES = 1000 * MAX_LINE_BYTES

WindowKey = tuple[str, str, str, float]  # gpu, uuid, job_id, start


def window_key(w: Window) -> WindowKey:
    return (w.gpu, w.uuid, w.job_id, round(w.start_seconds, 3))


def record_path(log_path: str) -> str:
    return log_path + ".open"


def save(path: str, windows: Sequence[Window], simulated: bool) -> None:
    """Replaces the record atomically; raises OSError (the old record stays whole)."""
    lines = [
        json.dumps({**w.to_json(), SIMULATED_KEY: simulated}, allow_nan=False) for w in windows
    ]
    data = ("\n".join(lines) + "\n").encode() if lines else b""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path)


def load(path: str, simulated: bool) -> tuple[list[Window], int]:
    """(windows of the record that this kind of node wrote, lines skipped); never raises."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except OSError:
        return [], 0
    if len(data) > MAX_RECORD_BYTES:
        return [], 1
    out: list[Window] = []
    skipped = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            w, sim = decode_line(raw)
        except BadLine:
            skipped += 1
            continue
        if sim != simulated:
            skipped += 1
            continue
        out.append(w)
    return out, skipped


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def interrupted(windows: Iterable[Window], logged: set[WindowKey]) -> list[Window]:
    """The windows of a record (or open at a stop) as closed, cut-short windows, minus those
    the log already has."""
    out = []
    for w in windows:
        if window_key(w) in logged:
            continue
        out.append(
            replace(
                w,
                open=False,
                evidence=(*w.evidence, INTERRUPTED),
                summary=f"{w.summary} (cut short: the agent stopped)".strip(),
            )
        )
    return out
