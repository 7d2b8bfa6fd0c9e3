"""Which connections the server holds and which it closes: a cap and two timeouts.

Slow clients (slowloris) cost a descriptor each and send nothing useful; under the fd limit
systemd gives a unit (1024), 1,100 of them left no descriptor for a scrape. So every
connection is a slot from the moment it is accepted:

- a slot waits for a complete request header for at most `header_timeout_seconds`,
- a slot whose last request header is complete (it is being answered, or is an idle
  keep-alive connection) lives at most `idle_timeout_seconds` without starting a new one,
- beyond `max_connections` the stalest slot is closed to admit the new one: the one that
  has waited longest for its header, else the longest idle. A client that sends its request
  at once (a scraper) is never the stalest, so it gets in however many slow ones queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Descriptors kept free for everything else the agent opens (NVML device files, /proc and
# /sys reads of the collectors, the SDK socket, the windows log, OTLP connections).
FD_RESERVE = 128

# What ends a request header: an empty line ("\r\n\r\n", or "\n\n" from lenient clients).
_HEADER_ENDS = (b"\n\r\n", b"\n\n")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 256
    header_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 60.0

    def effective_max_connections(self, fd_soft_limit: int) -> int:
        """The cap that still leaves descriptors for the rest of the process."""
        room = max(fd_soft_limit - FD_RESERVE, fd_soft_limit // 2)
        return max(1, min(self.max_connections, room))


class Slot:
    """One accepted connection; `transport` is set once the connection is set up (after the
    TLS handshake, with TLS)."""

    __slots__ = ("since_seconds", "sock", "tail", "transport")

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.since_seconds = now
        self.tail = b""
        self.transport: asyncio.BaseTransport | None = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
            return
        # Still in its TLS handshake: ending the socket makes the handshake fail.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class ConnectionGuard:
    def __init__(
        self,
        limits: ConnectionLimits,
        max_connections: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.max_connections = max_connections
        self._clock = clock
        # Insertion order is the order of `since_seconds`: the stalest slot comes first.
        self._waiting: OrderedDict[Slot, None] = OrderedDict()
        self._idle: OrderedDict[Slot, None] = OrderedDict()
        self.evicted_total = 0
        self.timed_out_total = 0

    def __len__(self) -> int:
        return len(self._waiting) + len(self._idle)

    def admit(self, sock: socket.socket) -> Slot:
        """A slot for a just-accepted socket, closing the stalest ones beyond the cap."""
        while len(self) >= self.max_connections and self.evict_one():
            pass
        slot = Slot(sock, self._clock())
        self._waiting[slot] = None
        return slot

    def evict_one(self) -> bool:
        for table in (self._waiting, self._idle):
            if table:
                slot, _ = table.popitem(last=False)
                slot.close()
                self.evicted_total += 1
                return True
        return False

    def received(self, slot: Slot, data: bytes) -> None:
        waiting = slot in self._waiting
        if not waiting and slot not in self._idle:
            return  # already closed by the cap or a timeout
        probe = slot.tail + data[:2]
        header_done = any(end in data or end in probe for end in _HEADER_ENDS)
        slot.tail = (slot.tail + data[-2:])[-2:]
        if header_done:
            (self._waiting if waiting else self._idle).pop(slot)
            slot.since_seconds = self._clock()
            self._idle[slot] = None
        elif not waiting:  # the first bytes of the next request: its header is timed
            del self._idle[slot]
            slot.since_seconds = self._clock()
            self._waiting[slot] = None

    def release(self, slot: Slot) -> None:
        self._waiting.pop(slot, None)
        self._idle.pop(slot, None)

    def expire(self) -> int:
        """Closes the slots past their deadline; returns how many."""
        now = self._clock()
        closed = 0
        for table, timeout in (
            (self._waiting, self.limits.header_timeout_seconds),
            (self._idle, self.limits.idle_timeout_seconds),
        ):
            while table:
                slot = next(iter(table))
                if slot.since_seconds + timeout > now:
                    break
                del table[slot]
                slot.close()
                closed += 1
        # A TLS handshake that failed closes its socket without telling the application
        # protocol: such slots are dropped here, not left to count against the cap.
        dead = [s for s in self._waiting if s.transport is None and s.sock.fileno() == -1]
        for slot in dead:
            del self._waiting[slot]
        self.timed_out_total += closed
        return closed
