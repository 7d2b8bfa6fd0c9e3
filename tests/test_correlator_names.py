"""Rules, features and summaries agree on the evidence names (gpufeed.correlator.engine.names).

A rule whose feature nobody computes never fires, silently; a feature no rule reads is dead
weight; a feature without summary words leaves the window's one-line summary short. Each of
these fails here and names the rule or feature.
"""

from __future__ import annotations

import pytest

from bench import multinode_scenarios as mn
from correlator_helpers import scenarios
from gpufeed.correlator.engine import state
from gpufeed.correlator.engine.engine import NodeCorrelator
from gpufeed.correlator.engine.names import (
    ACCOMPANYING,
    CONTEXT_KEYS,
    DESCRIPTIVE_FEATURES,
    FEATURES,
    Feature,
)
from gpufeed.correlator.engine.rules import RULES, Rule
from gpufeed.correlator.engine.summary import phrase
from gpufeed.correlator.engine.view import Timing
from gpufeed.correlator.feeds.analyze import estimate_interval
from gpufeed.trace.reader import read_trace
from gpufeed.vocabulary import Cause

# Features the bench's trace cannot show: gpu_memory_idle is computed only where a node
# reports no job data at all (the bench's nodes all do); nvlink_peak_ratio needs NVLink
# traffic well above its healthy median, and the bench's NVLink only follows utilization.
# collective_wait_ratio needs per-rank signals and sm_active_drop_ratio GPM's SM activity,
# which the bench's nodes do not report (tests/test_correlator_sm_active.py computes both).
# job_cpu_throttled_ratio needs a job under a cgroup CPU quota, which the bench's jobs are
# not (tests/test_correlator_evidence.py plays one). data_tier_throttled_ratio needs an
# object-storage tier (tests/test_object_storage.py plays a throttling one).
# not (tests/test_correlator_evidence.py plays one); job_cpu_wait_ratio needs a job's
# threads' run-queue wait, which the simulator does not write (the same test plays one).
# serving_no_demand needs an inference server's queue, which the bench's jobs do not serve
# (tests/test_correlator_serving.py plays one).
# Their names are still checked against the rules and the summary above.
NOT_IN_BENCH = {
    Feature.GPU_MEMORY_IDLE,
    Feature.NVLINK_PEAK_RATIO,
    Feature.COLLECTIVE_WAIT_RATIO,
    Feature.SM_ACTIVE_DROP_RATIO,
    Feature.JOB_CPU_THROTTLED_RATIO,
    Feature.DATA_TIER_THROTTLED_RATIO,
    Feature.JOB_CPU_WAIT_RATIO,
    Feature.SERVING_NO_DEMAND,
    Feature.JOB_RANK_LOST,  # a killed CPU-only rank: tests/test_correlator_lost_rank.py
    Feature.JOB_FAILED_IN_COLLECTIVE,  # its peer there (the same test)
}


def unknown_rule_features(rules: tuple[Rule, ...]) -> list[str]:
    return [f"{r.cause}: {r.feature}" for r in rules if r.feature not in FEATURES]


def test_every_rule_reads_a_known_feature() -> None:
    assert unknown_rule_features(RULES) == []


def test_a_typo_in_a_rules_feature_is_named() -> None:
    typo = Rule(Cause.NETWORK, "network_utilisation_ratio", 0.8, 0.93, 0.85)
    assert unknown_rule_features((*RULES, typo)) == ["network: network_utilisation_ratio"]


def test_every_feature_has_a_rule_and_summary_words() -> None:
    read = {r.feature for r in RULES}
    assert sorted(FEATURES - read - DESCRIPTIVE_FEATURES) == [], "features no rule reads"
    assert sorted(DESCRIPTIVE_FEATURES & read) == [], "a descriptive feature that decides"
    assert sorted(lead for _, lead in ACCOMPANYING if lead not in read) == []
    assert [f for f in sorted(FEATURES) if phrase(f, 0.5, {}) is None] == [], "no summary words"
    assert phrase("no_such_feature", 0.5, {}) is None


def test_window_context_keys_are_known() -> None:
    used = {k for keys in state.CONTEXT_FOR.values() for k in keys}
    assert sorted(used - CONTEXT_KEYS) == []


@pytest.fixture(scope="module")
def computed(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    """(features, context keys) the engine computes over the bench's labelled trace."""
    # the bench's trace, and one node per network guise that only the network benchmark
    # schedules (link faults, RoCE congestion, per-rank collective waits)
    texts = [scenarios.build(seed=11, nodes=4, hours=2.0)[0]]
    for guise, roce in (("flapping", False), ("link_errors", False), ("congested", True),
                        ("peer", False)):  # fmt: skip
        texts.append(
            scenarios.single("network", guise, minutes=30, link_counters=True, roce=roce)[0]
        )
    # two replicas gating by turns: the job below the threshold on the whole
    texts.append(mn.build_parallel("rotating_imbalance", seed=2, dp=2, pp=2, tp=2, gpus=4).text)
    nodes = []
    for i, body in enumerate(texts):
        path = tmp_path_factory.mktemp("names") / f"trace-{i}.om"
        path.write_text(body)
        nodes += read_trace(str(path)).nodes.values()
    features: set[str] = set()
    context: set[str] = set()
    for node in nodes:
        corr = NodeCorrelator(node, Timing(estimate_interval(node)))
        corr.refresh_units()
        for t in corr.timeline():
            corr.step(t)
            for u in corr.units.values():
                if u.last_mark is not None:
                    features.update(u.last_mark.features)
                    context.update(u.last_mark.context)
    return features, context


def test_engine_computes_every_feature_a_rule_reads(computed: tuple[set[str], set[str]]) -> None:
    features, context = computed
    assert sorted(features - FEATURES) == [], "computed features without a name in names.py"
    assert sorted({r.feature for r in RULES} - features - NOT_IN_BENCH) == [], "never computed"
    assert sorted(context - CONTEXT_KEYS) == []
