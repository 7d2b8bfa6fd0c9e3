"""Behaviour stays: the windows `gpufeed analyze` writes for fixed labelled traces, byte for byte.

A restructuring must not change what the correlator concludes. Two traces at fixed seeds,
one from the benchmark's scenario generator (bench/correlator_scenarios.py: every cause in
its guises, confounders, SDK and per-job I/O on some nodes) and one from the simulated
node's trace generator (gpufeed.simulate.tracegen), are analysed by the real CLI and its
JSON output is diffed against tests/fixtures/golden/windows-*.jsonl.

A change that is meant to change windows regenerates them with GPUFEED_UPDATE_GOLDEN=1 and
says so in its commit message; the diff of the golden files is the review of that change.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import pytest

from bench import nvml_reading as nvml
from conftest import FIXTURES, agent_env, gpufeed_cmd
from correlator_helpers import scenarios
from gpufeed.simulate.tracegen import generate_trace

GOLDEN = FIXTURES / "golden"


def _bench_trace(path: Path) -> None:
    # the compute-only reading of a collective wait: under NCCL's spinning one (the
    # generator's default) a throttled peer's victims open no window (an open gap,
    # docs/benchmarks.md), and a golden holds right answers; the simulated trace spins
    text, _labels = scenarios.build(seed=11, nodes=2, hours=2.0, collectives=nvml.COMPUTE_ONLY)
    path.write_text(text)


def _simulated_trace(path: Path) -> None:
    generate_trace(path, None, nodes=2, duration_s=3600.0, step_s=15.0, seed=5)


def _analyze(trace: Path) -> str:
    """The windows the real CLI writes for `trace`, as JSON lines."""
    out = trace.with_name("windows.jsonl")
    run = subprocess.run(
        gpufeed_cmd("analyze", str(trace), "--format", "jsonl", "--output", str(out)),
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    return out.read_text()


@pytest.mark.parametrize(
    ("name", "make_trace"),
    [("windows-bench.jsonl", _bench_trace), ("windows-simulated.jsonl", _simulated_trace)],
)
def test_analyze_output_is_unchanged(name: str, make_trace: object, tmp_path: Path) -> None:
    trace = tmp_path / "trace.om"
    make_trace(trace)  # type: ignore[operator]
    got = _analyze(trace)
    assert got.count("\n") >= 5, "too few windows to guard anything"
    golden = GOLDEN / name
    if os.environ.get("GPUFEED_UPDATE_GOLDEN"):
        golden.write_text(got)
    want = golden.read_text()
    if got != want:
        diff = "".join(
            difflib.unified_diff(want.splitlines(True), got.splitlines(True), name, "now", n=0)
        )
        pytest.fail(f"the windows of {name} changed (regenerate only if intended):\n{diff[:4000]}")


def _reversed_series(text: str) -> str:
    """The same trace with its families, and the series inside each, in reverse order:
    what a TSDB that answers series in no fixed order does to the engine's input."""
    families: list[tuple[list[str], dict[str, list[str]]]] = []
    for line in text.splitlines():
        if line == "# EOF":
            break
        if line.startswith("#"):
            if not families or families[-1][1]:
                families.append(([], {}))
            families[-1][0].append(line)
            continue
        head = line.rsplit(" ", 2)[0]
        families[-1][1].setdefault(head, []).append(line)
    out: list[str] = []
    for header, series in reversed(families):
        out += header
        for lines in reversed(series.values()):
            out += lines
    return "\n".join([*out, "# EOF", ""])


def test_the_order_series_arrive_in_changes_no_window(tmp_path: Path) -> None:
    trace = tmp_path / "trace.om"
    _simulated_trace(trace)
    text = trace.read_text()
    mixed = _reversed_series(text)
    assert sorted(mixed.splitlines()) == sorted(text.splitlines()) and mixed != text
    trace.write_text(mixed)
    assert _analyze(trace) == (GOLDEN / "windows-simulated.jsonl").read_text()
