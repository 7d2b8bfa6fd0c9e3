"""Windows as a plain-text table (for `gpufeed analyze --format table` and `gpufeed windows`)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from gpufeed.correlator.window import Window

COLUMNS = ("INSTANCE", "GPU", "JOB", "START (UTC)", "DURATION", "CAUSE", "CONF", "UTIL", "SUMMARY")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _dur(s: float) -> str:
    s = round(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_table(windows: Iterable[Window]) -> str:
    rows = [COLUMNS]
    for w in windows:
        cause = w.cause.value + (" (open)" if w.open else "")
        rows.append(
            (
                w.instance,
                w.gpu or "-",
                w.job_id or "-",
                _when(w.start_seconds),
                _dur(w.duration_seconds),
                cause,
                f"{w.confidence_ratio:.2f}",
                f"{w.mean_utilization_ratio:.2f}",
                w.summary,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r[:-1])]
        out.append("  ".join([*cells, r[-1]]).rstrip())
    return "\n".join(out) + "\n"
