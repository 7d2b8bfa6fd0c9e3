"""Log a recurring problem once, not once per occurrence: the agent's two helpers for it.

- `OnceLogger` is for problems seen per sampling interval: collectors run every second and a
  broken file would otherwise write the same warning 86,400 times a day. A message is logged
  when it first appears, forgotten when it stops appearing, and logged again if it comes back.
- `RateLimitedLogger` is for events that can come thousands of times a second (a flood of bad
  HTTP requests, `accept()` out of descriptors): at most one line per kind of event per
  interval, and that line says how many like it were held back since the last one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

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


class RateLimitedLogger:
    """At most one line per `key` per `interval_seconds`; the rest are counted, not written."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_seconds: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_seconds = interval_seconds
        self._clock = clock
        self._next_allowed: dict[str, float] = {}
        self._held_back: dict[str, int] = {}

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: Any = None) -> None:
        """Logs `msg % args` unless a line with the same key was logged within the interval."""
        if not self._logger.isEnabledFor(level):
            return
        now = self._clock()
        if now < self._next_allowed.get(key, now):
            self._held_back[key] = self._held_back.get(key, 0) + 1
            return
        if len(self._next_allowed) >= _MAX_REMEMBERED:  # ever-new keys: forget the quiet ones
            self._forget_expired(now)
        self._next_allowed[key] = now + self._interval_seconds
        held = self._held_back.pop(key, 0)
        if held:
            msg += " (%d more like this since the last such line, not logged)"
            args = (*args, held)
        self._logger.log(level, msg, *args, exc_info=exc_info)

    def _forget_expired(self, now: float) -> None:
        expired = [k for k, t in self._next_allowed.items() if t <= now]
        for k in expired:
            del self._next_allowed[k]
            self._held_back.pop(k, None)
        if len(self._next_allowed) >= _MAX_REMEMBERED:
            self._next_allowed.clear()
            self._held_back.clear()
