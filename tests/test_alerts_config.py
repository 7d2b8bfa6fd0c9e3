"""Alert settings from YAML (alerts/build.py --config): validation with one-line errors,
the example file, and rules built for another scrape selector that fire in promtool."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import build, config_file
from alerts.config import RulesConfig
from stack_support import REPO_ROOT, promtool

EXAMPLE = REPO_ROOT / "alerts" / "config.example.yml"
K8S_SELECTOR = 'job="kubernetes-pods", app_kubernetes_io_name="gpufeed-agent"'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("selector_job: gpufeed\n", "unknown key 'selector_job' (known: selector, "),
        ("utilization_threshold_ratio: high\n", "'utilization_threshold_ratio' must be a number"),
        ("utilization_threshold_ratio: 80\n", "'utilization_threshold_ratio' is a ratio"),
        ("storage_busy_ratio: true\n", "'storage_busy_ratio' must be a number >= 0, got bool"),
        ("fill_horizon_seconds: 1.5\n", "'fill_horizon_seconds' must be a positive whole number"),
        ("gpu_lost_for: 5 minutes\n", "'gpu_lost_for' must be a Prometheus duration"),
        ("rate_window: 5\n", "'rate_window' must be a non-empty string, got int 5"),
        ("selector: '{job=\"x\"}'\n", "'selector' must be PromQL label matchers without braces"),
        ("selector: job=gpufeed\n", "'selector' must be PromQL label matchers"),
        ("runbook_base_url: docs/runbooks.md\n", "'runbook_base_url' must be an http(s) URL"),
        ("fatal_xids: [79]\n", "'fatal_xids' is not a setting: it is the agent's vocabulary"),
        ("cause_hints: {data_loadin: x}\n", "'cause_hints' has no cause 'data_loadin'"),
        ("cause_hints: [x]\n", "'cause_hints' must be a mapping, got list"),
        ("prometheus_rule_labels: {release: 1}\n", "'prometheus_rule_labels' must map strings"),
        ("- selector\n", "must be a mapping of settings, got list"),
        ("selector: [unclosed\n", "line 2: not valid YAML"),
    ],
)
def test_a_bad_setting_stops_the_build_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = write(tmp_path, text)
    out = tmp_path / "rules.yml"
    assert build.main(["--config", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"alerts/build.py: {path}:"), err
    assert message in err, err
    assert not out.exists()


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--config", str(tmp_path / "nope.yml"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err, err


def test_settings_override_defaults_and_keep_the_rest(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "utilization_threshold_ratio: 0.5\n"
        "gpu_lost_for: 3m\n"
        "fill_horizon_seconds: 3600\n"
        "cause_hints: {network: Call the fabric team.}\n",
    )
    cfg = config_file.load_config(path)
    default = RulesConfig()
    assert cfg.utilization_threshold_ratio == 0.5
    assert cfg.gpu_lost_for == "3m"
    assert cfg.fill_horizon_seconds == 3600
    assert cfg.cause_hints["network"] == "Call the fabric team."
    assert cfg.cause_hints["data_loading"] == default.cause_hints["data_loading"]
    assert cfg.fatal_xids == default.fatal_xids
    assert cfg.selector == default.selector
    assert config_file.load_config(write(tmp_path, "# nothing set\n")) == default


def test_the_example_loads_and_names_every_setting() -> None:
    cfg = config_file.load_config(EXAMPLE)
    assert cfg.selector == K8S_SELECTOR
    text = EXAMPLE.read_text(encoding="utf-8")
    mentioned = set(re.findall(r"^#? ?([a-z_]+):", text, re.M))
    assert set(config_file.settable_keys()) <= mentioned


def test_the_built_file_says_which_settings_made_it(tmp_path: Path) -> None:
    out = tmp_path / "site.rules.yml"
    assert build.main(["--config", str(EXAMPLE), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.splitlines()[0].endswith(
        f"from alerts/config.py and {EXAMPLE}; do not edit by hand."
    )
    assert 'job="gpufeed"' not in text
    result = subprocess.run(
        [promtool(), "check", "rules", str(out)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _promtool_case(rules: Path, tests: dict[str, Any], tmp_path: Path) -> str:
    test_file = tmp_path / f"{rules.stem}_test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(rules)], **tests}), encoding="utf-8")
    result = subprocess.run(
        [promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    return f"rc={result.returncode}\n{result.stdout}{result.stderr}"


def test_rules_built_for_another_selector_fire_for_it_in_promtool(tmp_path: Path) -> None:
    """The DaemonSet's annotations give job="kubernetes-pods": rules built with that
    selector page on those series, the shipped rules (job="gpufeed") stay silent, and the
    selector keeps other pods of that scrape job out of GpufeedAgentDown."""
    pod = 'job="kubernetes-pods",app_kubernetes_io_name="gpufeed-agent",instance="10.0.0.7:9842"'
    gpu = f'{pod},gpu="0",uuid="GPU-k0"'
    info = f'{gpu},job_id="ns/train-0",scheduler="kubernetes",name="train"'
    series = [
        {"series": f"gpufeed_gpu_up{{{gpu}}}", "values": "1x2 0x10"},
        {"series": f"gpufeed_gpu_utilization_ratio{{{gpu}}}", "values": "0.3x12"},
        {"series": f"gpufeed_job_info{{{info}}}", "values": "1x12"},
        {"series": f"up{{{pod}}}", "values": "1x2 0x10"},
        # Another pod of the same scrape job, down: not a gpufeed agent.
        {"series": 'up{job="kubernetes-pods",instance="10.0.0.9:8080"}', "values": "0x12"},
    ]
    firing = 'count by (alertname) (ALERTS{alertstate="firing"})'

    def expect(t: str, *names: str) -> dict[str, Any]:
        samples = [{"labels": f'{{alertname="{n}"}}', "value": 1} for n in names]
        return {"expr": firing, "eval_time": t, "exp_samples": samples}

    tests = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                # One evaluation before and at each `for:` boundary: GpuLost 1m after the
                # GPU drops at 3m, GpufeedAgentDown 5m after the scrape fails at 3m, and
                # GpuUtilizationLow at the end of its 10m window.
                "promql_expr_test": [
                    expect("3m"),
                    expect("4m", "GpuLost"),
                    expect("7m", "GpuLost"),
                    expect("8m", "GpuLost", "GpufeedAgentDown"),
                    expect("9m", "GpuLost", "GpufeedAgentDown"),
                    expect("10m", "GpuLost", "GpufeedAgentDown", "GpuUtilizationLow"),
                ],
            }
        ],
    }
    site = write(tmp_path, f"selector: '{K8S_SELECTOR}'\n")
    rules = tmp_path / "site.rules.yml"
    assert build.main(["--config", str(site), "--out", str(rules)]) == 0
    site_result = _promtool_case(rules, tests, tmp_path)
    assert site_result.startswith("rc=0"), site_result

    shipped = tmp_path / "shipped.rules.yml"
    shipped.write_text(build.render(), encoding="utf-8")
    shipped_result = _promtool_case(shipped, tests, tmp_path)
    assert not shipped_result.startswith("rc=0"), "the default selector must not match these"
    assert "time: 10m" in shipped_result, shipped_result
