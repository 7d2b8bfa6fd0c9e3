"""The domain lists of gpufeed.vocabulary exist once: every other place takes them from
there, and the docs that list them are checked against them."""

from __future__ import annotations

import argparse
import re

from alerts import config as alerts_config
from correlator_helpers import scenarios
from gpufeed import config, vocabulary
from gpufeed.correlator.analyze_cmd import register
from gpufeed.correlator.engine import causes, engine, features
from gpufeed.gpu import nvml
from gpufeed.simulate import scenario
from stack_support import REPO_ROOT

DOCS = REPO_ROOT / "docs"


def test_causes_are_defined_once() -> None:
    assert causes.Cause is vocabulary.Cause
    assert tuple(c.value for c in vocabulary.Cause) == scenarios.CAUSES


def test_clock_event_reasons_come_from_the_vocabulary() -> None:
    assert nvml.CLOCK_EVENT_REASONS is vocabulary.CLOCK_EVENT_REASON_BITS
    bits = [bit for _, bit in vocabulary.CLOCK_EVENT_REASON_BITS]
    assert bits == [1 << i for i in range(len(bits))], "one bit each, in nvml.h's order"
    assert scenario.CLOCK_EVENT_REASONS == vocabulary.SIMULATED_CLOCK_EVENT_REASONS
    assert frozenset(vocabulary.SLOWDOWN_REASONS) == features.THROTTLE_REASONS
    assert alerts_config.THROTTLE_REASONS == vocabulary.ALERTING_THROTTLE_REASONS
    assert set(vocabulary.SLOWDOWN_REASONS) <= set(vocabulary.SIMULATED_CLOCK_EVENT_REASONS)


def test_the_simulator_throttles_with_reasons_the_correlator_counts() -> None:
    slow = set(vocabulary.SLOWDOWN_REASONS)
    assert set(scenario.THROTTLE_REASONS) <= slow
    assert set(scenario.THERMAL_REASONS) <= slow


def test_correlator_defaults_are_shared() -> None:
    want = (
        vocabulary.DEFAULT_THRESHOLD_RATIO,
        vocabulary.DEFAULT_MIN_WINDOW_SECONDS,
        vocabulary.DEFAULT_MERGE_GAP_SECONDS,
    )
    p = engine.WindowParams()
    assert (p.threshold_ratio, p.min_window_seconds, p.merge_gap_seconds) == want
    assert p.split_seconds == vocabulary.DEFAULT_SPLIT_SECONDS
    c = config.CorrelatorConfig()
    assert (c.threshold_ratio, c.min_window_seconds, c.merge_gap_seconds) == want
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["analyze", "trace.om"])
    assert (args.threshold, args.min_window, args.merge_gap) == want
    rules_cfg = alerts_config.RulesConfig()
    assert rules_cfg.utilization_threshold_ratio == vocabulary.DEFAULT_THRESHOLD_RATIO


def test_docs_list_the_clock_event_reasons_and_bits() -> None:
    text = (DOCS / "gpu.md").read_text(encoding="utf-8")
    got = re.findall(r"`([a-z_]+)`\s+\((0x[0-9a-f]+)\)", text)
    want = [(r, hex(bit)) for r, bit in vocabulary.CLOCK_EVENT_REASON_BITS]
    assert got == want


def test_docs_list_the_alerting_throttle_reasons() -> None:
    text = (DOCS / "runbooks.md").read_text(encoding="utf-8")
    section = text[text.index("## GpuClockThrottled") :].split("\n\n", 2)[1]
    listed = re.findall(r"`([a-z_]+)`", section.split(")", 1)[0])
    assert listed == list(vocabulary.ALERTING_THROTTLE_REASONS)


def test_docs_list_the_causes_in_order() -> None:
    text = (DOCS / "correlator.md").read_text(encoding="utf-8")
    para = text[text.index("## Causes") :].split("\n\n", 2)[1]
    assert re.findall(r"`([a-z_]+)`", para.split("label values:", 1)[1]) == [
        c.value for c in vocabulary.Cause
    ]
