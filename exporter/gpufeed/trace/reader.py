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

A gzip- or zstd-compressed trace (gpufeed.trace.source says how it is told apart), or one
read from a pipe, is streamed: decompressed in this process a chunk at a time and parsed as it comes (in
workers with `jobs`, at most `jobs + 1` chunks in flight), never decompressed whole.
"""

from __future__ import annotations

import math
import os
from array import array
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

from gpufeed.correlator.engine.node import USED_METRIC_SET, NodeSeries, put_in_order
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.feeds.labels import SeriesSyntaxError, parse_series
from gpufeed.trace.source import TraceError as TraceError  # raised here, imported from here
from gpufeed.trace.source import is_seekable_plain, open_trace

CHUNK_BYTES = 8 * 1024 * 1024
# A sample line is well under a kilobyte; one this long is not a trace, and reading it
# whole would take memory in proportion (a 200 MB line took 3 GB).
MAX_LINE_BYTES = 1024 * 1024
# Unix seconds of a recording: from 2000 to 2100. Anything else is a unit or clock error
# (0, negative, NaN, milliseconds), and analysing it would silently give no windows.
MIN_SECONDS = 946_684_800.0  # 2000-01-01
MAX_SECONDS = 4_102_444_800.0  # 2100-01-01
MILLISECONDS_FROM = 1e11  # later than the year 5000 in seconds: milliseconds


@dataclass(slots=True)
class ChunkResult:
    columns: dict[str, tuple[array[float], array[float]]] = field(default_factory=dict)
    lines: int = 0  # newline-terminated lines in the chunk
    samples: int = 0
    eof_line: int = -1  # chunk-relative 1-based line of '# EOF'
    after_eof_line: int = -1  # first non-empty line after '# EOF'
    last_line: int = 0  # last non-empty line
    error: tuple[int, str] | None = None
    blanks: int = 0  # blanks the converted lines must hold between them (the shape check)


def _metric_name(head: str) -> str:
    b = head.find("{")
    return head if b < 0 else head[:b]


class _FloatCache(dict[str, float]):
    """Timestamps repeat across every series of a snapshot: parse each text once."""

    def __missing__(self, key: str) -> float:
        v = self[key] = float(key)
        return v


def parse_chunk(
    data: bytes, validate_all: bool = False, seen: set[str] | None = None
) -> ChunkResult:
    """Groups and converts one chunk (whole lines). Errors carry chunk-relative lines.

    `seen`: series texts already found well-formed, shared by the chunks of one read so
    each distinct series is parsed once per read (the caller owns it; None: this chunk's).

    Traces are written snapshot after snapshot, so a run of snapshots with the same series
    in the same order is converted column by column with slices (no per-line Python);
    anything irregular falls back to grouping line by line, which also names bad lines.
    Lines of series the correlator does not read are checked for shape (series, value,
    timestamp); their values are parsed as numbers only with `validate_all`.
    """
    res = ChunkResult()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        res.error = (data.count(b"\n", 0, e.start) + 1, "not UTF-8 text")
        return res
    lines = LazyLines(text)  # the chunk's lines are needed only to name a bad one
    newlines = text.count("\n")
    res.lines = newlines + (0 if not text or text.endswith("\n") else 1)
    end = len(text)
    while end > 0 and text[end - 1] in " \t\r\n":  # only the trailing blanks, no copy
        end -= 1
    res.last_line = newlines - text.count("\n", end) + 1 if end else 0
    body_text, eofs = _drop_comments(text)
    if len(eofs) > 1:
        res.error = (eofs[1], "a second '# EOF'")
        return res
    if eofs:
        res.eof_line = eofs[0]
        if res.last_line > res.eof_line:
            res.after_eof_line = res.last_line
    body = body_text.split("\n")
    if body and body[-1] == "":
        body.pop()
    if "" in body:
        body = [line for line in body if line]
    tcache = _FloatCache()
    if seen is None:
        seen = set()
    if len(seen) > 500_000:  # a bound, for traces with ever-new label sets
        seen.clear()
    if not _blocks(body, lines, res, tcache, seen, validate_all):
        return res
    if body_text.count(" ") != res.blanks:
        # some line of a series we did not convert has the wrong shape: find it slowly
        res.error = _misshapen(lines.get())
        return res
    res.samples = len(body)
    return res


class LazyLines:
    """A chunk's lines, split only when an error has to be located."""

    __slots__ = ("_lines", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._lines: list[str] | None = None

    def get(self) -> list[str]:
        if self._lines is None:
            self._lines = self._text.split("\n")
        return self._lines


def _drop_comments(text: str) -> tuple[str, list[int]]:
    """The text without its comment lines (# HELP, # TYPE: a few per family), and the
    1-based line numbers of the '# EOF' lines among them."""
    pieces = []
    eofs: list[int] = []
    pos = 0  # start of the text not yet copied
    if text.startswith("#"):
        i = 0
    else:
        j = text.find("\n#")
        if j < 0:
            return text, eofs
        i = j + 1
    while i >= 0:
        pieces.append(text[pos:i])
        nl = text.find("\n", i)
        if text[i : len(text) if nl < 0 else nl] == "# EOF":
            eofs.append(text.count("\n", 0, i) + 1)
        if nl < 0:
            pos = len(text)
            break
        pos = nl + 1
        j = text.find("\n#", nl)
        i = j + 1 if j >= 0 else -1
    pieces.append(text[pos:])
    return "".join(pieces), eofs


def _ts_of(line: str) -> str:
    return line[line.rfind(" ") + 1 :]


def _add_columns(res: ChunkResult, head: str, ts: array[float], vs: array[float]) -> None:
    c = res.columns.get(head)
    if c is None:
        res.columns[head] = (ts, vs)
    else:
        c[0].extend(ts)
        c[1].extend(vs)


def _check_head(head: str, lines: LazyLines, res: ChunkResult, seen: set[str]) -> bool:
    if head in seen:
        return True
    try:
        parse_series(head)
    except SeriesSyntaxError as e:
        res.error = (_first_line(lines.get(), head), f"malformed series {head[:80]!r}: {e}")
        return False
    seen.add(head)
    return True


def _blocks(
    body: list[str],
    lines: LazyLines,
    res: ChunkResult,
    tcache: _FloatCache,
    seen: set[str],
    validate_all: bool,
) -> bool:
    n = len(body)
    pos = 0
    small = 0
    while pos < n:
        line = body[pos]
        head = line[: line.rfind(" ", 0, line.rfind(" "))]
        if head and pos + 1 < n and body[pos + 1].startswith(head + " "):
            # written series by series: convert the whole run of this series at once
            end = _run_end(body, pos, head + " ")
            if not _convert_run(body, pos, end, head, res, tcache, seen, lines, validate_all):
                if res.error is not None:
                    return False
                if not _generic(body[pos:end], lines, res, tcache, seen, validate_all):
                    return False
            pos = end
            small = 0
            continue
        t0 = _ts_of(line)
        p = 1
        while pos + p < n and _ts_of(body[pos + p]) == t0:
            p += 1
        if p < 3:
            small += 1
            if small > 8:  # not written snapshot by snapshot: group line by line
                return _generic(body[pos:], lines, res, tcache, seen, validate_all)
            # the tail of a snapshot cut by the chunk boundary, or a stray sample
            if not _generic(body[pos : pos + p], lines, res, tcache, seen, validate_all):
                return False
            pos += p
            continue
        small = 0
        heads = [line[: line.rfind(" ", 0, line.rfind(" "))] for line in body[pos : pos + p]]
        h0, hl = heads[0] + " ", heads[-1] + " "
        k = 1
        while True:
            a = pos + k * p
            if a + p > n:
                break
            first, last = body[a], body[a + p - 1]
            tl = _ts_of(last)
            if not (first.startswith(h0) and last.startswith(hl)) or _ts_of(first) != tl:
                break
            if a + p < n and _ts_of(body[a + p]) == tl:
                break
            k += 1
        end = pos + k * p
        if not _convert_block(body, pos, p, end, heads, res, tcache, seen, lines, validate_all):
            if res.error is not None:
                return False
            if not _generic(body[pos:end], lines, res, tcache, seen, validate_all):
                return False
        pos = end
    return True


def _run_end(body: list[str], pos: int, prefix: str) -> int:
    """End of the run of lines starting with `prefix` at `pos` (galloping, then bisecting)."""
    n = len(body)
    lo, step = pos, 1
    hi = pos + step
    while hi < n and body[hi].startswith(prefix):
        lo = hi
        step *= 2
        hi = pos + step
    hi = min(hi, n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if body[mid].startswith(prefix):
            lo = mid
        else:
            hi = mid
    return lo + 1


def _convert_run(
    body: list[str],
    pos: int,
    end: int,
    head: str,
    res: ChunkResult,
    tcache: _FloatCache,
    seen: set[str],
    lines: LazyLines,
    validate_all: bool,
) -> bool:
    """Converts one series' run of lines; False (no error set) if it is not one clean run."""
    if not _check_head(head, lines, res, seen):
        return False
    k = end - pos
    used = _metric_name(head) in USED_METRIC_SET
    if not used and not validate_all:
        res.blanks += (head.count(" ") + 2) * k  # shape: checked with the chunk's total
        return True
    joined = "\n".join(body[pos:end])
    if " " in head or "\t" in head:
        parts = joined.replace(head + " ", "").split()
        if len(parts) != 2 * k:
            return False
        vparts, tparts = parts[0::2], parts[1::2]
    else:
        parts = joined.split()
        if len(parts) != 3 * k or parts[0::3].count(head) != k:
            return False
        vparts, tparts = parts[1::3], parts[2::3]
    try:
        ts = array("d", map(tcache.__getitem__, tparts))
        vs = array("d", map(float, vparts))
    except ValueError:
        return False
    if used:
        _add_columns(res, head, ts, vs)
    res.blanks += (head.count(" ") + 2) * k
    return True


def _convert_block(
    body: list[str],
    pos: int,
    p: int,
    end: int,
    heads: list[str],
    res: ChunkResult,
    tcache: _FloatCache,
    seen: set[str],
    lines: LazyLines,
    validate_all: bool,
) -> bool:
    """Converts a regular block; False (no error set) when it turns out irregular."""
    k = (end - pos) // p
    ts_text: list[str] | None = None
    ts: array[float] | None = None
    out: list[tuple[str, array[float]]] = []
    # every line holds its head's blanks plus exactly two; the chunk's total is checked
    # once at the end, so lines not converted here are checked for shape too
    blanks = sum(h.count(" ") + 2 for h in heads) * k
    for i, head in enumerate(heads):
        if not _check_head(head, lines, res, seen):
            return False
        if not validate_all and i > 0 and _metric_name(head) not in USED_METRIC_SET:
            continue  # not read by the correlator: the shape check above is enough
        joined = "\n".join(body[pos + i : end : p])
        if " " in head or "\t" in head:  # a label value with blanks: cut the head out
            parts = joined.replace(head + " ", "").split()
            if len(parts) != 2 * k:
                return False
            vparts, tparts = parts[0::2], parts[1::2]
        else:  # split all three fields in C; every first field must be the head
            parts = joined.split()
            if len(parts) != 3 * k or parts[0::3].count(head) != k:
                return False
            vparts, tparts = parts[1::3], parts[2::3]
        if ts_text is None:
            ts_text = tparts
            try:
                ts = array("d", map(tcache.__getitem__, tparts))
            except ValueError:
                return False
        elif tparts != ts_text:
            return False
        if validate_all or _metric_name(head) in USED_METRIC_SET:
            try:
                vs = array("d", map(float, vparts))
            except ValueError:
                return False
            out.append((head, vs))
    assert ts is not None
    for head, vs in out:
        if _metric_name(head) in USED_METRIC_SET:
            _add_columns(res, head, array("d", ts), vs)
    res.blanks += blanks
    return True


def _generic(
    body: list[str],
    lines: LazyLines,
    res: ChunkResult,
    tcache: _FloatCache,
    seen: set[str],
    validate_all: bool,
) -> bool:
    """Line-by-line grouping by series text; sets `res.error` on the first bad line."""
    groups: dict[str, list[str]] = {}
    get = groups.get
    for line in body:
        head = line[: line.rfind(" ", 0, line.rfind(" "))]
        g = get(head)
        if g is not None:
            g.append(line)
            continue
        if line.count(" ") < 2 or not head:
            res.error = (
                lines.get().index(line) + 1,
                "expected 'series value timestamp' (every sample needs a timestamp)",
            )
            return False
        groups[head] = [line]
    for head, group in groups.items():
        if not _check_head(head, lines, res, seen):
            return False
        parts = "\n".join(group).replace(head + " ", "").split()
        if len(parts) != 2 * len(group):
            res.error = _locate(lines.get(), head)
            return False
        used = _metric_name(head) in USED_METRIC_SET
        try:
            ts = array("d", map(tcache.__getitem__, parts[1::2]))
            vs = array("d", map(float, parts[0::2])) if used or validate_all else None
        except ValueError:
            res.error = _locate(lines.get(), head)
            return False
        if used and vs is not None:
            _add_columns(res, head, ts, vs)
        res.blanks += (head.count(" ") + 2) * len(group)
    return True


def _misshapen(lines: list[str]) -> tuple[int, str]:
    """The first line that is not 'series value timestamp' (series text has its own blanks)."""
    for n, line in enumerate(lines):
        if not line or line[0] == "#":
            continue
        cut = line.rfind(" ", 0, line.rfind(" "))
        head = line[:cut] if cut > 0 else line
        closing = head.rfind("}")
        if (
            cut <= 0
            or ("{" in head and closing != len(head) - 1)
            or line.count(" ") != head.count(" ") + 2
        ):
            return n + 1, "expected 'series value timestamp' (every sample needs a timestamp)"
    return 1, "malformed sample"


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
    """Chunks of whole lines; a line longer than MAX_LINE_BYTES is a TraceError."""
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
                rest = f.readline(MAX_LINE_BYTES)
                if len(rest) == MAX_LINE_BYTES and not rest.endswith(b"\n"):
                    raise TraceError(
                        f"{path}:{_line_at(f, end)}: a line longer than {MAX_LINE_BYTES} "
                        "bytes: not a trace"
                    )
                end += len(rest)
            bounds.append((start, end))
            start = end
    return bounds


def _line_at(f: BinaryIO, offset: int) -> int:
    """The 1-based line holding byte `offset`, counted in bounded pieces."""
    f.seek(0)
    lines, pos = 1, 0
    while pos < offset:
        block = f.read(min(CHUNK_BYTES, offset - pos))
        if not block:
            break
        lines += block.count(b"\n")
        pos += len(block)
    return lines


def _bad_timestamp(path: str) -> str:
    """`path:line: why` for the first sample whose timestamp is not unix seconds 2000-2100."""
    with open_trace(path) as f:
        n = 0
        while line := f.readline(MAX_LINE_BYTES):
            n += 1
            if line.startswith(b"#") or not line.strip():
                continue
            tok = line.rsplit(None, 1)[-1].decode("utf-8", "replace")
            try:
                t = float(tok)
            except ValueError:
                continue
            if not MIN_SECONDS <= t < MAX_SECONDS:  # NaN fails this too
                ms = math.isfinite(t) and t >= MILLISECONDS_FROM
                hint = " (milliseconds? traces carry seconds)" if ms else ""
                return (
                    f"{path}:{n}: timestamp {tok[:40]!r} is not unix seconds between 2000 and "
                    f"2100{hint}"
                )
    return f"{path}: a timestamp is not unix seconds between 2000 and 2100"


def _read_and_parse(args: tuple[str, int, int, bool], seen: set[str] | None = None) -> ChunkResult:
    path, start, end, validate_all = args
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return parse_chunk(data, validate_all, seen)


def _stream_pieces(path: str) -> Iterator[bytes]:
    """A compressed (or piped) trace's text in chunks of whole lines, decompressed as they are read;
    a line longer than MAX_LINE_BYTES is a TraceError, as in a plain file."""
    lines = 0  # newlines before this chunk: the line number of a too-long line
    with open_trace(path) as f:
        while data := f.read(CHUNK_BYTES):
            if not data.endswith(b"\n"):
                rest = f.readline(MAX_LINE_BYTES)
                if len(rest) == MAX_LINE_BYTES and not rest.endswith(b"\n"):
                    at = lines + data.count(b"\n") + 1
                    raise TraceError(
                        f"{path}:{at}: a line longer than {MAX_LINE_BYTES} bytes: not a trace"
                    )
                data += rest
            lines += data.count(b"\n")
            yield data


def _iter_stream(path: str, jobs: int, validate_all: bool) -> Iterator[ChunkResult]:
    """The chunks of a compressed trace: parsed here, or by `jobs` workers with a bounded
    number of chunks in flight (the decompressed text never all in memory)."""
    if jobs <= 1:
        seen: set[str] = set()
        for data in _stream_pieces(path):
            yield parse_chunk(data, validate_all, seen)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        flight: deque[Future[ChunkResult]] = deque()
        for data in _stream_pieces(path):
            flight.append(pool.submit(parse_chunk, data, validate_all))
            if len(flight) > jobs:
                yield flight.popleft().result()
        while flight:
            yield flight.popleft().result()


def iter_chunks(path: str, jobs: int, validate_all: bool = False) -> Iterator[ChunkResult]:
    """The trace's chunks, parsed, in order; a compressed trace (or a pipe) streamed."""
    if not is_seekable_plain(path):
        yield from _iter_stream(path, jobs, validate_all)
        return
    bounds = _chunk_bounds(path, jobs)
    tasks = [(path, s, e, validate_all) for s, e in bounds]
    if jobs <= 1 or len(tasks) <= 1:
        seen: set[str] = set()  # this read's well-formed series, across its chunks
        for t in tasks:
            yield _read_and_parse(t, seen)
        return
    # in parallel each chunk checks its own series (a chunk is a worker's whole share)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(_read_and_parse, tasks)


@dataclass(slots=True)
class Trace:
    nodes: dict[str, NodeSeries]
    samples: int
    lines: int


def read_trace(path: str, jobs: int = 1, validate_all: bool = False) -> Trace:
    """Parses a whole trace (plain, .gz or .zst) into per-node columns, or raises
    TraceError (file:line: why)."""
    nodes: dict[str, NodeSeries] = {}
    routes: dict[str, Series | None] = {}
    line0 = 0
    samples = 0
    eof_line = -1
    last_line = 0
    pending: dict[int, tuple[Series, array[float], array[float]]] = {}
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
            if head in routes:
                s = routes[head]
            else:
                name, labels = parse_series(head)
                inst = labels.pop("instance", "")
                node = nodes.get(inst)
                if node is None:
                    node = put_in_order(nodes, inst, NodeSeries(inst))
                s = routes[head] = node.route(name, labels)
            if s is None:
                continue
            got = pending.get(id(s))
            if got is not None:
                got[1].extend(ts)
                got[2].extend(vs)
            else:
                pending[id(s)] = (s, ts, vs)
        line0 += res.lines
        samples += res.samples
    if eof_line < 0:
        where = f"{path}:{max(last_line, 1)}"
        raise TraceError(f"{where}: the trace ends without '# EOF' (truncated?)")
    for s, ts, vs in pending.values():
        # sum() is not finite if any timestamp is NaN or infinite
        if ts and (not math.isfinite(sum(ts)) or min(ts) < MIN_SECONDS or max(ts) >= MAX_SECONDS):
            raise TraceError(_bad_timestamp(path))
        s.extend_sorted(ts, vs)
    return Trace(nodes, samples, line0)
