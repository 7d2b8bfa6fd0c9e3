"""Alert and recording rules: promtool check and promtool unit tests (real binaries), the
committed file matches the generator, and the conventions hold for every rule."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import build
from alerts import rules as rules_module
from alerts.config import RulesConfig
from gpufeed.jobs import wire
from stack_support import (
    EXTRA_METRICS,
    REPO_ROOT,
    RULES_FILE,
    catalogue_metrics,
    metric_names,
    promtool,
    recorded_names,
    rule_exprs,
)

TESTS_DIR = REPO_ROOT / "alerts" / "tests"
RUNBOOKS = REPO_ROOT / "docs" / "runbooks.md"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def alerts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    return yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))


def test_promtool_check_rules_is_clean() -> None:
    result = run(promtool(), "check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    files = sorted(str(p) for p in TESTS_DIR.glob("*.yml"))
    assert files
    result = run(promtool(), "test", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    # The same tests against rules with a higher threshold must fail: the tests pin the
    # rules' behaviour, they do not just run them.
    changed = RulesConfig(utilization_threshold_ratio=0.2, fabric_congested_for="11m")
    rules = tmp_path / "gpufeed.rules.yml"
    rules.write_text(build.render(changed), encoding="utf-8")
    for test in TESTS_DIR.glob("*.yml"):
        (tmp_path / "tests").mkdir(exist_ok=True)
        (tmp_path / "tests" / test.name).write_text(test.read_text(encoding="utf-8"))
    result = run(
        promtool(), "test", "rules", *sorted(str(p) for p in (tmp_path / "tests").glob("*.yml"))
    )
    assert result.returncode != 0
    assert "GpuUtilizationLow" in result.stdout + result.stderr
    assert "FabricCongested" in result.stdout + result.stderr


def test_committed_rules_match_the_generator() -> None:
    assert RULES_FILE.read_text(encoding="utf-8") == build.render(), "stale: make alerts"
    assert build.main(["--check"]) == 0


def test_for_override_shortens_every_for_in_a_copy(tmp_path: Path) -> None:
    before = RULES_FILE.read_text(encoding="utf-8")
    out = tmp_path / "fast.rules.yml"
    assert build.main(["--for", "7s", "--out", str(out)]) == 0
    fast = yaml.safe_load(out.read_text(encoding="utf-8"))
    shipped = yaml.safe_load(before)
    for fast_rule, rule in zip(alerts(fast), alerts(shipped), strict=True):
        assert fast_rule["alert"] == rule["alert"]
        expr = rule["expr"]
        if rule["alert"] == "GpuUtilizationLow":  # its window plays the part of a for:
            window = RulesConfig().utilization_low_for
            expr = expr.replace(f"[{window}]", "[7s]").replace(f"offset {window}", "offset 7s")
        assert fast_rule["expr"] == expr
        assert fast_rule.get("for") == ("7s" if "for" in rule else None)
    assert RULES_FILE.read_text(encoding="utf-8") == before
    result = run(promtool(), "check", "rules", str(out))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_conventions(shipped: dict[str, Any]) -> None:
    anchors = set(re.findall(r"^## (\w+)\s*$", RUNBOOKS.read_text(encoding="utf-8"), re.M))
    for rule in alerts(shipped):
        name = rule["alert"]
        assert re.fullmatch(r"(?:[A-Z][a-z0-9]+)+", name), f"{name}: not CamelCase"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        ann = rule["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert "{{" not in ann["summary"], f"{name}: summary must be static"
        assert "{{" in ann["description"], f"{name}: description must be templated"
        assert ann["runbook_url"].endswith(f"docs/runbooks.md#{name.lower()}"), name
        assert name in anchors, f"{name}: no '## {name}' section in docs/runbooks.md"


def test_gpu_utilization_low_contract(shipped: dict[str, Any]) -> None:
    rule = next(r for r in alerts(shipped) if r["alert"] == "GpuUtilizationLow")
    # No `for:`: its clock would belong to the cause-labelled series and restart whenever
    # the cause changes. The 10m window is an _over_time on the cause-free recording rule.
    assert "for" not in rule
    window = RulesConfig().utilization_low_for
    value, unit = re.fullmatch(r"(\d+)([smh])", window).groups()  # type: ignore[union-attr]
    assert int(value) * {"s": 1, "m": 60, "h": 3600}[unit] <= 15 * 60
    sustained = rules_module.sustained_low(RulesConfig())
    assert "cause" not in sustained
    assert f"max_over_time({rules_module.HELD_RECORD}[{window}]) < 0.8" in sustained
    assert f"{rules_module.HELD_RECORD} offset {window}" in sustained
    assert " ".join(sustained.split()) in " ".join(rule["expr"].split())
    assert "gpufeed_job_info" in rule["expr"]
    assert "group_left (cause, data_source)" in rule["expr"]
    assert '"cause", "unknown"' in rule["expr"]
    for cause in RulesConfig().cause_hints:
        if cause != "unknown":
            assert f'eq $labels.cause "{cause}"' in rule["annotations"]["description"]
    assert {"critical"} == {
        r["labels"]["severity"] for r in alerts(shipped) if r["alert"] in {"GpuFatalXid", "GpuLost"}
    }


def test_every_alert_and_recording_rule_has_a_unit_test(shipped: dict[str, Any]) -> None:
    tested_alerts: set[str] = set()
    tested_exprs: set[str] = set()
    for path in TESTS_DIR.glob("*.yml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for case in doc["tests"]:
            for t in case.get("alert_rule_test", []):
                if t["exp_alerts"]:  # a firing check; the not-yet-firing side is below
                    tested_alerts.add(t["alertname"])
            for t in case.get("promql_expr_test", []):
                tested_exprs.add(t["expr"])
            # Both sides of the boundary: some eval_time with no alert for each name.
            quiet = {t["alertname"] for t in case.get("alert_rule_test", []) if not t["exp_alerts"]}
            fired = {t["alertname"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
            assert fired <= quiet, f"{path.name}: {fired - quiet} only tested firing"
    untested = sorted({r["alert"] for r in alerts(shipped)} - tested_alerts)
    assert not untested, f"no promtool test in alerts/tests/*.yml fires: {untested}"
    unrecorded = sorted(recorded_names() - tested_exprs)
    assert not unrecorded, f"no promql_expr_test in alerts/tests/*.yml for: {unrecorded}"


def test_rules_use_contract_metrics_only() -> None:
    allowed = catalogue_metrics() | recorded_names() | EXTRA_METRICS
    for name, expr in rule_exprs():
        assert metric_names(expr) <= allowed, f"{name}: {metric_names(expr) - allowed}"


def test_fatal_xid_alert_uses_exactly_the_vocabularys_list(shipped: dict[str, Any]) -> None:
    """One list of fatal XIDs (gpufeed.vocabulary) for the paging alert and the correlator;
    0.1.0 had two that disagreed (63 paged but explained nothing, 62 and 140 the reverse)."""
    from gpufeed.correlator.engine.features import FATAL_XIDS as CORRELATOR_XIDS
    from gpufeed.vocabulary import FATAL_XID_MEANINGS, FATAL_XIDS

    rule = next(a for a in alerts(shipped) if a["alert"] == "GpuFatalXid")
    lists = re.findall(r'xid=~"([^"]*)"', rule["expr"])
    assert lists, rule["expr"]
    assert all(sorted(x.split("|")) == sorted(FATAL_XIDS) for x in lists), rule["expr"]
    assert frozenset(FATAL_XIDS) == CORRELATOR_XIDS
    assert all(code.isdigit() and FATAL_XID_MEANINGS[code] for code in FATAL_XIDS)


def test_the_sdk_runbook_covers_every_drop_reason() -> None:
    """GpufeedSdkMessagesDropped is labelled by reason: its runbook says what to do for
    each reason the agent can export."""
    text = RUNBOOKS.read_text(encoding="utf-8")
    section = text.split("## GpufeedSdkMessagesDropped", 1)[1].split("\n## ", 1)[0]
    missing = [r for r in wire.DROP_REASONS if f"`{r}`" not in section]
    assert not missing, f"docs/runbooks.md#gpufeedsdkmessagesdropped: no advice for {missing}"
