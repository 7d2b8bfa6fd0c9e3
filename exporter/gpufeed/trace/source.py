"""The one place that opens a trace file: plain, gzip- or zstd-compressed, told apart by
their first bytes (a gzip file named `.om` reads; a plain file named `.gz` is refused).

A compressed trace is decompressed as it is read, a bounded piece at a time, never
whole into memory: recordings are stored compressed (the lab's fixtures, `--record`
files rotated by logrotate) and run to gigabytes uncompressed. zstd needs the
`zstandard` package, which gpufeed does not depend on: without it a `.zst` trace is a
one-line error saying how to decompress it.

A stream that turns out truncated or corrupt part way is a `TraceError` naming the
file, never a traceback from the decompressor.
"""

from __future__ import annotations

import gzip
import importlib
import io
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import BinaryIO, Protocol

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Formats recognised only to say so: a trace in them is not read (decompress it first).
UNREAD_MAGIC = {b"BZh": ("bzip2", "bunzip2"), b"\xfd7zXZ\x00": ("xz", "unxz")}
# The suffix each format goes by: a file named so but not in it is refused.
SUFFIXES = {".gz": "gzip", ".zst": "zstd"}
READ_BYTES = 1024 * 1024  # what one read pulls from the decompressor (bounded memory)


class TraceError(ValueError):
    """A malformed, truncated or unreadable trace; the message names the file (and line)."""


def compression_of(path: str) -> str | None:
    """ "gzip", "zstd", or None for a plain file, from the file's first bytes; a TraceError
    for a format that is not read, or a name that promises compression the bytes lack.
    Opens the file once more: for a regular file only (a pipe's bytes would be lost)."""
    with open(path, "rb") as f:
        return _format(path, f.peek(8)[:8])


def is_seekable_plain(path: str) -> bool:
    """A regular, uncompressed file: one that can be read in parallel at byte offsets."""
    return os.path.isfile(path) and compression_of(path) is None


def _format(path: str, head: bytes) -> str | None:
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    for magic, (fmt, tool) in UNREAD_MAGIC.items():
        if head.startswith(magic):
            raise TraceError(f"{path}: {fmt}-compressed, not read: `{tool} {path}` first")
    for suffix, fmt in SUFFIXES.items():
        if path.endswith(suffix):
            raise TraceError(f"{path}: named {suffix} but not {fmt}-compressed")
    return None


@contextmanager
def open_trace(path: str) -> Iterator[BinaryIO]:
    """The trace's bytes, decompressed as they are read (a file or a pipe: `zstd -dc X |
    gpufeed analyze /dev/stdin`; the format is peeked at, not consumed). Reads past a
    truncated or corrupt compressed stream raise TraceError naming the file."""
    with open(path, "rb") as raw:
        fmt = _format(path, raw.peek(8)[:8])
        if fmt is None:
            yield raw
            return
        zstd = _zstandard(path) if fmt == "zstd" else None
        inner: _Stream
        if zstd is not None:
            inner = zstd.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        else:
            inner = gzip.GzipFile(fileobj=raw, mode="rb")
        checked = _Checked(inner, path, fmt, () if zstd is None else (zstd.ZstdError,))
        with io.BufferedReader(checked, READ_BYTES) as f:
            yield f


def _zstandard(path: str) -> ModuleType:
    try:
        return importlib.import_module("zstandard")
    except ImportError:
        raise TraceError(
            f"{path}: zstd-compressed, and the zstandard package is not installed: "
            f"`zstd -d {path}` first, or pipe it (`zstd -dc {path} | gpufeed analyze "
            "/dev/stdin`), or `pip install zstandard`"
        ) from None


class _Stream(Protocol):
    """What a decompressor gives: gzip.GzipFile, zstandard's stream reader."""

    def readinto(self, buffer: memoryview, /) -> int: ...

    def close(self) -> None: ...


class _Checked(io.RawIOBase):
    """A decompressing stream whose errors name the file (TraceError), for BufferedReader."""

    def __init__(
        self, inner: _Stream, path: str, fmt: str, errors: tuple[type[Exception], ...]
    ) -> None:
        self._inner = inner
        self._path = path
        self._fmt = fmt
        # a cut stream (EOFError), a bad deflate block (zlib.error), a bad CRC or trailer
        self._errors: tuple[type[Exception], ...] = (
            EOFError,
            zlib.error,
            gzip.BadGzipFile,
            *errors,
        )

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        try:
            return self._inner.readinto(buffer)
        except self._errors as exc:
            raise TraceError(
                f"{self._path}: the {self._fmt} stream is truncated or corrupt ({exc})"
            ) from None

    def close(self) -> None:
        self._inner.close()
        super().close()
