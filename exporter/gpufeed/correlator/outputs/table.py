"""Windows as a plain-text table (for `gpufeed analyze --format table` and `gpufeed windows`)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from gpufeed.correlator.engine.window import Window

COLUMNS = ("INSTANCE", "GPU", "JOB", "START (UTC)", "DURATION", "CAUSE", "CONF", "UTIL", "SUMMARY")


def _when(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
    except (ValueError, OverflowError, OSError):
        return "?"


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = round(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def printable(text: str) -> str:
    """`text` with control, format and separator characters escaped (`\x1b`, `\u202e`):
    the strings come from an agent or a log, and must not drive the terminal (ANSI
    escapes) or reorder what it shows (bidirectional overrides)."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def format_table(windows: Iterable[Window]) -> str:
    rows = [COLUMNS]
    for w in windows:
        cause = w.cause.value + (" (open)" if w.open else "")
        rows.append(
            (
                printable(w.instance),
                printable(w.gpu) or "-",
                printable(w.job_id) or "-",
                _when(w.start_seconds),
                _dur(w.duration_seconds),
                cause,
                f"{w.confidence_ratio:.2f}",
                f"{w.mean_utilization_ratio:.2f}",
                printable(w.summary),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r[:-1])]
        out.append("  ".join([*cells, r[-1]]).rstrip())
    return "\n".join(out) + "\n"
