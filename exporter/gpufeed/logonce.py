"""Log a recurring problem once, not once per occurrence: the agent's one helper for it.

Collectors run every second and the HTTP server can see thousands of bad requests a second,
so the same warning would otherwise be written 86,400 times a day. `LogOnce` has one
behaviour, for every part of the agent:

- A problem is a `key`. Its first occurrence is logged; later occurrences of the same key
  are held back and counted while the problem lasts.
- With `repeat_after_seconds` (floods: the HTTP server's errors), the first occurrence
  after that time is logged again, saying how many like it were held back since the last
  line. Without it (conditions: a broken file, an unsupported reading) a key is logged once
  while it lasts.
- `clear(key)` ends a problem (with an optional recovery line, only if it was logged), so
  it is logged again if it comes back. `report(level, messages)` is the per-interval form:
  the complete set of problems seen in an interval, each message its own key; new ones are
  logged, the ones no longer seen are cleared.
- Memory is bounded: past 1000 remembered keys, the quiet ones are forgotten first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# A bound on remembered keys, so a file that produces ever-new garbage cannot grow memory.
MAX_REMEMBERED = 1000
# How often a flood of one kind (bad HTTP requests, accept() out of descriptors) gets a line.
FLOOD_REPEAT_SECONDS = 10.0


@dataclass(slots=True)
class _Active:
    logged_at_seconds: float
    held_back: int = 0


class LogOnce:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        repeat_after_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._repeat_after = repeat_after_seconds
        self._clock = clock
        self._active: dict[object, _Active] = {}

    def log(self, level: int, key: object, msg: str, *args: Any, exc_info: Any = None) -> bool:
        """Logs `msg % args` unless `key` was logged and has not been cleared (or, with
        `repeat_after_seconds`, was logged within that time). True if a line was written."""
        if not self._logger.isEnabledFor(level):
            return False
        now = self._clock()
        active = self._active.get(key)
        if active is not None:
            due = self._repeat_after is not None and (
                now >= active.logged_at_seconds + self._repeat_after
            )
            if not due:
                active.held_back += 1
                return False
            if active.held_back:
                msg += " (%d more like this since the last such line, not logged)"
                args = (*args, active.held_back)
        elif len(self._active) >= MAX_REMEMBERED:
            self._forget_quiet(now)
        self._active[key] = _Active(now)
        self._logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def clear(self, key: object, msg: str = "", *args: Any) -> None:
        """The problem `key` is over; `msg % args` is logged at INFO if it had been logged."""
        if self._active.pop(key, None) is not None and msg:
            self._logger.info(msg, *args)

    def report(self, level: int, messages: Iterable[str]) -> None:
        """The complete set of problems seen in this interval: new ones are logged, the
        ones not seen any more are cleared."""
        current = set(messages)
        for key in [k for k in self._active if k not in current]:
            del self._active[key]
        for msg in sorted(current):
            self.log(level, msg, "%s", msg)

    def _forget_quiet(self, now: float) -> None:
        """Drops the keys that could be logged again anyway, else all of them."""
        if self._repeat_after is not None:
            for key in [
                k
                for k, a in self._active.items()
                if a.logged_at_seconds + self._repeat_after <= now
            ]:
                del self._active[key]
        if len(self._active) >= MAX_REMEMBERED:
            self._active.clear()
