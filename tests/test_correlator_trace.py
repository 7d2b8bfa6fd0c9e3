"""The trace reader and `gpufeed analyze`: exact errors with line numbers for truncated or
malformed files, no partial output, any sample order, worker processes."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from correlator_helpers import T0, analyze_text, scenarios, trace_text
from gpufeed.correlator import analyze_cmd
from gpufeed.trace import reader as trace
from gpufeed.trace.reader import TraceError, read_trace

G = 'gpu="0",uuid="GPU-a",instance="n1:9400"'


def small_trace() -> str:
    def gen(t: float):  # type: ignore[no-untyped-def]
        s = t - T0
        yield f"gpufeed_gpu_up{{{G}}}", 1.0
        yield f"gpufeed_gpu_utilization_ratio{{{G}}}", 0.2 if 300 <= s < 600 else 0.95
        yield (
            'gpufeed_gpu_info{gpu="0",uuid="GPU-a",name="NVIDIA H100 80GB HBM3",instance="n1:9400"}',
            1.0,
        )

    return trace_text(gen, 900)


def run_cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    sp = p.add_subparsers()
    analyze_cmd.register(sp)
    args = p.parse_args(["analyze", *argv])
    return int(args.func(args))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "t.om"
    path.write_text(text)
    return str(path)


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def test_truncated_file_names_the_last_line(tmp_path: Path) -> None:
    lines = lines_of(small_trace())
    cut = "\n".join(lines[:-1]) + "\n"  # '# EOF' lost
    with pytest.raises(TraceError, match=rf":{len(lines) - 1}: the trace ends without '# EOF'"):
        read_trace(write(tmp_path, cut))
    torn = "\n".join(lines[:100]) + "\n" + lines[100][:40]  # cut inside a line
    with pytest.raises(TraceError, match=r":101: "):
        read_trace(write(tmp_path, torn))


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (f"gpufeed_gpu_utilization_ratio{{{G}}} 0.5", "every sample needs a timestamp"),
        (f"gpufeed_gpu_utilization_ratio{{{G}}} zero {T0 + 7:.3f}", "value 'zero' is not a number"),
        (f"gpufeed_gpu_utilization_ratio{{{G}}} 0.5 soon", "timestamp 'soon' is not a number"),
        ('gpufeed_gpu_up{gpu="0",uuid=GPU-a} 1 1750000007.000', "not quoted"),
        ('gpufeed_gpu_up{gpu="0" 1 1750000007.000', "malformed series"),
    ],
)
def test_malformed_line_is_named(bad: str, why: str, tmp_path: Path) -> None:
    lines = lines_of(small_trace())
    lines.insert(50, bad)
    with pytest.raises(TraceError) as e:
        read_trace(write(tmp_path, "\n".join(lines) + "\n"))
    assert ":51: " in str(e.value) and why in str(e.value)


def test_data_after_eof_is_an_error(tmp_path: Path) -> None:
    text = small_trace() + f"gpufeed_gpu_up{{{G}}} 1 {T0 + 2000:.3f}\n"
    with pytest.raises(TraceError, match="data after '# EOF'"):
        read_trace(write(tmp_path, text))


def test_cli_fails_without_partial_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, small_trace())
    out = tmp_path / "w.jsonl"
    assert run_cli(good, "--output", str(out)) == 0
    docs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(d["cause"], d["start"] - T0, d["end"] - T0) for d in docs] == [("unknown", 300, 600)]
    bad_path = tmp_path / "bad.om"
    bad_path.write_text(small_trace().replace("# EOF\n", ""))
    out2 = tmp_path / "w2.jsonl"
    assert run_cli(str(bad_path), "--output", str(out2)) == 1
    assert not out2.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gpufeed")] == []
    assert "ends without '# EOF'" in capsys.readouterr().err
    capsys.readouterr()
    assert run_cli(str(bad_path)) == 1
    assert capsys.readouterr().out == ""


def test_table_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(write(tmp_path, small_trace()), "--format", "table") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["INSTANCE", "GPU", "JOB"]
    assert "unknown" in out[1] and "5m00s" in out[1]


def test_any_sample_order_and_comments_give_the_same_windows(tmp_path: Path) -> None:
    text, _ = scenarios.single("network", "congested", seed=4, minutes=30)
    body = [x for x in text.splitlines() if x != "# EOF"]
    by_series = sorted(body, key=lambda x: x.rsplit(" ", 2)[0])  # series-major, time order kept
    commented = [
        "# HELP gpufeed_gpu_up 1 while the GPU answers",
        "# TYPE gpufeed_gpu_up gauge",
        *body,
    ]
    base = analyze_text(text, tmp_path)
    assert base and {w.cause.value for w in base} == {"network"}
    assert analyze_text("\n".join([*by_series, "# EOF"]) + "\n", tmp_path) == base
    assert analyze_text("\n".join([*commented, "# EOF"]) + "\n", tmp_path) == base


def test_worker_processes_and_small_chunks_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, _ = scenarios.single("checkpointing", "hot_tier", seed=6, minutes=30)
    base = analyze_text(text, tmp_path)
    monkeypatch.setattr(trace, "CHUNK_BYTES", 200_000)  # many chunks, cut mid-snapshot
    assert analyze_text(text, tmp_path) == base
    assert analyze_text(text, tmp_path, jobs=2) == base
    tr = read_trace(os.path.join(str(tmp_path), "trace.om"))
    assert tr.samples == sum(1 for x in text.splitlines() if x and x[0] != "#")


def test_millisecond_timestamps_are_refused(tmp_path: Path) -> None:
    body = [x for x in small_trace().splitlines() if x != "# EOF"]
    ms = [f"{x.rsplit(' ', 1)[0]} {float(x.rsplit(' ', 1)[1]) * 1000:.0f}" for x in body]
    with pytest.raises(TraceError, match="not unix seconds"):
        read_trace(write(tmp_path, "\n".join([*ms, "# EOF"]) + "\n"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--jobs", "0"), "--jobs must be at least 1"),
        (("--threshold", "1.5"), "--threshold must be in (0, 1]"),
        (("--min-window", "0"), "--min-window must be a positive number of seconds"),
    ],
)
def test_bad_flags_are_usage_errors(
    flags: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(write(tmp_path, small_trace()), *flags) == 2
    assert message in capsys.readouterr().err
