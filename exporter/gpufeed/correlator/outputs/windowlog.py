"""The durable log of closed windows: JSON lines, fsynced, rotated by size, one writer.

Durability, under kill -9, a full disk and rotation:
- Each window is one line, written whole or not at all: a short write (disk full) is
  followed by more writes, and when the line cannot be finished the file is truncated back
  to where the line began, so nothing is left for the next window to be glued onto. A torn
  last line left by a crash is cut off when the log is next opened (cutting needs no free
  space, unlike ending it with a newline).
- The log keeps `RESERVE_BYTES` allocated on its filesystem (`PATH.reserve`): when the
  disk fills up, the reserve is given back and the windows written into the space it
  held (hundreds of windows: days of a full disk at the rate windows close). It is taken
  again once there is space.
- A window that cannot be written even so is kept in memory, in order, and written when
  the disk takes it again (`retry`); only a kill while the disk is still full loses it.
  The log is never switched off: every append tries again.
- Rotation renames `.N-1` -> `.N` ... -> `.1` like logrotate; a kill between the renames
  leaves a gap in the numbers, which readers tolerate (`log_files`).
- One agent per log: an exclusive `flock` on `PATH.lock` (which holds the owner's pid), so
  that two agents on one host cannot interleave their windows in one file.
- Every line says whether a simulated node wrote it (`simulated`), see `windowlog_read`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections import deque
from dataclasses import dataclass

from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.outputs.windowlog_read import encode_line, log_files, read_log

__all__ = ["LogHealth", "WindowLog", "WindowLogInUse", "read_log"]

# Windows waiting for a full disk; beyond this the oldest are dropped (and counted).
MAX_PENDING = 10_000
RESERVE_BYTES = 64 * 1024


class WindowLogInUse(Exception):
    """Another process holds the log's lock; the message names it, in one line."""


@dataclass(frozen=True, slots=True)
class LogHealth:
    write_errors_total: int  # failed attempts to write a window or the open-windows record
    pending_windows: int  # closed windows not yet on disk
    dropped_windows_total: int  # closed windows given up (more than MAX_PENDING waiting)


class WindowLog:
    def __init__(
        self,
        path: str,
        max_bytes: int = 16 * 1024 * 1024,
        backups: int = 3,
        *,
        simulated: bool = False,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.simulated = simulated
        self._lock = threading.Lock()
        self._pending: deque[bytes] = deque()
        self._errors = 0
        self._dropped = 0
        self._fd = -1
        self._torn = True  # check the end of the file before the first write
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._lock_fd = _take_lock(path + ".lock")
        self._reserved = _reserve(path + ".reserve")

    # ---- writing ---------------------------------------------------------------------------
    def append(self, window: Window) -> OSError | None:
        """Queues the window and writes everything queued; the error if something could not
        be written yet (it stays queued for the next append or `retry`)."""
        line = encode_line(window, self.simulated)
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self._dropped += 1
            self._pending.append(line)
            return self._flush()

    def retry(self) -> OSError | None:
        """Writes what a full disk held back; None when nothing is left."""
        with self._lock:
            return self._flush() if self._pending else None

    def _flush(self) -> OSError | None:
        if self._lock_fd < 0:
            return OSError(errno.EBADF, "windows log is closed")
        try:
            try:
                self._write_pending()
            except OSError as e:
                if e.errno != errno.ENOSPC or not self._reserved:
                    raise
                self._errors += 1
                _release(self.path + ".reserve")  # the disk is full: use the reserve
                self._reserved = False
                self._write_pending()
        except OSError as e:
            self._errors += 1
            return e
        if not self._reserved:
            self._reserved = _reserve(self.path + ".reserve")
        return None

    def _write_pending(self) -> None:
        while self._pending:
            self._write_line(self._pending[0])
            self._pending.popleft()

    def _write_line(self, line: bytes) -> None:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if self._torn:
            _cut_torn_tail(self._fd)
            self._torn = False
        size = os.fstat(self._fd).st_size
        if size > 0 and size + len(line) > self.max_bytes:
            self._rotate()
            size = 0
        written = 0
        try:
            while written < len(line):
                n = os.write(self._fd, line[written:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += n
            os.fsync(self._fd)
        except OSError:
            # Not all of the line is known to be on disk: take it back whole, so that it is
            # written again later and nothing is glued onto a fragment of it.
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                self._torn = True  # cut before the next write
            raise

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        if self.backups > 0:
            for i in range(self.backups - 1, 0, -1):
                src = f"{self.path}.{i}"
                if os.path.exists(src):
                    os.replace(src, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
            # a kill mid-rotation may have left files beyond the kept number: drop the oldest
            keep = {os.path.abspath(f"{self.path}.{i}") for i in range(1, self.backups + 1)}
            for name in log_files(self.path)[:-1]:
                if os.path.abspath(name) not in keep:
                    with contextlib.suppress(OSError):
                        os.unlink(name)
        else:
            os.unlink(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(self.path)  # the renames must survive a crash too

    # ---- state -----------------------------------------------------------------------------
    def health(self) -> LogHealth:
        with self._lock:
            return LogHealth(self._errors, len(self._pending), self._dropped)

    def count_error(self) -> None:
        """Counts a failed write of a file that belongs to the log (the open-windows record)."""
        with self._lock:
            self._errors += 1

    def close(self) -> None:
        with self._lock:
            if self._pending and self._lock_fd >= 0:
                self._flush()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = -1


def _take_lock(lock_path: str) -> int:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        log = lock_path.removesuffix(".lock")
        raise WindowLogInUse(
            f"windows log {log} is in use by another process (pid {holder}); "
            "give each agent its own correlator.windows_log"
        ) from None
    except OSError:
        os.close(fd)
        raise
    # the pid is only for the message above: a full disk must not stop the agent here
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _reserve(path: str) -> bool:
    """Allocates the reserve (if it is not there already); False if the disk has no room."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
        os.fsync(fd)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # half a reserve is no use, and is taken from others
        return False
    finally:
        os.close(fd)


def _release(path: str) -> None:
    with contextlib.suppress(OSError):
        os.truncate(path, 0)


def _cut_torn_tail(fd: int) -> None:
    """Truncates the file after its last newline (a crash's partial line goes)."""
    size = os.fstat(fd).st_size
    pos = size
    while pos > 0:
        start = max(0, pos - 4096)
        block = os.pread(fd, pos - start, start)
        nl = block.rfind(b"\n")
        if nl >= 0:
            pos = start + nl + 1
            break
        pos = start
    if pos != size:
        os.ftruncate(fd, pos)
        os.fsync(fd)


def fsync_dir(path: str) -> None:
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
