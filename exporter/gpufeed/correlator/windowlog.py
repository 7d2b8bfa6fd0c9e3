"""The durable log of closed windows: JSON lines, fsynced, rotated by size.

Each window is one line written with a single `write` on an O_APPEND descriptor and
fsynced before `append` returns, so a `kill -9` can at worst lose the window being
written, never corrupt an earlier line; a torn last line (power loss mid-write) is
skipped by `read_log`, and terminated when the log is next opened, so that the first
window appended after the restart is not glued onto it and lost with it. When the file would exceed `max_bytes`, it is rotated like
logrotate does: `windows.jsonl` -> `.1` -> `.2` ... keeping `backups` old files.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator

from gpufeed.correlator.window import Window


class WindowLog:
    def __init__(self, path: str, max_bytes: int = 16 * 1024 * 1024, backups: int = 3) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self._fd = self._open()
        self._end_torn_line()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _end_torn_line(self) -> None:
        """Ends an incomplete last line left by a crash with a newline of its own."""
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
        os.write(self._fd, b"\n")
        os.fsync(self._fd)

    def append(self, window: Window) -> None:
        line = (json.dumps(window.to_json()) + "\n").encode()
        with self._lock:
            size = os.fstat(self._fd).st_size
            if size > 0 and size + len(line) > self.max_bytes:
                self._rotate()
            os.write(self._fd, line)
            os.fsync(self._fd)

    def _rotate(self) -> None:
        os.close(self._fd)
        if self.backups > 0:
            for i in range(self.backups - 1, 0, -1):
                src = f"{self.path}.{i}"
                if os.path.exists(src):
                    os.replace(src, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._fd = self._open()
        # the directory entry changes must survive a crash too
        dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_log(path: str, include_backups: bool = True) -> Iterator[Window]:
    """Windows from the log, oldest first; a torn (incomplete) last line is skipped."""
    files = [path]
    if include_backups:
        i = 1
        while os.path.exists(f"{path}.{i}"):
            files.insert(0, f"{path}.{i}")
            i += 1
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if not line.endswith("\n"):
                        break  # torn by a crash mid-write
                    try:
                        yield Window.from_json(json.loads(line))
                    except (ValueError, KeyError, TypeError):
                        continue
        except FileNotFoundError:
            continue
