"""Merging sorted windows files (the batches of a streamed run, the shards of a split one).

`gpufeed analyze` writes windows sorted by (instance, GPU, job, start), and every instance
is analysed in exactly one batch of exactly one shard. So the windows of N shards, merged
line by line in that order, are byte for byte the windows of the unsplit run; the merge
holds one line per input in memory, whatever the sizes.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Sequence
from typing import IO, Any

from gpufeed.correlator.engine.window import Window

SortKey = tuple[str, tuple[int, str], str, float]


class MergeError(ValueError):
    """An input that cannot be merged: not windows, not sorted, or overlapping another."""


def gpu_key(gpu: str) -> tuple[int, str]:
    """GPUs in numeric order, a CPU-only job's "" after them."""
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def window_key(w: Window) -> SortKey:
    return (w.instance, gpu_key(w.gpu), w.job_id, w.start_seconds)


def _line_key(d: Any) -> SortKey:
    if not isinstance(d, dict):
        raise TypeError("not a JSON object")
    return (str(d["instance"]), gpu_key(str(d["gpu"])), str(d["job_id"]), float(d["start"]))


def _keyed(path: str, f: IO[str], owner: dict[str, str]) -> Iterator[tuple[SortKey, str]]:
    prev: SortKey | None = None
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            key = _line_key(json.loads(line))
        except (ValueError, KeyError, TypeError) as e:
            raise MergeError(f"{path}:{n}: not a window ({e})") from None
        if prev is not None and key < prev:
            raise MergeError(f"{path}:{n}: windows are not in order (instance, gpu, job, start)")
        if prev is None or key[0] != prev[0]:
            other = owner.setdefault(key[0], path)
            if other != path:
                raise MergeError(
                    f"{path}:{n}: instance {key[0]!r} is also in {other}: "
                    "merge the shards of one run (each instance is in one shard)"
                )
        prev = key
        yield key, line if line.endswith("\n") else line + "\n"


def merge_files(paths: Sequence[str], out: IO[str]) -> int:
    """Writes the windows of `paths` (each sorted) to `out` in order; returns how many.
    Raises MergeError (or OSError) naming the file and line at fault."""
    files: list[IO[str]] = []
    try:
        for p in paths:
            files.append(open(p, encoding="utf-8"))  # noqa: SIM115 (closed below)
    except OSError as e:
        for f in files:
            f.close()
        raise MergeError(f"{e.filename}: {e.strerror or e}") from None
    owner: dict[str, str] = {}
    n = 0
    try:
        streams = [_keyed(p, f, owner) for p, f in zip(paths, files, strict=True)]
        for _, line in heapq.merge(*streams, key=lambda kl: kl[0]):
            out.write(line)
            n += 1
    finally:
        for f in files:
            f.close()
    return n
