"""Warn about a recurring problem once, not once per sampling interval.

Collectors run every second; a broken file would otherwise write the same warning 86,400
times a day. A message is logged when it first appears, forgotten when it stops appearing,
and logged again if it comes back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

# A bound on remembered messages, so a file that produces ever-new garbage cannot grow memory.
_MAX_REMEMBERED = 1000


class OnceLogger:
    def __init__(self, logger: logging.Logger, level: int = logging.WARNING) -> None:
        self._logger = logger
        self._level = level
        self._active: set[str] = set()

    def report(self, messages: Iterable[str]) -> None:
        """The complete set of problems seen in this interval; new ones are logged."""
        current = set(messages)
        for msg in sorted(current - self._active):
            self._logger.log(self._level, "%s", msg)
        self._active = current if len(current) <= _MAX_REMEMBERED else set()
