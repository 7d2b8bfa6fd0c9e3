"""`--record FILE`: every snapshot, as the contract's trace format (OpenMetrics + timestamps).

Layout on disk, for `--record trace.om`:
- `trace.om.spool/`: the segment being recorded, one spool file per family (see
  `gpufeed.trace.format`), flushed after every snapshot.
- `trace.part-000001.om`, ...: finished segments, each a complete, valid trace on its own
  (`# EOF` included), written every `segment_seconds` (default one hour).
- `trace.om`: on clean shutdown, every segment merged family by family into one trace;
  the parts and the spool are then removed.

A crash (kill -9, power loss) leaves the finished parts, each valid, and the spool of the
unfinished segment, which is complete up to its last whole line. `finalize_recording`
(run automatically when a recorder starts on the same path) turns leftovers into one
trace, so at most the samples of a line being written are lost.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

from gpufeed.logonce import LogOnce
from gpufeed.model import Family
from gpufeed.snapshot import Snapshot
from gpufeed.trace.format import (
    DROPPED_SAMPLES,
    DROPPED_SAMPLES_HELP,
    Block,
    FamilySpool,
    assemble_spool,
    index_trace,
    merge_segments,
    om_base_name,
    om_header,
    om_labels,
    om_timestamp,
    om_value,
)

log = logging.getLogger(__name__)


def _part_path(path: Path, n: int) -> Path:
    return path.with_name(f"{path.stem}.part-{n:06d}{path.suffix}")


def _parts(path: Path) -> list[Path]:
    pat = re.compile(re.escape(path.stem) + r"\.part-(\d{6})" + re.escape(path.suffix) + "$")
    found = [p for p in path.parent.glob(f"{path.stem}.part-*") if pat.match(p.name)]
    return sorted(found)


def _spools(path: Path) -> list[Path]:
    """Spool directories in time order: sealed ones (`.spool.000003`), then the current one."""
    found = [p for p in path.parent.glob(path.name + ".spool*") if p.is_dir()]
    return sorted(found, key=lambda p: (p.name == path.name + ".spool", p.name))


def finalize_recording(path: str | Path, out: str | Path | None = None) -> Path | None:
    """Turns what a recorder left on disk (parts, spools) into one complete trace.

    Returns the trace written (`out`, default `path`), or None when nothing was left.
    """
    path = Path(path)
    target = Path(out) if out is not None else path
    parts = _parts(path)
    spools = _spools(path)
    if not parts and not spools:
        return None
    n = len(parts)
    for spool in spools:
        n += 1
        part = _part_path(path, n)
        while part.exists():
            n += 1
            part = _part_path(path, n)
        assemble_spool(spool, part)
        FamilySpool(spool).remove()
        parts.append(part)
    merge_segments([index_trace(p) for p in parts], target)
    for p in parts:
        p.unlink(missing_ok=True)
    return target


class TraceRecorder:
    """A `Sink` that records every snapshot; see the module docstring for the files."""

    name = "recorder"

    def __init__(
        self,
        path: str | Path,
        *,
        segment_seconds: float = 3600.0,
        instance: str | None = None,
    ) -> None:
        self.path = Path(path)
        if segment_seconds <= 0:
            raise ValueError("segment_seconds must be positive")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if _parts(self.path) or _spools(self.path):
            recovered = self.path.with_name(
                f"{self.path.stem}.recovered-{int(time.time())}{self.path.suffix}"
            )
            finalize_recording(self.path, recovered)
            log.warning("an earlier recording was not closed cleanly: recovered to %s", recovered)
        self._segment_seconds = segment_seconds
        self._extra = (("instance", instance),) if instance else ()
        self._spool_dir = self.path.with_name(self.path.name + ".spool")
        self._spool = FamilySpool(self._spool_dir)
        self._segments: list[dict[str, Block]] = []
        self._segment_start: float | None = None
        self._last_ts = float("-inf")
        self._has_data = False
        self._lock = threading.Lock()
        self._assembler: threading.Thread | None = None
        self._closed = False
        self._failed = False
        # Samples that could not be formatted, per family: written into the trace (so that
        # analysing it says it is incomplete) and logged once per family, not per second.
        self._dropped: dict[str, int] = {}
        self._dropped_log = LogOnce(log)

    @property
    def segments_written(self) -> int:
        return len(self._segments)

    def write(self, snapshot: Snapshot) -> None:
        with self._lock:
            if self._closed or self._failed:
                return
            try:
                self._write(snapshot)
            except OSError as exc:
                # Disk full, or the directory is gone: stop here, so that what is on disk
                # ends at most in one torn line, which recovery drops. One log line.
                self._failed = True
                log.error("recording to %s stopped: %s", self.path, exc)

    def _write(self, snapshot: Snapshot) -> None:
        ts = snapshot.timestamp_seconds
        if ts <= self._last_ts:
            return  # a series' samples must have strictly increasing timestamps
        self._last_ts = ts
        if self._segment_start is None:
            self._segment_start = ts
        elif ts - self._segment_start >= self._segment_seconds and self._has_data:
            self._rotate()
            self._segment_start = ts
        suffix = " " + om_timestamp(ts) + "\n"
        for fam in snapshot.families:
            if not fam.samples:
                continue
            text = self._family_lines(fam, suffix)
            if text:
                key = om_base_name(fam.name, fam.type)
                self._spool.append(key, om_header(fam.name, fam.type, fam.help), text)
                self._has_data = True
        if self._dropped:
            extra = self._extra
            text = "".join(
                f"{DROPPED_SAMPLES}{om_labels((('family', name), *extra))} {n}{suffix}"
                for name, n in sorted(self._dropped.items())
            )
            key = om_base_name(DROPPED_SAMPLES, "counter")
            self._spool.append(
                key, om_header(DROPPED_SAMPLES, "counter", DROPPED_SAMPLES_HELP), text
            )
        self._spool.flush()

    def _family_lines(self, fam: Family, suffix: str) -> str:
        """The family's sample lines; a sample that cannot be written is left out and
        counted, and the family's other samples and the families after it still are."""
        extra = self._extra
        try:
            return "".join(
                f"{s.name}{om_labels(s.labels + extra)} {om_value(s.value)}{suffix}"
                for s in fam.samples
            )
        except Exception:
            pass
        lines = []
        for s in fam.samples:
            try:
                lines.append(f"{s.name}{om_labels(s.labels + extra)} {om_value(s.value)}{suffix}")
            except Exception as exc:
                self._dropped_log.log(
                    logging.ERROR,
                    fam.name,
                    "recording to %s: samples of %s left out (%s: %s); counted in the "
                    "trace as %s, logged once",
                    self.path,
                    fam.name,
                    type(exc).__name__,
                    exc,
                    DROPPED_SAMPLES,
                )
                self._dropped[fam.name] = self._dropped.get(fam.name, 0) + 1
        return "".join(lines)

    def _rotate(self) -> None:
        """Seals the current spool as a numbered part, assembled in the background."""
        self._spool.close()
        n = len(self._segments) + 1
        sealed = self._spool_dir.with_name(f"{self._spool_dir.name}.{n:06d}")
        self._spool_dir.rename(sealed)
        self._join_assembler()
        part = _part_path(self.path, n)
        blocks: dict[str, Block] = {}
        self._segments.append(blocks)

        def assemble() -> None:
            try:
                blocks.update(assemble_spool(sealed, part))
                FamilySpool(sealed).remove()
            except OSError as exc:  # the sealed spool stays on disk for recovery
                self._failed = True
                log.error("sealing a segment of %s failed: %s", self.path, exc)

        self._assembler = threading.Thread(target=assemble, name="recorder-segment", daemon=True)
        self._assembler.start()
        self._spool = FamilySpool(self._spool_dir)
        self._has_data = False

    def _join_assembler(self) -> None:
        if self._assembler is not None:
            self._assembler.join()
            self._assembler = None

    def close(self) -> None:
        """Seals the last segment and merges every part into the final trace."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._has_data and not self._failed:
                    self._rotate()
                self._join_assembler()
                if self._failed:  # put what is on disk together, as after a crash
                    self._spool.close()
                    finalize_recording(self.path)
                    return
                self._spool.remove()
                if self._segments:
                    merge_segments(self._segments, self.path)
                    for n in range(1, len(self._segments) + 1):
                        _part_path(self.path, n).unlink(missing_ok=True)
                    log.info("recording written to %s", self.path)
            except OSError as exc:
                log.error("finishing the recording %s failed: %s (parts are kept)", self.path, exc)
