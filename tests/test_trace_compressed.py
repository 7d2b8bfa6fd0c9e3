"""Compressed traces (gpufeed.trace.source): `gpufeed analyze` reads a gzip (or, with the
zstandard package, zstd) trace as a stream and gives exactly the windows of the same trace
uncompressed; the compression is told by the file's first bytes, not its name; a
truncated or corrupt stream is a one-line error naming the file. 0.2.0 refused the
project's own compressed fixtures ("not UTF-8 text")."""

from __future__ import annotations

import argparse
import bz2
import contextlib
import gzip
import importlib
import importlib.util
import lzma
import os
import shutil
import threading
from pathlib import Path

import pytest

from gpufeed.correlator import analyze_cmd
from gpufeed.trace import reader
from gpufeed.trace.source import TraceError

# A real H200 recording (tests/test_gpu_busy_waiting.py): 3.5 MB of text, one window
FIXTURE = Path(__file__).parent / "fixtures" / "gpu-busy-waiting-h200" / "trace.om.gz"
HAVE_ZSTANDARD = importlib.util.find_spec("zstandard") is not None


def analyze(path: Path, out: Path, *flags: str) -> int:
    p = argparse.ArgumentParser()
    analyze_cmd.register(p.add_subparsers())
    args = p.parse_args(["analyze", str(path), "--output", str(out), *flags])
    return int(args.func(args))


def plain_copy(tmp_path: Path) -> Path:
    plain = tmp_path / "trace.om"
    with gzip.open(FIXTURE, "rb") as src, plain.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return plain


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_gz_trace_gives_exactly_the_windows_of_the_same_trace_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: str
) -> None:
    plain = plain_copy(tmp_path)
    named_plain = tmp_path / "recorded.om"  # gzip bytes under a plain name: read as gzip
    shutil.copyfile(FIXTURE, named_plain)
    # many chunks, so that lines and samples cut at chunk edges are joined right
    monkeypatch.setattr(reader, "CHUNK_BYTES", 256 * 1024)
    outs = {}
    for name, path in (("plain", plain), ("gz", FIXTURE), ("named", named_plain)):
        assert analyze(path, tmp_path / f"{name}.jsonl", "--jobs", jobs) == 0
        outs[name] = (tmp_path / f"{name}.jsonl").read_text()
    assert outs["plain"].count("\n") >= 1  # the recording's window
    assert outs["gz"] == outs["plain"] and outs["named"] == outs["plain"]
    a, b = reader.read_trace(str(plain)), reader.read_trace(str(FIXTURE), jobs=int(jobs))
    assert (b.samples, b.lines) == (a.samples, a.lines)


def test_zst_trace_is_read_with_zstandard_or_refused_saying_how(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = plain_copy(tmp_path)
    zst = tmp_path / "trace.om.zst"
    if HAVE_ZSTANDARD:  # not a dependency: imported by name, as gpufeed.trace.source does
        zstandard = importlib.import_module("zstandard")
        zst.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
        assert analyze(plain, tmp_path / "plain.jsonl") == 0
        assert analyze(zst, tmp_path / "zst.jsonl") == 0
        assert (tmp_path / "zst.jsonl").read_text() == (tmp_path / "plain.jsonl").read_text()
        return
    # a real zstd frame header (magic, then the frame descriptor): refused before reading on
    zst.write_bytes(b"\x28\xb5\x2f\xfd\x24\x00" + bytes(64))
    assert analyze(zst, tmp_path / "zst.jsonl") == 1
    err = one_line_error(capsys)
    assert str(zst) in err and "zstandard" in err and f"zstd -d {zst}" in err
    assert not (tmp_path / "zst.jsonl").exists()


def truncated(tmp_path: Path) -> Path:
    data = FIXTURE.read_bytes()
    path = tmp_path / "cut.om.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


def crc_broken(tmp_path: Path) -> Path:
    data = bytearray(FIXTURE.read_bytes())
    data[-6] ^= 0xFF  # in the trailer's CRC-32: every byte inflates, the check fails
    path = tmp_path / "crc.om.gz"
    path.write_bytes(bytes(data))
    return path


def trailing_garbage(tmp_path: Path) -> Path:
    path = tmp_path / "tail.om.gz"
    path.write_bytes(FIXTURE.read_bytes() + b"not gzip")
    return path


@pytest.mark.parametrize("make", [truncated, crc_broken, trailing_garbage])
def test_corrupt_gz_is_one_clear_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object
) -> None:
    assert callable(make)
    path: Path = make(tmp_path)
    out = tmp_path / "w.jsonl"
    assert analyze(path, out) == 1
    err = one_line_error(capsys)
    assert err.startswith(f"gpufeed analyze: {path}: the gzip stream is truncated or corrupt")
    assert not out.exists()  # nothing written unless the whole input was analysed


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [
        ("plain.om.gz", b"gpufeed_gpu_up 1 1750000000\n# EOF\n", "named .gz but not gzip"),
        ("plain.om.zst", b"# EOF\n", "named .zst but not zstd"),
        ("t.om.bz2", bz2.compress(b"# EOF\n"), "bzip2-compressed, not read: `bunzip2 "),
        ("t.om.xz", lzma.compress(b"# EOF\n"), "xz-compressed, not read: `unxz "),
    ],
)
def test_compression_is_told_by_content_and_a_misnamed_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes, why: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    assert analyze(path, tmp_path / "w.jsonl") == 1
    err = one_line_error(capsys)
    assert err.startswith(f"gpufeed analyze: {path}: ") and why in err, err


def test_a_gz_trace_is_parsed_as_it_is_decompressed_not_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming as behaviour: with a truncated stream, the chunks before the cut are
    parsed and handed on before the decompressor reaches the cut. A reader that inflated
    the whole file first would fail before its first chunk."""
    monkeypatch.setattr(reader, "CHUNK_BYTES", 64 * 1024)
    chunks = reader.iter_chunks(str(truncated(tmp_path)), jobs=1)
    first = next(chunks)
    assert first.error is None and first.samples > 100
    got = 1
    with pytest.raises(TraceError, match="truncated or corrupt"):
        for res in chunks:
            assert res.error is None
            got += 1
    assert got > 10  # 3.5 MB of text cut at two thirds: tens of 64 KiB chunks came first


def test_a_line_longer_than_the_bound_in_a_gz_is_the_plain_files_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 10_000)
    text = b"gpufeed_gpu_up 1 1750000000\n" * 200 + b"x" * 50_000 + b"\n# EOF\n"
    plain, gz = tmp_path / "long.om", tmp_path / "long.om.gz"
    plain.write_bytes(text)
    gz.write_bytes(gzip.compress(text))
    errors = []
    for path in (plain, gz):
        with pytest.raises(TraceError) as exc:
            reader.read_trace(str(path))
        errors.append(str(exc.value).replace(str(path), "PATH"))
    assert errors[0] == errors[1] == "PATH:201: a line longer than 10000 bytes: not a trace"


@pytest.mark.parametrize("gz", [False, True])
def test_a_trace_from_a_pipe_is_streamed_plain_or_gz(tmp_path: Path, gz: bool) -> None:
    """`zcat t.om.gz | gpufeed analyze /dev/stdin` (or `zstd -dc`): a pipe cannot be read
    at byte offsets, nor its first bytes read twice; it is streamed like a compressed file,
    its format peeked at."""
    plain = plain_copy(tmp_path)
    assert analyze(plain, tmp_path / "plain.jsonl") == 0
    data = FIXTURE.read_bytes() if gz else plain.read_bytes()
    r, w = os.pipe()

    def feed() -> None:
        with os.fdopen(w, "wb") as f, contextlib.suppress(BrokenPipeError):
            f.write(data)  # a reader that gave up: the write end learns it here

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        assert analyze(Path(f"/dev/fd/{r}"), tmp_path / "pipe.jsonl", "--jobs", "2") == 0
    finally:
        os.close(r)  # first: a writer still blocked on a full pipe is let go
        writer.join(timeout=60)
    assert (tmp_path / "pipe.jsonl").read_text() == (tmp_path / "plain.jsonl").read_text()
