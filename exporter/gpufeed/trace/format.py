"""Writing the contract's trace format: OpenMetrics text with a timestamp on every sample.

OpenMetrics wants each metric family's samples in one contiguous block, headed by its
`# HELP`/`# TYPE`, and the file to end in `# EOF`. Samples arrive the other way round
(time after time, every family each time), so a writer cannot simply append. `FamilySpool`
appends each family's lines to its own spool file, which starts with the family's header,
and `assemble` concatenates the spools in first-seen order and adds `# EOF`. A spool
directory left by a crash is therefore still complete up to its last whole line.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpufeed.model import LabelPairs, MetricType

EOF_LINE = "# EOF\n"
_COPY_CHUNK = 1 << 20


def om_base_name(name: str, type_: MetricType) -> str:
    """The OpenMetrics family name: a counter's `_total` belongs to its samples only."""
    if type_ == "counter" and name.endswith("_total"):
        return name[: -len("_total")]
    return name


def om_header(name: str, type_: MetricType, help_: str) -> str:
    base = om_base_name(name, type_)
    om_type = "gauge" if type_ == "info" else type_  # model info families are 1-valued gauges
    text = help_.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {base} {text}\n# TYPE {base} {om_type}\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def om_labels(labels: LabelPairs) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


# A trace-only family the recorder adds when it had to leave samples out (absent when it
# left none out): `gpufeed analyze` reads it and says the trace is incomplete.
DROPPED_SAMPLES = "gpufeed_trace_dropped_samples_total"
DROPPED_SAMPLES_HELP = "Samples the recorder could not write into this trace, per family."


def om_value(v: float) -> str:
    """A sample value as OpenMetrics text; collectors hand over ints as well as floats.

    `int.is_integer` exists only from Python 3.12 on, so ints are handled by type; bool
    is an int too and becomes 0/1.
    """
    if isinstance(v, int):
        return str(int(v))
    v = float(v)
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def om_timestamp(ts: float) -> str:
    """Seconds since the epoch, as OpenMetrics wants (millisecond precision at most)."""
    if float(ts).is_integer():
        return str(int(ts))
    return f"{ts:.3f}".rstrip("0").rstrip(".")


@dataclass
class FamilySpool:
    """One spool file per family in `directory`; numbered in first-seen order."""

    directory: Path
    _files: dict[str, IO[str]] = field(default_factory=dict)
    _paths: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def families(self) -> list[str]:
        return list(self._paths)

    def append(self, family: str, header: str, text: str) -> None:
        """Appends sample lines (each ending in a newline) to a family's spool."""
        f = self._files.get(family)
        if f is None:
            path = self.directory / f"{len(self._paths):05d}.om"
            f = open(path, "w", encoding="utf-8")  # noqa: SIM115 (kept open while recording)
            f.write(header)
            self._files[family] = f
            self._paths[family] = path
        f.write(text)

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        """Closes every spool file, even when some cannot flush (disk full): the file is
        closed anyway and keeps what reached the disk."""
        error: OSError | None = None
        for f in self._files.values():
            try:
                f.close()
            except OSError as exc:
                error = error or exc
        self._files.clear()
        if error is not None:
            raise error

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def spool_parts(directory: Path) -> list[Path]:
    """A spool directory's family files in first-seen order."""
    return sorted(p for p in directory.glob("*.om") if p.stem.isdigit())


@dataclass(frozen=True, slots=True)
class Block:
    """Where one family's sample lines lie in an assembled file (header excluded)."""

    header: str
    path: Path
    start: int
    end: int


def write_complete_spool(f: IO[bytes], part: Path) -> tuple[str, int, int]:
    """Copies one spool file into `f`; returns (header, start, end) of its sample lines.

    A last line without its newline (the process died mid-write) is dropped, so what is
    copied is whole lines only.
    """
    data = part.read_bytes()
    cut = data.rfind(b"\n")
    data = data[: cut + 1] if cut >= 0 else b""
    lines_start = 0
    header = []
    while data.startswith(b"#", lines_start):
        nl = data.index(b"\n", lines_start)
        header.append(data[lines_start : nl + 1].decode("utf-8"))
        lines_start = nl + 1
    f.write(data)
    end = f.tell()
    start = end - (len(data) - lines_start)
    return "".join(header), start, end


def assemble_spool(directory: Path, out: Path) -> dict[str, Block]:
    """Writes a spool directory as one complete trace file (atomically, fsynced).

    Returns each family's block so that segments can later be merged without re-parsing.
    """
    tmp = out.with_name(out.name + ".tmp")
    blocks: dict[str, Block] = {}
    with open(tmp, "wb") as f:
        for part in spool_parts(directory):
            header, start, end = write_complete_spool(f, part)
            if header:
                blocks[_family_of(header)] = Block(header, out, start, end)
        f.write(EOF_LINE.encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return blocks


def merge_segments(segments: Iterable[dict[str, Block]], out: Path) -> None:
    """Merges complete segment files family by family into one trace (atomically)."""
    order: dict[str, str] = {}
    seg_list = list(segments)
    for seg in seg_list:
        for fam, block in seg.items():
            order.setdefault(fam, block.header)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:
        for fam, header in order.items():
            f.write(header.encode())
            for seg in seg_list:
                part = seg.get(fam)
                if part is None:
                    continue
                with open(part.path, "rb") as src:
                    src.seek(part.start)
                    left = part.end - part.start
                    while left > 0:
                        chunk = src.read(min(_COPY_CHUNK, left))
                        if not chunk:
                            break
                        f.write(chunk)
                        left -= len(chunk)
        f.write(EOF_LINE.encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)


def index_trace(path: Path) -> dict[str, Block]:
    """Family blocks of a complete trace file written by this module (for recovery)."""
    blocks: dict[str, Block] = {}
    fam = fam_header = header = ""
    start = pos = 0
    with open(path, "rb") as f:
        for raw in f:
            if raw.startswith((b"# HELP ", b"# TYPE ", b"# EOF")):
                if fam:
                    blocks[fam] = Block(fam_header, path, start, pos)
                    fam = ""
                if raw.startswith(b"# EOF"):
                    break
                header += raw.decode("utf-8")
                if raw.startswith(b"# TYPE "):
                    fam, fam_header, header = raw.split()[2].decode("utf-8"), header, ""
                    start = pos + len(raw)
            pos += len(raw)
    return blocks


def _family_of(header: str) -> str:
    for line in header.splitlines():
        if line.startswith("# TYPE "):
            return line.split(" ")[2]
    return header.splitlines()[0].split(" ")[2]
