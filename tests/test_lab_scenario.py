"""The lab's scenario loader: every shipped scenario loads, and a scenario a user got wrong
is one line naming the file and the key (never a fault that silently does not run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufeed.vocabulary import Cause
from lab import scenario as sc

GOOD: dict[str, Any] = {
    "name": "t",
    "duration_s": 200,
    "workload": {"kind": "train", "launcher": "sdk", "data_tier": "hot"},
    "tiers": {"hot": {"size_mib": 64}, "warm": {"size_mib": 64}},
    "faults": [
        {
            "kind": "blkio_read_limit",
            "tier": "hot",
            "start_s": 60,
            "stop_s": 150,
            "bytes_per_s": 1000,
        }
    ],
    "expect": [
        {"start_s": 60, "stop_s": 150, "cause": "data_loading", "evidence": {"tier": "hot"}}
    ],
}


def test_every_shipped_scenario_loads() -> None:
    found = sc.load_all()
    assert found, "lab/scenarios/ has no scenario"
    for s in found:
        assert Path(s.path).stem == s.name
        # "dlio": lab/dlio_check.py's agreement run (make lab runs it beside lab.run)
        assert set(s.suites) <= {"short", "lab", "extra", "dlio"}, s.name
    assert any("short" in s.suites for s in found), "no scenario for make test's short form"


def test_a_scenario_parses_into_its_parts() -> None:
    s = sc.parse(GOOD)
    assert s.workload.launcher == "sdk" and s.workload.data_tier == "hot"
    assert s.tier("warm").size_mib == 64
    (f,) = s.faults
    assert (f.kind, f.start_s, f.stop_s, f.param("bytes_per_s"), f.param("tier")) == (
        "blkio_read_limit",
        60.0,
        150.0,
        1000,
        "hot",
    )
    (e,) = s.expect
    assert e.cause is Cause.DATA_LOADING and e.evidence == (("tier", "hot"),)
    assert s.tier("hot").read_capacity_bytes_per_s == 0  # the host disk's own


def test_a_tier_with_a_read_capacity() -> None:
    raw = {**GOOD, "tiers": {"hot": {"size_mib": 64, "read_capacity_bytes_per_s": 2e6}}}
    assert sc.parse(raw).tier("hot").read_capacity_bytes_per_s == 2_000_000


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"duration_s": -1}, "duration_s: must be > 0"),
        ({"workload": {"data_tier": "cold"}}, "workload.data_tier: tier 'cold'"),
        ({"workload": {"lancher": "run"}}, "unknown key(s) lancher"),
        ({"tiers": {"tepid": {"size_mib": 1}}}, "tiers.tepid: must be one of"),
        (
            {"tiers": {"hot": {"size_mib": 9, "read_capacity_bytes_per_s": 0}}},
            "tiers.hot.read_capacity_bytes_per_s: must be > 0",
        ),
        ({"expect": [{"start_s": 10, "stop_s": 5, "cause": "idle"}]}, "needs start_s < stop_s"),
        (
            {"expect": [{"start_s": 1, "stop_s": 5, "cause": "slow"}]},
            "expect[0].cause: must be one of",
        ),
        (
            {
                "expect": [
                    {"start_s": 1, "stop_s": 50, "cause": "idle"},
                    {"start_s": 40, "stop_s": 60, "cause": "idle"},
                ]
            },
            "overlap on node 0 at 40 s",
        ),
        (
            {"faults": [{"kind": "x", "start_s": 1, "stop_s": 2, "node": 1}]},
            "faults[0].node: node 1",
        ),
        ({"faults": "nope"}, "faults: must be a list"),
        ({"background": [{"kind": "busy"}]}, "background[0].kind: must be one of busy_host"),
        (
            {"background": [{"kind": "busy_host", "spinner": 2}]},
            "background[0]: unknown key(s) spinner",
        ),
        (
            {"background": [{"kind": "busy_host", "spinners": "two"}]},
            "background[0].spinners: must be a number",
        ),
        (
            {"background": [{"kind": "busy_host", "spinners": 1.5}]},
            "background[0].spinners: must be a whole number",
        ),
        (
            {"background": [{"kind": "busy_host", "spinner_nice": 25}]},
            "background[0].spinner_nice: must be 0-19",
        ),
        (
            {"background": [{"kind": "busy_host", "scratch_mib": 0}]},
            "background[0].scratch_mib: must be > 0",
        ),
        (
            {"background": [{"kind": "busy_host", "stop_s": 300}]},
            "background[0]: needs start_s < stop_s <= duration_s (200)",
        ),
        ({"nodes": 2, "background": [{"kind": "busy_host"}]}, "single-node scenarios only"),
    ],
)
def test_bad_scenarios_are_one_line_errors(change: dict[str, Any], words: str) -> None:
    raw = {**GOOD, **change}
    with pytest.raises(sc.ScenarioError) as exc:
        sc.parse(raw, "t.yaml")
    msg = str(exc.value)
    assert words in msg and "\n" not in msg and msg.startswith("t.yaml: ")


def test_background_work_is_read_with_every_default() -> None:
    s = sc.parse({**GOOD, "background": [{"kind": "busy_host", "spinners": 3}]})
    (b,) = s.background
    # from before the workload starts to the scenario's end, unless the entry says
    assert (b.kind, b.start_s, b.stop_s) == ("busy_host", 0.0, 200.0)
    defaults = sc.BACKGROUND_DEFAULTS["busy_host"]
    assert dict(b.params) == {**defaults, "spinners": 3}
    assert sc.parse(GOOD).background == ()
    later = {"kind": "busy_host", "start_s": 50, "stop_s": 120}
    assert sc.parse({**GOOD, "background": [later]}).background[0].start_s == 50.0


def test_the_cpu_faults_have_a_busy_host_guise() -> None:
    # issue 23: the CPU faults must be named on a host that unrelated work keeps busy
    for name, kind in (("cpu-quota-busy-host", "cpu_quota"), ("cpu-hog-busy-host", "cpu_hog")):
        s = sc.find(name)
        assert [b.kind for b in s.background] == ["busy_host"], name
        assert kind in {f.kind for f in s.faults}, name
        assert all(e.cause is Cause.PREPROCESSING for e in s.expect), name


def test_name_must_match_the_file(tmp_path: Path) -> None:
    p = tmp_path / "other.yaml"
    p.write_text(yaml.safe_dump(GOOD))
    with pytest.raises(sc.ScenarioError, match="must equal the file stem 'other'"):
        sc.load(p)
    with pytest.raises(sc.ScenarioError, match="no scenario 'nope'"):
        sc.find("nope", tmp_path)
