"""The trace generator: valid multi-node traces, labels that match the data, varied guises."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from gpufeed.simulate.generator import random_scenario
from gpufeed.simulate.scenario import load_scenario
from gpufeed.simulate.tracegen import TraceStats, generate_trace
from sim_helpers import TraceSummary, check_trace, working_share
from test_record import promtool_samples

SCENARIOS = Path(__file__).parent / "fixtures" / "scenarios"


def read_labels(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@dataclass
class Generated:
    path: Path
    labels: Path
    stats: TraceStats
    summary: TraceSummary


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    d = tmp_path_factory.mktemp("trace")
    stats = generate_trace(d / "t.om", d / "labels.jsonl", nodes=3, duration_s=4 * 3600, seed=11)
    return Generated(d / "t.om", d / "labels.jsonl", stats, check_trace(d / "t.om"))


def test_trace_is_valid_and_counts_add_up(trace: Generated) -> None:
    summary = trace.summary  # check_trace has checked it strictly
    assert summary.samples == trace.stats.samples
    assert trace.stats.steps == 4 * 240 + 1
    instances = {k.split('instance="')[1].split('"')[0] for k in summary.series}
    assert instances == {"gpu-node-000:9842", "gpu-node-001:9842", "gpu-node-002:9842"}
    first = summary.series[next(iter(summary.series))]
    assert first[1][0] - first[0][0] == 15.0


def test_labels_cover_every_gpu_and_match_utilization(trace: Generated) -> None:
    labels = read_labels(trace.labels)
    summary = trace.summary
    util: dict[tuple[str, str], list[tuple[float, float]]] = {}
    sm: dict[tuple[str, str], dict[float, float]] = {}
    up: dict[tuple[str, str], dict[float, float]] = {}
    for key, points in summary.series.items():
        inst = key.split('instance="')[1].split('"')[0]
        if key.startswith("gpufeed_gpu_utilization_ratio{"):
            util[(inst, key.split('gpu="')[1].split('"')[0])] = points
        if key.startswith("gpufeed_gpu_sm_active_ratio{"):
            sm[(inst, key.split('gpu="')[1].split('"')[0])] = dict(points)
        if key.startswith("gpufeed_gpu_up{"):
            up[(inst, key.split('gpu="')[1].split('"')[0])] = dict(points)
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    causes: set[object] = set()
    for rec in labels:
        spans[(str(rec["instance"]), str(rec["gpu"]))].append((rec["start"], rec["end"]))  # type: ignore[arg-type]
        causes.add(rec["cause"])
        key = (str(rec["instance"]), str(rec["gpu"]))
        # what it works: a GPU spinning in a collective reads busy, its SM activity shows it
        inside = [
            working_share(u, sm.get(key, {}).get(ts), str(rec["phase"]))
            for ts, u in util[key]
            if rec["start"] <= ts < rec["end"]  # type: ignore[operator]
        ]
        lost = [ts for ts, v in up[key].items() if v == 0 and rec["start"] <= ts < rec["end"]]  # type: ignore[operator]
        if rec["cause"] is None and rec["confounder"] != "short_dip":
            assert inside and min(inside) >= 0.8, rec
        elif rec["cause"] == "gpu_error" and lost:
            assert not inside
        elif rec["cause"] is not None:
            assert not inside or max(inside) < 0.8, rec
    for intervals in spans.values():  # contiguous, covering the whole trace
        intervals.sort()
        assert intervals[0][0] == 1_700_000_000.0
        assert all(a[1] == b[0] for a, b in pairwise(intervals))
        assert intervals[-1][1] == 1_700_000_000.0 + (4 * 240 + 1) * 15.0
    assert len(spans) == 3 * 8
    assert None in causes and "idle" in causes


def test_same_seed_same_bytes_other_seed_other_trace(tmp_path: Path) -> None:
    def digest(seed: int, name: str) -> tuple[str, str]:
        t, lab = tmp_path / f"{name}.om", tmp_path / f"{name}.jsonl"
        generate_trace(t, lab, nodes=1, duration_s=1800, seed=seed)
        return hashlib.sha256(t.read_bytes()).hexdigest(), hashlib.sha256(
            lab.read_bytes()
        ).hexdigest()

    assert digest(5, "a") == digest(5, "b")
    assert digest(6, "c") != digest(5, "a")


def test_generated_scenarios_vary_every_guise_and_confounder() -> None:
    phases: set[tuple[str, str]] = set()
    ckpt_tiers: set[str] = set()
    sdk: set[bool] = set()
    events: set[str] = set()
    for seed in range(12):
        s = random_scenario(seed, 6 * 3600)
        for job in s.jobs:
            sdk.add(job.sdk)
            for ph in job.phases:
                phases.add((ph.phase, ph.guise))
                if ph.phase == "checkpointing":
                    ckpt_tiers.add(ph.tier or job.checkpoint_tier)
        events |= {e.kind for e in s.events}
        # confounders sit in stretches where every job computes
        for e in s.events:
            for job in s.jobs:
                t = 0.0
                for ph in job.phases:
                    if t < e.at_seconds + e.seconds and e.at_seconds < t + ph.seconds:
                        assert ph.phase == "compute", (seed, e, ph)
                    t += ph.seconds
    assert {
        ("data_loading", "saturated"), ("data_loading", "contended"),
        ("network", "saturated"), ("network", "congested"),
        ("preprocessing", ""), ("checkpointing", ""), ("throttling", ""),
        ("gpu_error", ""), ("idle", ""), ("startup", ""), ("compute", ""),
    } <= phases  # fmt: skip
    assert len(ckpt_tiers) >= 2 and sdk == {True, False}
    assert events == {"busy_tier", "dip", "thermal"}


def test_sdk_off_means_no_sdk_series_and_a_given_scenario_runs_on_every_node(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.om"
    generate_trace(path, None, nodes=2, duration_s=600, seed=1, sdk=False)
    families = set(check_trace(path).families)
    assert "gpufeed_job_phase_seconds" not in families and "gpufeed_job_info" in families
    sc = load_scenario(SCENARIOS / "short-data-loading.yaml")
    labels = tmp_path / "l.jsonl"
    generate_trace(path, labels, nodes=2, duration_s=240, seed=1, scenario=sc)
    stalls = [r for r in read_labels(labels) if r["cause"] == "data_loading"]
    assert {(r["instance"], r["gpu"]) for r in stalls} == {
        (f"gpu-node-00{n}:9842", g) for n in (0, 1) for g in ("0", "1")
    }
    assert all(r["guise"] == "saturated" and r["job_id"] == "job-x" for r in stalls)


@pytest.mark.slow
def test_promtool_accepts_a_generated_trace(trace: Generated, tmp_path: Path) -> None:
    db = tmp_path / "db"
    out = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(trace.path), str(db)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert promtool_samples(out.stdout) == trace.stats.samples


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpufeed.simulate.tracegen import main

    out, labels = tmp_path / "c.om", tmp_path / "c.jsonl"
    args = [str(out), "--labels", str(labels), "--nodes", "1", "--hours", "0.1", "--sdk", "no"]
    assert main(args) == 0
    summary = check_trace(out)
    assert "gpufeed_job_steps" not in summary.families
    assert f"{summary.samples} samples" in capsys.readouterr().err
    assert read_labels(labels)
