"""The windows log's health as metrics: failed writes, windows waiting for the disk, lines
skipped at start. Present only while a windows log is configured (absent, not zero).
Names, types and HELP come from the catalogue."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gpufeed.catalogue import spec
from gpufeed.correlator.outputs.windowlog import LogHealth
from gpufeed.correlator.outputs.windowlog_read import SKIP_REASONS
from gpufeed.model import Families

WRITE_ERRORS: Final = "gpufeed_windows_log_write_errors_total"
PENDING: Final = "gpufeed_windows_log_pending_windows"
DROPPED: Final = "gpufeed_windows_log_dropped_windows_total"
SKIPPED: Final = "gpufeed_windows_log_skipped_lines_total"


def add_log_health(fb: Families, health: LogHealth, skipped: Mapping[str, int]) -> None:
    for name in (WRITE_ERRORS, PENDING, DROPPED, SKIPPED):
        fb.declare_spec(spec(name))
    fb.put(spec(WRITE_ERRORS), {}, float(health.write_errors_total))
    fb.put(spec(PENDING), {}, float(health.pending_windows))
    fb.put(spec(DROPPED), {}, float(health.dropped_windows_total))
    for reason in SKIP_REASONS:
        fb.put(spec(SKIPPED), {"reason": reason}, float(skipped.get(reason, 0)))
