"""A fast reader for the contract's trace format: OpenMetrics text, a timestamp on every
sample, `# EOF` at the end, several nodes told apart by `instance`.

Speed comes from doing per line only what must be done per line: the file is read in
large chunks, lines are grouped by their series text with one dict lookup (the series text
is everything before the last two spaces), and each group is converted to float columns in
C-level bulk calls (join, split, map(float)). Label sets are parsed once per distinct
series. Only when a chunk does not convert cleanly is it re-read line by line, to name the
first bad line. Chunks can be parsed in worker processes (`jobs`).

A file that does not end in `# EOF` is truncated: that is an error naming the last line,
never a quietly shorter analysis.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from gpufeed.correlator.labels import SeriesSyntaxError, parse_series
from gpufeed.correlator.node import USED_METRIC_SET, NodeSeries

CHUNK_BYTES = 32 * 1024 * 1024


class TraceError(ValueError):
    """A malformed or truncated trace; the message names the file and line."""


@dataclass(slots=True)
class ChunkResult:
    columns: dict[str, tuple[array[float], array[float]]] = field(default_factory=dict)
    lines: int = 0  # newline-terminated lines in the chunk
    samples: int = 0
    eof_line: int = -1  # chunk-relative 1-based line of '# EOF'
    after_eof_line: int = -1  # first non-empty line after '# EOF'
    last_line: int = 0  # last non-empty line
    error: tuple[int, str] | None = None


def _metric_name(head: str) -> str:
    b = head.find("{")
    return head if b < 0 else head[:b]


class _FloatCache(dict[str, float]):
    """Timestamps repeat across every series of a snapshot: parse each text once."""

    def __missing__(self, key: str) -> float:
        v = self[key] = float(key)
        return v


def parse_chunk(data: bytes, validate_all: bool = True) -> ChunkResult:
    """Groups and converts one chunk (whole lines). Errors carry chunk-relative lines."""
    res = ChunkResult()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        res.error = (line, "not UTF-8 text")
        return res
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    res.lines = len(lines)
    groups: dict[str, list[str]] = {}
    get = groups.get
    eof_at = -1
    for n, line in enumerate(lines):
        head = line[: line.rfind(" ", 0, line.rfind(" "))]
        g = get(head)
        if g is not None:
            g.append(line)
            continue
        if not line or line[0] == "#":
            if line == "# EOF":
                if eof_at >= 0:
                    res.error = (n + 1, "a second '# EOF'")
                    return res
                eof_at = n
            continue
        if line.count(" ") < 2 or not head:
            res.error = (n + 1, "expected 'series value timestamp' (every sample needs a timestamp)")
            return res
        groups[head] = [line]
    if eof_at >= 0:
        res.eof_line = eof_at + 1
        for n in range(eof_at + 1, len(lines)):
            if lines[n].strip():
                res.after_eof_line = n + 1
                break
    for n in range(len(lines) - 1, -1, -1):
        if lines[n].strip():
            res.last_line = n + 1
            break
    tcache = _FloatCache()
    for head, group in groups.items():
        try:
            parse_series(head)
        except SeriesSyntaxError as e:
            res.error = (_first_line(lines, head), f"malformed series {head[:80]!r}: {e}")
            return res
        used = _metric_name(head) in USED_METRIC_SET
        if not used and not validate_all:
            res.samples += len(group)
            continue
        parts = "\n".join(group).replace(head + " ", "").split()
        if len(parts) != 2 * len(group):
            res.error = _locate(lines, head)
            return res
        try:
            vs = array("d", map(float, parts[0::2]))
            ts = array("d", map(tcache.__getitem__, parts[1::2]))
        except ValueError:
            res.error = _locate(lines, head)
            return res
        res.samples += len(group)
        if used:
            res.columns[head] = (ts, vs)
    return res


def _first_line(lines: list[str], head: str) -> int:
    for n, line in enumerate(lines):
        if line.startswith(head + " ") or line == head:
            return n + 1
    return 1


def _locate(lines: list[str], head: str) -> tuple[int, str]:
    """The first line of `head`'s group that does not parse, and why (the slow path)."""
    prefix = head + " "
    for n, line in enumerate(lines):
        if not line.startswith(prefix):
            continue
        rest = line[len(prefix) :].split()
        if len(rest) != 2:
            return n + 1, "expected 'series value timestamp' (every sample needs a timestamp)"
        for what, tok in (("value", rest[0]), ("timestamp", rest[1])):
            try:
                float(tok)
            except ValueError:
                return n + 1, f"{what} {tok[:40]!r} is not a number"
    return _first_line(lines, head), "malformed sample"


def _chunk_bounds(path: str, parts: int) -> list[tuple[int, int]]:
    size = os.path.getsize(path)
    if size == 0:
        return []
    step = max(CHUNK_BYTES if parts <= 1 else size // parts + 1, 1)
    step = min(step, CHUNK_BYTES)
    bounds = []
    with open(path, "rb") as f:
        start = 0
        while start < size:
            end = min(start + step, size)
            if end < size:
                f.seek(end)
                rest = f.readline()
                end += len(rest)
            bounds.append((start, end))
            start = end
    return bounds


def _read_and_parse(args: tuple[str, int, int, bool]) -> ChunkResult:
    path, start, end, validate_all = args
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return parse_chunk(data, validate_all)


def iter_chunks(path: str, jobs: int, validate_all: bool) -> Iterator[ChunkResult]:
    bounds = _chunk_bounds(path, jobs)
    tasks = [(path, s, e, validate_all) for s, e in bounds]
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            yield _read_and_parse(t)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(_read_and_parse, tasks)


@dataclass(slots=True)
class Trace:
    nodes: dict[str, NodeSeries]
    samples: int
    lines: int


def read_trace(path: str, jobs: int = 1, validate_all: bool = True) -> Trace:
    """Parses a whole trace into per-node columns, or raises TraceError (file:line: why)."""
    nodes: dict[str, NodeSeries] = {}
    routes: dict[str, tuple[NodeSeries, object] | None] = {}
    line0 = 0
    samples = 0
    eof_line = -1
    last_line = 0
    pending: dict[int, tuple[array[float], array[float]]] = {}
    for res in iter_chunks(path, jobs, validate_all):
        if res.error is not None:
            rel, msg = res.error
            raise TraceError(f"{path}:{line0 + rel}: {msg}")
        if eof_line >= 0 and res.last_line:
            raise TraceError(f"{path}:{line0 + res.last_line}: data after '# EOF'")
        if res.eof_line >= 0:
            if res.after_eof_line >= 0:
                raise TraceError(f"{path}:{line0 + res.after_eof_line}: data after '# EOF'")
            eof_line = line0 + res.eof_line
        if res.last_line:
            last_line = line0 + res.last_line
        for head, (ts, vs) in res.columns.items():
            route = routes.get(head, False)
            if route is False:
                name, labels = parse_series(head)
                inst = labels.pop("instance", "")
                node = nodes.get(inst)
                if node is None:
                    node = nodes[inst] = NodeSeries(inst)
                s = node.route(name, labels)
                route = routes[head] = None if s is None else (node, s)
            if route is None:
                continue
            s = route[1]
            key = id(s)
            if key in pending:
                pts, pvs = pending[key]
                pts.extend(ts)
                pvs.extend(vs)
            else:
                pending[key] = (ts, vs)
        line0 += res.lines
        samples += res.samples
    if eof_line < 0:
        where = f"{path}:{max(last_line, 1)}"
        raise TraceError(f"{where}: the trace ends without '# EOF' (truncated?)")
    for route in routes.values():
        if route is None:
            continue
        s = route[1]
        cols = pending.pop(id(s), None)
        if cols is not None:
            s.extend_sorted(*cols)  # type: ignore[attr-defined]
    return Trace(nodes, samples, line0)
