"""Reading the windows log: its files in order, and each line checked, never trusted.

The log is read at every agent start, so nothing in it may stop the agent: a line that is
torn, not UTF-8, not JSON, not a window object, longer than any window, or from the other
kind of node (simulated vs real) is skipped and counted by reason. Reads are bounded: each
file is read up to the size it had when opened, in pieces of at most `MAX_LINE_BYTES`, and
only regular files are read (`--log /dev/zero` must not fill memory).

Backups are found by listing the directory, not by counting up from `.1`: a kill between
the renames of a rotation can leave `.2` and `.3` without `.1`, and their windows must not
become invisible.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpufeed.correlator.engine.window import Window

# A window line is a few hundred bytes; anything near this long is not a window.
MAX_LINE_BYTES = 64 * 1024
SIMULATED_KEY = "simulated"  # every line says whether a simulated node wrote it

# Reasons a line is skipped (the `reason` label of gpufeed_windows_log_skipped_lines_total).
TORN = "torn"
NOT_UTF8 = "not_utf8"
NOT_JSON = "not_json"
NOT_A_WINDOW = "not_a_window"
TOO_LONG = "too_long"
SIMULATED = "simulated"  # a real agent ignores windows a simulated node wrote
NOT_SIMULATED = "not_simulated"  # and a simulated one ignores real windows
OPEN_RECORD = "open_record"  # a bad line in the open-windows record (openwindows)
SKIP_REASONS = (
    TORN,
    NOT_UTF8,
    NOT_JSON,
    NOT_A_WINDOW,
    TOO_LONG,
    SIMULATED,
    NOT_SIMULATED,
    OPEN_RECORD,
)


class BadLine(ValueError):
    """A log line that is not a window; `reason` is one of SKIP_REASONS."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_line(window: Window, simulated: bool) -> bytes:
    d = window.to_json()
    d[SIMULATED_KEY] = simulated
    # allow_nan=False: a NaN would make the line invalid JSON for every other reader
    return (json.dumps(d, allow_nan=False) + "\n").encode()


def decode_line(raw: bytes) -> tuple[Window, bool]:
    """(window, simulated) from one complete line without its newline, or BadLine."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadLine(NOT_UTF8) from None
    try:
        d: Any = json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        raise BadLine(NOT_JSON) from None
    if not isinstance(d, dict):
        raise BadLine(NOT_A_WINDOW)
    try:
        w = Window.from_json(d)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BadLine(NOT_A_WINDOW) from None
    if not (math.isfinite(w.start_seconds) and math.isfinite(w.end_seconds)):
        raise BadLine(NOT_A_WINDOW)
    return w, d.get(SIMULATED_KEY) is True


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def log_files(path: str) -> list[str]:
    """The log's files, oldest first: every `path.N` there is (highest N first), then path."""
    d = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    pattern = re.compile(re.escape(base) + r"\.([0-9]{1,6})")
    try:
        names = os.listdir(d)
    except OSError:
        names = []
    numbered = sorted(
        (int(m.group(1)), n) for n in names if (m := pattern.fullmatch(n)) is not None
    )
    return [os.path.join(d, n) for _, n in reversed(numbered)] + [path]


def iter_lines(path: str) -> Iterator[bytes | BadLine]:
    """Complete lines (without newline) of one file, or a BadLine for each bad stretch.

    Raises OSError if the file is not a regular file or cannot be read; a file that does
    not exist yields nothing.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        left = st.st_size  # what is appended while we read is for the next reader
        while left > 0:
            line = f.readline(min(left, MAX_LINE_BYTES + 1))
            if not line:
                return
            left -= len(line)
            if line.endswith(b"\n"):
                yield line[:-1]
                continue
            if left <= 0:
                yield BadLine(TORN)  # the last line, cut by a crash mid-write
                return
            # longer than any window: skip to the end of this line, a piece at a time
            while left > 0 and not line.endswith(b"\n"):
                line = f.readline(min(left, MAX_LINE_BYTES))
                if not line:
                    break
                left -= len(line)
            yield BadLine(TOO_LONG)


@dataclass(slots=True)
class LogScan:
    """What reading the whole log found: the newest windows and the skipped lines."""

    windows: deque[Window]
    skipped: Counter[str] = field(default_factory=Counter)
    simulated_seen: int = 0  # windows (kept or not) that a simulated node wrote


def scan_log(path: str, *, simulated: bool | None, keep: int | None = None) -> LogScan:
    """Reads every file of the log; `simulated` keeps only that kind of window (None: both),
    `keep` only the newest that many windows."""
    scan = LogScan(deque(maxlen=keep))
    for name in log_files(path):
        for item in iter_lines(name):
            if isinstance(item, BadLine):
                scan.skipped[item.reason] += 1
                continue
            if not item.strip():
                continue  # a blank line (a torn line was once ended with a newline of its own)
            try:
                w, sim = decode_line(item)
            except BadLine as e:
                scan.skipped[e.reason] += 1
                continue
            scan.simulated_seen += sim
            if simulated is not None and sim != simulated:
                scan.skipped[SIMULATED if sim else NOT_SIMULATED] += 1
                continue
            scan.windows.append(w)
    return scan


def read_log(path: str, include_backups: bool = True) -> Iterator[Window]:
    """Windows from the log (real and simulated), oldest first; bad lines are skipped."""
    files = log_files(path) if include_backups else [path]
    for name in files:
        for item in iter_lines(name):
            if isinstance(item, BadLine):
                continue
            try:
                yield decode_line(item)[0]
            except BadLine:
                continue
