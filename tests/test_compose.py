"""The compose stack's configs: checked by promtool and amtool (real binaries), routing by
cause tested through amtool's route tester, and the compose files wired consistently."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import config as alerts_config
from gpufeed.cli import build_parser
from gpufeed.vocabulary import DataSource
from stack_support import (
    REPO_ROOT,
    alertmanager_config_for_test,
    prometheus_config_for_test,
    promtool,
)

COMPOSE = REPO_ROOT / "compose"
PROMETHEUS_YML = COMPOSE / "prometheus" / "prometheus.yml"
ALERTMANAGER_YML = COMPOSE / "alertmanager" / "alertmanager.yml"
AGENT_PORT = 9842


def amtool() -> str:
    path = shutil.which("amtool")
    assert path, "amtool not found (Debian package prometheus-alertmanager)"
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_prometheus_config_checks_clean_with_the_rules() -> None:
    result = run(promtool(), "check", "config", str(PROMETHEUS_YML))
    assert result.returncode == 0, result.stdout + result.stderr
    # The rule file is found and checked through the config, as the container loads it.
    assert "gpufeed.rules.yml" in result.stdout
    assert "1 rule files found" in result.stdout


def test_alertmanager_config_checks_clean() -> None:
    result = run(amtool(), "check-config", str(ALERTMANAGER_YML))
    assert result.returncode == 0, result.stdout + result.stderr


# Where every alert goes: (alertname, cause or None) -> receiver. The severity comes from
# the generated rules, so a severity changed there is routed as it will be in production.
ROUTES = {
    ("GpuLost", None): "oncall-pager",
    ("GpuFatalXid", None): "oncall-pager",
    ("StorageMountStuck", None): "storage-pager",
    ("StorageTierSaturated", None): "storage-owners",
    ("StorageTierLatencyHigh", None): "storage-owners",
    ("StorageTierMissesTarget", None): "storage-owners",
    ("StorageTierFillingUp", None): "storage-owners",
    ("StorageTierPathMissing", None): "storage-owners",
    ("FabricCongested", None): "network-team",
    ("FabricJitterHigh", None): "network-team",
    ("SchedulerBacklogWithIdleGpus", None): "oncall",
    ("GpuUtilizationLow", "data_loading"): "storage-owners",
    ("GpuUtilizationLow", "checkpointing"): "storage-owners",
    ("GpuUtilizationLow", "network"): "network-team",
    ("GpuUtilizationLow", "preprocessing"): "job-owners",
    ("GpuUtilizationLow", "throttling"): "oncall",
    ("GpuUtilizationLow", "startup"): "oncall",
    ("GpuUtilizationLow", "idle"): "oncall",
    ("GpuUtilizationLow", "gpu_error"): "oncall",
    ("GpuUtilizationLow", "straggler"): "oncall",
    # never fires (GpuUtilizationLow leaves low_demand GPUs out); the serving owners if it did
    ("GpuUtilizationLow", "low_demand"): "serving-owners",
    ("InferenceSaturated", None): "serving-owners",
    ("InferenceIdleNoDemand", None): "serving-owners",
    ("GpuUtilizationLow", "unknown"): "oncall",
    ("GpuJobHeldBack", "data_loading"): "storage-owners",
    ("GpuJobHeldBack", "checkpointing"): "storage-owners",
    ("GpuJobHeldBack", "network"): "network-team",
    ("GpuJobHeldBack", "preprocessing"): "job-owners",
    ("GpuJobHeldBack", "throttling"): "oncall",
    ("GpuJobHeldBack", "unknown"): "oncall",
    ("GpuJobRankLost", None): "oncall",  # warning: falls through to on-call
    ("GpuJobImbalanced", None): "job-owners",  # the job's owners, never on-call
    ("GpuClockThrottled", None): "oncall",
    ("GpufeedAgentDown", None): "oncall",
    ("GpufeedCollectorFailing", None): "oncall",
    ("GpufeedSamplerStalled", None): "oncall",
    ("GpufeedSdkMessagesDropped", None): "oncall",
    ("GpufeedWindowsLogFailing", None): "oncall",
    ("GpufeedWindowsLogLinesSkipped", None): "oncall",
}
PAGERS = {"oncall-pager", "storage-pager"}


def shipped_severities() -> dict[str, str]:
    doc = load(REPO_ROOT / "alerts" / "gpufeed.rules.yml")
    return {
        r["alert"]: r["labels"]["severity"]
        for g in doc["groups"]
        for r in g["rules"]
        if "alert" in r
    }


def test_every_alert_has_a_route_case() -> None:
    assert {name for name, _ in ROUTES} == set(shipped_severities())
    causes = set(alerts_config.CAUSE_HINTS)
    assert {c for n, c in ROUTES if n == "GpuUtilizationLow"} == causes


@pytest.mark.parametrize(("alert", "receiver"), sorted(ROUTES.items(), key=str))
def test_alertmanager_routes_by_severity_owner_and_cause(
    alert: tuple[str, str | None], receiver: str
) -> None:
    name, cause = alert
    labels = [f"alertname={name}", f"severity={shipped_severities()[name]}", "instance=n1:9842"]
    labels += [f"cause={cause}"] if cause else []
    result = run(amtool(), "config", "routes", "test", f"--config.file={ALERTMANAGER_YML}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [receiver]
    assert (shipped_severities()[name] == "critical") == (receiver in PAGERS), name


# data_loading by where its wait is (the gauge's data_source, which the alert carries):
# the job's own input pipeline goes to its owners, a storage stall to the storage owners.
DATA_SOURCE_ROUTES = {
    "input_pipeline": "job-owners",
    "storage": "storage-owners",
}


@pytest.mark.parametrize(("source", "receiver"), sorted(DATA_SOURCE_ROUTES.items()))
def test_a_data_stall_routes_by_where_its_wait_is(source: str, receiver: str) -> None:
    assert {str(d) for d in DataSource} == set(DATA_SOURCE_ROUTES)
    labels = ["alertname=GpuUtilizationLow", "severity=warning", "instance=n1:9842"]
    labels += ["cause=data_loading", f"data_source={source}", "job_id=r-1"]
    result = run(amtool(), "config", "routes", "test", f"--config.file={ALERTMANAGER_YML}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [receiver]


def test_critical_alerts_have_receivers_and_groups_of_their_own() -> None:
    """A GPU loss never waits in, or is batched with, a group of warnings: the critical
    routes' receivers take nothing else, and they group per GPU or mount, not by cause."""
    route = load(ALERTMANAGER_YML)["route"]
    critical = [r for r in route["routes"] if 'severity="critical"' in r["matchers"]]
    others = [r for r in route["routes"] if r not in critical]
    assert {r["receiver"] for r in critical} == PAGERS
    assert not PAGERS & ({r["receiver"] for r in others} | {route["receiver"]})
    for r in critical:
        assert "cause" not in r["group_by"] and "instance" in r["group_by"], r
        assert r["group_by"] != route["group_by"]
        assert r.get("continue", False) is False
    gpu = next(r for r in critical if r["receiver"] == "oncall-pager")
    assert "gpu" in gpu["group_by"]


def test_compose_services_are_wired_together() -> None:
    compose = load(COMPOSE / "docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"agent", "fleet", "prometheus", "alertmanager", "grafana"}

    agent = services["agent"]
    assert agent["command"][:2] == ["agent", "--simulate"]
    assert f"0.0.0.0:{AGENT_PORT}" in agent["command"]
    assert (COMPOSE / agent["build"]["context"] / agent["build"]["dockerfile"]).is_file()

    prom = load(PROMETHEUS_YML)
    scrape = {c["job_name"]: c for c in prom["scrape_configs"]}
    assert scrape["gpufeed"]["static_configs"][0]["targets"] == [f"agent:{AGENT_PORT}"]
    # the fleet service reads this Prometheus and is scraped by it as the rules' fleet job
    fleet = build_parser().parse_args(services["fleet"]["command"])
    assert fleet.command == "fleet" and fleet.url == "http://prometheus:9090"
    fleet_port = fleet.listen_address.rpartition(":")[2]
    assert scrape["gpufeed-fleet"]["static_configs"][0]["targets"] == [f"fleet:{fleet_port}"]
    assert alerts_config.RulesConfig().fleet_selector == 'job="gpufeed-fleet"'
    assert services["fleet"]["image"] == services["agent"]["image"]
    am_targets = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am_targets == ["alertmanager:9093"]

    # Every bind mount exists in the repository, and Prometheus reads its config and rules
    # where they are mounted.
    mounts: dict[str, dict[str, Path]] = {}
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), f"{name}: {source} missing"
                mounts.setdefault(name, {})[target] = (COMPOSE / source).resolve()
    config_flag = next(
        a for a in services["prometheus"]["command"] if a.startswith("--config.file=")
    )
    config_in_container = Path(config_flag.split("=", 1)[1])
    assert mounts["prometheus"][str(config_in_container)] == PROMETHEUS_YML.resolve()
    for rule_file in prom["rule_files"]:
        in_container = (config_in_container.parent / rule_file).resolve()
        assert (
            mounts["prometheus"][str(in_container)] == (PROMETHEUS_YML.parent / rule_file).resolve()
        )

    # Grafana: the datasource points at the prometheus service; the dashboards provider
    # reads the directory where dashboards/json is mounted.
    provisioning = COMPOSE / "grafana" / "provisioning"
    datasource = load(provisioning / "datasources" / "prometheus.yml")["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    provider = load(provisioning / "dashboards" / "gpufeed.yml")["providers"][0]
    assert mounts["grafana"][provider["options"]["path"]] == (REPO_ROOT / "dashboards" / "json")
    assert mounts["grafana"]["/etc/grafana/provisioning"] == provisioning.resolve()


class _ComposeLoader(yaml.SafeLoader):
    """Compose's merge tags (`!reset`, `!override`) kept as markers."""


def _reset(loader: yaml.SafeLoader, node: yaml.Node) -> tuple[str, Any]:
    if isinstance(node, yaml.SequenceNode):
        return "!reset", loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return "!reset", loader.construct_mapping(node, deep=True)
    return "!reset", None


_ComposeLoader.add_constructor("!reset", _reset)


def test_nvidia_variant_uses_the_nvidia_runtime_and_real_gpus() -> None:
    variant = yaml.load(
        (COMPOSE / "docker-compose.nvidia.yml").read_text(encoding="utf-8"), _ComposeLoader
    )
    agent = variant["services"]["agent"]
    assert agent["runtime"] == "nvidia"
    assert "--simulate" not in agent["command"]
    assert any(a.startswith("--path.procfs=") for a in agent["command"])
    # Fabric metrics are per network namespace: the host's, not the container's veth.
    assert agent["network_mode"] == "host" and agent["pid"] == "host"
    assert agent["ports"] == ("!reset", [])  # a host-network container publishes nothing
    assert f"0.0.0.0:{AGENT_PORT}" in " ".join(agent["command"])
    # Prometheus still scrapes agent:9842 (prometheus.yml is shared): the name now points
    # at the host, where the agent listens.
    prom = load(PROMETHEUS_YML)
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == [f"agent:{AGENT_PORT}"]
    assert "agent:host-gateway" in variant["services"]["prometheus"]["extra_hosts"]
    dockerfile = (COMPOSE / "Dockerfile").read_text(encoding="utf-8")
    assert 'ENTRYPOINT ["gpufeed"]' in dockerfile
    assert f"EXPOSE {AGENT_PORT}" in dockerfile


def test_end_to_end_copies_change_only_addresses_paths_and_timings(tmp_path: Path) -> None:
    """The e2e test's copies of the compose configs stay valid and keep everything else.
    The addresses are only written into configs, never contacted (`.invalid` names)."""
    rules = tmp_path / "rules.yml"
    rules.write_text((REPO_ROOT / "alerts" / "gpufeed.rules.yml").read_text(encoding="utf-8"))
    prom = prometheus_config_for_test(
        PROMETHEUS_YML,
        agent="agent.invalid:9842",
        alertmanager="alertmanager.invalid:9093",
        rule_files=[str(rules)],
        interval="1s",
    )
    prom_path = tmp_path / "prometheus.yml"
    prom_path.write_text(yaml.safe_dump(prom))
    result = run(promtool(), "check", "config", str(prom_path))
    assert result.returncode == 0, result.stdout + result.stderr
    shipped = load(PROMETHEUS_YML)
    assert [c["job_name"] for c in prom["scrape_configs"]] == ["gpufeed"]
    assert prom["scrape_configs"][0]["static_configs"] == [{"targets": ["agent.invalid:9842"]}]
    assert set(prom) == set(shipped)

    am = alertmanager_config_for_test(
        ALERTMANAGER_YML, webhook_base="http://webhook.invalid:8080", group_wait="1s"
    )
    am_path = tmp_path / "alertmanager.yml"
    am_path.write_text(yaml.safe_dump(am))
    result = run(amtool(), "check-config", str(am_path))
    assert result.returncode == 0, result.stdout + result.stderr
    original = load(ALERTMANAGER_YML)
    assert am["route"]["routes"] == original["route"]["routes"]
    assert am["inhibit_rules"] == original["inhibit_rules"]
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in am["receivers"]}
    receivers = ["oncall", "oncall-pager", "storage-owners", "storage-pager"]
    receivers += ["network-team", "job-owners", "serving-owners"]
    assert urls == {name: f"http://webhook.invalid:8080/{name}" for name in receivers}
