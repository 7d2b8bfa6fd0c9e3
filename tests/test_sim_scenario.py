"""Scenario files: the built-in one, good files, and bad ones whose errors name key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.config import ConfigError
from gpufeed.simulate.node import SimulatedNode
from gpufeed.simulate.scenario import (
    PHASES,
    ScenarioError,
    default_scenario,
    load_scenario,
    parse_scenario,
)

SCENARIOS = Path(__file__).parent / "fixtures" / "scenarios"
DOCS = Path(__file__).parent.parent / "docs" / "simulation.md"


def test_default_scenario_covers_every_cause_with_stalls_long_enough_for_a_window() -> None:
    s = default_scenario()
    assert 360 <= s.cycle_seconds <= 480  # 6-8 minutes at pace 1
    seen = {ph.phase for job in s.jobs for ph in job.phases}
    # straggler (a peer on another node is late) is a job-level cause: a single simulated
    # node does not draw it (a scenario file may ask for it)
    assert seen == set(PHASES) - {"straggler"}
    for job in s.jobs:
        for ph in job.phases:
            if ph.phase != "compute":
                assert ph.seconds >= 90, (job.job_id, ph)
    # a GPU that no job holds for a while (rl-sweep's idle phase), and a serving GPU whose
    # queue runs empty (chat-serving's low_demand)
    assert any(ph.phase == "idle" for job in s.jobs for ph in job.phases), "a GPU with no job"
    assert [job.serving for job in s.jobs if job.serving] == ["vllm"]
    assert {e.kind for e in s.events} >= {"dip", "thermal"}


def test_every_key_is_read() -> None:
    s = load_scenario(SCENARIOS / "every-key.yaml")
    assert s.repeat is False
    assert s.node.gpus == 4 and s.node.sm_active is False and s.node.cpus == 64
    assert s.node.driver_version == "535.161.08"
    lustre = s.tier("lustre")
    assert lustre.device is None and lustre.read_bytes_per_second == 1e9
    assert s.tier("hot").mountpoint == "/data/hot" and s.tier("hot").free_ratio == 0.5
    assert [p.fabric for p in s.ports] == ["ethernet", "roce"]
    assert s.ports[1].port == "1" and s.ports[1].counts_transmit_wait
    (job,) = s.jobs
    assert job.sdk is False and job.gpus == (0, 1, 2) and job.steps_per_epoch == 1000
    assert job.collectives == "compute_only" and not job.spins
    assert [(p.phase, p.guise, p.tier, p.gpu, p.reason) for p in job.phases] == [
        ("startup", "", "hot", -1, ""),
        ("data_loading", "contended", "lustre", -1, ""),
        ("network", "congested", "", -1, ""),
        ("throttling", "", "", -1, "sw_power_cap"),
        ("gpu_error", "", "", 1, ""),
        ("checkpointing", "", "lustre", -1, ""),
    ]
    assert [e.kind for e in s.events] == ["busy_tier", "thermal", "thermal", "dip"]
    assert s.events[2].gpus == (3,)


def test_docs_example_is_a_valid_scenario() -> None:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("```yaml\n", text.index("## A full example")) + len("```yaml\n")
    example = text[start : text.index("```", start)]
    s = parse_scenario(example, "docs example")
    assert [j.job_id for j in s.jobs] == ["pretrain-1", "finetune-2"] and len(s.events) == 3
    assert [t.name for t in s.tiers] == ["hot", "warm", "cold"]
    node = SimulatedNode(s, seed=1, clock=lambda: 0.0)
    for t in (0.0, 250.0, 500.0, 700.0):
        assert node.families(t)


@pytest.mark.parametrize(
    ("name", "line", "fragment"),
    [
        ("unknown-key", 5, "jobs[0].phasez: unknown key"),
        ("phase-name", 6, "jobs[0].phases[1].phase: expected one of compute"),
        ("gpu-twice", 6, "GPU 1 is already held by job 'a'"),
        ("tier-ref", 4, "jobs[0].data_tier: unknown tier 'lukewarm'"),
        ("guise", 5, "guise: expected one of saturated, contended"),
        ("seconds", 5, "seconds: expected a number, got 'ten'"),
        ("dip-too-long", 7, "events[0].seconds: a dip longer than 45 s"),
        ("yaml-syntax", 4, "invalid YAML"),
        ("gpu-error-gpu", 5, "GPU 5 is not one of the job's GPUs [0, 1]"),
        ("gpu-range", 4, "expected a GPU index 0..3, got '4'"),
        ("missing-phases", 2, "jobs[0]: missing key: phases"),
    ],
)
def test_bad_scenarios_name_key_and_line(name: str, line: int, fragment: str) -> None:
    path = SCENARIOS / f"bad-{name}.yaml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: line {line}:"), msg
    assert fragment in msg
    assert isinstance(info.value, ConfigError)  # the agent's existing error path catches it


def test_unreadable_and_empty_scenarios() -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        load_scenario(SCENARIOS / "does-not-exist.yaml")
    with pytest.raises(ScenarioError, match="empty scenario"):
        parse_scenario("# nothing\n", "x.yaml")
    with pytest.raises(ScenarioError, match=r"x.yaml: line 1: scenario: expected a mapping"):
        parse_scenario("- a\n- b\n", "x.yaml")


def test_no_jobs_means_every_gpu_idle() -> None:
    s = parse_scenario("name: quiet\njobs: []\n")
    assert s.jobs == () and s.node.gpus == 8
