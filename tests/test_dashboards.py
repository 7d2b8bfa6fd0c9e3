"""Dashboards: every one renders, the committed JSON matches the code, and every query is
valid PromQL over contract metrics (or the recording rules in alerts/)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from dashboards import build
from stack_support import (
    EXTRA_METRICS,
    REPO_ROOT,
    catalogue_metrics,
    expand_grafana_vars,
    grafana_queries,
    metric_names,
    promtool_check_exprs,
    recorded_names,
)

EXPECTED_UIDS = {
    "fleet": "gpufeed-fleet",
    "node": "gpufeed-node",
    "job": "gpufeed-job",
    "storage": "gpufeed-storage",
}


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    """Dashboard name -> its JSON, rendered from the *.dashboard.py files."""
    return {
        build.dashboard_name(p): json.loads(build.render(build.load_dashboard(p)))
        for p in build.dashboard_files()
    }


def all_queries(boards: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {where: expr for b in boards.values() for where, expr in grafana_queries(b)}


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_every_dashboard_renders_with_its_stable_uid(boards: dict[str, dict[str, Any]]) -> None:
    assert {name: b["uid"] for name, b in boards.items()} == EXPECTED_UIDS
    for name, board in boards.items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        assert panels(board), f"{name}: no panels"
        for p in panels(board):
            pos = p["gridPos"]
            assert pos["x"] + pos["w"] <= 24, f"{name}/{p['title']}: off the grid"
            assert p["targets"], f"{name}/{p['title']}: no query"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for t in p["targets"]:
                assert t["datasource"] == p["datasource"]


def test_committed_json_matches_the_code() -> None:
    rendered = build.render_all()
    committed = {p.name: p.read_text(encoding="utf-8") for p in build.JSON_DIR.glob("*.json")}
    missing, orphans = (
        sorted(set(rendered) - set(committed)),
        sorted(set(committed) - set(rendered)),
    )
    assert not missing, f"dashboards/json lacks {missing}: run `make dashboards` and commit it"
    assert not orphans, f"dashboards/json/{orphans} have no *.dashboard.py: remove them"
    for name, text in rendered.items():
        assert committed[name] == text, f"dashboards/json/{name} is stale: make dashboards"
    assert build.main(["--check"]) == 0


def test_drift_check_notices_a_changed_file(tmp_path: Any, monkeypatch: Any) -> None:
    # The check itself must be able to fail: point it at a copy with one edited file.
    for p in build.JSON_DIR.glob("*.json"):
        (tmp_path / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    edited = tmp_path / "fleet.json"
    edited.write_text(edited.read_text(encoding="utf-8").replace("Fleet", "Fleat"))
    monkeypatch.setattr(build, "JSON_DIR", tmp_path)
    assert build.main(["--check"]) == 1


def test_variables_datasource_instance_job_id_tier(boards: dict[str, dict[str, Any]]) -> None:
    seen: set[str] = set()
    for name, board in boards.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${datasource}", f"{name}: {v['name']}"
        seen.update(variables)
    assert {"datasource", "instance", "job_id", "tier"} <= seen
    # Every variable a query refers to exists on that dashboard.
    for board in boards.values():
        defined = {v["name"] for v in board["templating"]["list"]}
        for where, expr in grafana_queries(board):
            used = set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval", "__range"}
            assert used <= defined, f"{where}: undefined variables {used - defined}"


def test_rates_use_rate_interval(boards: dict[str, dict[str, Any]]) -> None:
    for where, expr in all_queries(boards).items():
        for window in re.findall(r"\[([^\]]*)\]", expr):
            assert window in {"$__rate_interval", "$__range"}, f"{where}: range [{window}]"


def test_every_query_uses_contract_metrics_only(boards: dict[str, dict[str, Any]]) -> None:
    allowed = catalogue_metrics() | recorded_names() | EXTRA_METRICS
    used: dict[str, set[str]] = {}
    for where, expr in all_queries(boards).items():
        names = metric_names(expand_grafana_vars(expr))
        assert names, f"{where}: selects no metric"
        for n in names - allowed:
            used.setdefault(n, set()).add(where)
    assert not used, f"names outside the contract and the recording rules: {used}"


def test_every_query_is_valid_promql(boards: dict[str, dict[str, Any]]) -> None:
    result = promtool_check_exprs(
        {where: expand_grafana_vars(expr) for where, expr in all_queries(boards).items()}
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_checks_reject_bad_queries() -> None:
    # The two checks above must be able to fail.
    assert metric_names('sum by (tier) (rate(gpufeed_storage_reed_bytes_total{tier="x"}[1m]))') == {
        "gpufeed_storage_reed_bytes_total"
    }
    bad = promtool_check_exprs({"missing paren": "sum(rate(gpufeed_gpu_up[1m])"})
    assert bad.returncode != 0


def test_issue_content(boards: dict[str, dict[str, Any]]) -> None:
    """The panels the issue asks for, by what they query."""

    def exprs(name: str) -> str:
        return "\n".join(t["expr"] for p in panels(boards[name]) for t in p["targets"])

    fleet = boards["fleet"]
    heat = [p for p in panels(fleet) if p["type"] == "heatmap"]
    assert heat and "gpufeed_gpu_utilization_ratio" in heat[0]["targets"][0]["expr"]
    stacked = [
        p
        for p in panels(fleet)
        if p["type"] == "timeseries"
        and p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        and "underutilized_seconds" in p["targets"][0]["expr"]
    ]
    assert stacked, "fleet: GPU-hours lost by cause, stacked"
    for needle in ("topk(10", "gpufeed_gpu_underutilization_cause", "xid", "gpu_lost"):
        assert needle in exprs("fleet"), needle
    for needle in (
        "sm_active",
        "memory_bandwidth",
        "nvlink",
        "pcie",
        "sm_clock",
        "clock_event",
        "power",
        "temperature",
        "reads_completed",
        "io_time_weighted",
        "free_bytes",
        "network_speed",
        "transmit_wait",
        "host_cpu",
        "pressure",
    ):
        assert needle in exprs("node"), needle
    node_annotations = [a for a in boards["node"]["annotations"]["list"] if "expr" in a]
    assert node_annotations[0]["expr"].startswith("gpufeed_gpu_underutilization_cause")
    for needle in (
        "phase",
        "steps",
        "checkpoint_seconds",
        "checkpoint_written",
        "epoch",
        "job_storage",
    ):
        assert needle in exprs("job"), needle
    for needle in (
        "read_bytes",
        "reads_completed",
        "read_time",
        "io_time_weighted",
        "capacity",
        "job_id",
    ):
        assert needle in exprs("storage"), needle
    assert (REPO_ROOT / "dashboards" / "presets.py").is_file()
