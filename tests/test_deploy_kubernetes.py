"""The Kubernetes manifests: every built-in object validated (strict) against the Kubernetes
JSON schemas that kubernetes-validate ships, offline, for the oldest and the newest version
it knows; the ServiceMonitor against the subset of its CRD schema that we use; and the
objects wired to each other and to the agent (labels, ports, probes, flags, config)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpufeed.cli import build_parser
from gpufeed.config import parse_config
from stack_support import REPO_ROOT

MANIFESTS = REPO_ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.25.0", "1.37.0")  # oldest and newest schemas kubernetes-validate 1.37 ships
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def documents() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                out.append((path, doc))
    assert out, f"no manifests in {MANIFESTS}"
    return out


def one(kind: str, name: str = "gpufeed-agent") -> dict[str, Any]:
    found = [
        doc for _, doc in documents() if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = one("DaemonSet")["spec"]["template"]["spec"]
    return spec


def agent_container() -> dict[str, Any]:
    (container,) = [c for c in pod_spec()["containers"] if c["name"] == "agent"]
    return container


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("path", "doc"),
    [
        pytest.param(p, d, id=f"{p.name}:{d['kind']}")
        for p, d in documents()
        if d["kind"] not in CRD_KINDS  # custom resources: validated against their CRD below
    ],
)
def test_builtin_objects_validate_strictly(path: Path, doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{path.name}: {doc['kind']}: {exc.message}") from exc


# The part of the Prometheus Operator's ServiceMonitor CRD (monitoring.coreos.com/v1) that
# our manifest uses, with the CRD's types, enums and patterns; unknown fields are refused,
# as the API server's structural-schema pruning would drop them silently.
_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep"]},
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"},
        "replacement": {"type": "string"},
        "regex": {"type": "string"},
        "separator": {"type": "string"},
    },
}
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("name", ["gpufeed-agent", "gpufeed-fleet", "gpufeed-scheduler"])
def test_service_monitor_matches_its_crd_schema(name: str) -> None:
    jsonschema.validate(one("ServiceMonitor", name), SERVICE_MONITOR_SCHEMA)


def test_service_monitor_schema_refuses_a_misspelt_field() -> None:
    """The subset schema is strict enough to catch what the API server would drop."""
    bad = yaml.safe_load(yaml.safe_dump(one("ServiceMonitor")))
    bad["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SERVICE_MONITOR_SCHEMA)


def test_pod_is_probed_unprivileged_and_prioritised() -> None:
    spec, agent = pod_spec(), agent_container()
    port = {p["name"]: p["containerPort"] for p in agent["ports"]}["metrics"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert agent[probe]["httpGet"] == {"path": "/healthz", "port": port}
    assert spec["automountServiceAccountToken"] is False
    classes = {d["metadata"]["name"] for _, d in documents() if d["kind"] == "PriorityClass"}
    assert spec["priorityClassName"] in classes | {"system-node-critical"}
    security = agent["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    # The agent reads the node's network and processes: host namespaces.
    assert spec["hostNetwork"] is True and spec["hostPID"] is True


def test_agent_flags_and_config_are_accepted_by_the_agent(tmp_path: Path) -> None:
    agent = agent_container()
    args = build_parser().parse_args(agent["args"])
    assert args.command == "agent"
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    # Every --path.* flag points at a mounted host directory.
    for flag in (args.procfs, args.sysfs, args.rootfs):
        assert flag in mounts, f"{flag} is not mounted"
    config_volume = volumes[mounts[str(Path(args.config).parent)]]
    config_map = one("ConfigMap")
    assert config_volume["configMap"]["name"] == config_map["metadata"]["name"]
    parse_config(config_map["data"][Path(args.config).name], "ConfigMap agent.yaml")
    assert str(Path(args.sdk_socket).parent) in mounts


def scraped_port(
    service: dict[str, Any], monitor: dict[str, Any], container: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The Service's port the ServiceMonitor scrapes (checked to reach the container's
    port, in the Service's namespace), and the endpoint's relabelings by target label."""
    (svc_port,) = service["spec"]["ports"]
    assert svc_port["targetPort"] in {p["name"] for p in container["ports"]}
    sm = monitor["spec"]
    assert sm["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["namespace"] in sm["namespaceSelector"]["matchNames"]
    (endpoint,) = sm["endpoints"]
    assert endpoint["port"] == svc_port["name"]
    return svc_port, {r["targetLabel"]: r for r in endpoint["relabelings"]}


def test_service_and_service_monitor_select_the_agent_pods() -> None:
    daemonset, service, monitor = one("DaemonSet"), one("Service"), one("ServiceMonitor")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    svc_port, relabel = scraped_port(service, monitor, agent_container())
    # The alert rules' default selector, and the instance the DaemonSet gives the agent.
    assert relabel["job"]["replacement"] == "gpufeed"
    assert relabel["instance"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert relabel["instance"]["replacement"] == f"$1:{svc_port['port']}"


def kubernetes_args(container: dict[str, Any], node_name: str) -> list[str]:
    """The container's args as the kubelet expands them: `$(VAR)` from its env, values
    given literally or from the pod's spec.nodeName (the only field reference we use)."""
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, var
            env[var["name"]] = node_name
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], a)
        for a in container["args"]
    ]


def prometheus_relabel(rule: dict[str, Any], labels: dict[str, str]) -> str:
    """A `replace` relabelling's result, as Prometheus computes it (separator ";", regex
    "(.*)" anchored, unless the rule says otherwise)."""
    assert rule.get("action", "replace") == "replace"
    value = rule.get("separator", ";").join(labels[name] for name in rule["sourceLabels"])
    match = re.fullmatch(rule.get("regex", "(.*)"), value)
    assert match is not None, (rule, value)
    return match.expand(rule["replacement"].replace("$1", r"\1"))


def test_the_agents_instance_is_the_service_monitors_instance() -> None:
    """A node's series in Prometheus and its traces and windows carry one `instance`, so
    live, file and Prometheus analyses of the node join (issue 9, defect 5)."""
    node = "gpu-node-17.cluster.local"
    args = build_parser().parse_args(kubernetes_args(agent_container(), node))
    (endpoint,) = one("ServiceMonitor")["spec"]["endpoints"]
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    scraped = prometheus_relabel(relabel["instance"], {"__meta_kubernetes_pod_node_name": node})
    assert args.instance == scraped == f"{node}:9842"


def test_scheduler_exporter_reads_pods_and_nodes_and_nothing_else() -> None:
    """deploy/kubernetes/scheduler.yaml: one replica, a service account bound to a role that
    only reads pods and nodes, and arguments `gpufeed scheduler` accepts."""
    docs = [d for p, d in documents() if p.name == "scheduler.yaml"]
    kinds = {d["kind"]: d for d in docs}
    (rule,) = kinds["ClusterRole"]["rules"]
    assert set(rule["resources"]) == {"pods", "nodes"} and rule["apiGroups"] == [""]
    assert set(rule["verbs"]) <= {"get", "list", "watch"}
    binding = kinds["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == kinds["ClusterRole"]["metadata"]["name"]
    account = kinds["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    deployment = kinds["Deployment"]["spec"]
    assert deployment["replicas"] == 1
    pod = deployment["template"]["spec"]
    assert pod["serviceAccountName"] == account["name"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.kind) == ("scheduler", "kubernetes")
    port = int(args.listen_address.rpartition(":")[2])
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == port
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": port}


def test_scheduler_is_scraped_as_the_job_the_alert_rules_read() -> None:
    """SchedulerBacklogWithIdleGpus selects the scheduler's job: scraped through pod
    annotations it would be "kubernetes-pods" and the alert would never fire."""
    from alerts.config import RulesConfig

    docs = {d["kind"]: d for p, d in documents() if p.name == "scheduler.yaml"}
    pod = docs["Deployment"]["spec"]["template"]
    assert "prometheus.io/scrape" not in pod["metadata"].get("annotations", {})  # not twice
    service, monitor = docs["Service"], docs["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    _, relabel = scraped_port(service, monitor, container)
    job = relabel["job"]["replacement"]
    assert RulesConfig().scheduler_selector == f'job="{job}"'


def fleet_container() -> dict[str, Any]:
    (container,) = one("StatefulSet", "gpufeed-fleet")["spec"]["template"]["spec"]["containers"]
    return container


def test_fleet_runs_two_replicas_each_with_its_own_windows_log() -> None:
    """Two replicas (they agree without a leader), each resuming from its own durable log:
    a StatefulSet whose volume claim template holds the log's directory."""
    sts = one("StatefulSet", "gpufeed-fleet")
    assert sts["spec"]["replicas"] == 2
    fleet = fleet_container()
    args = build_parser().parse_args(fleet["args"])
    assert args.command == "fleet"
    assert args.url.startswith("http")
    mounts = {m["mountPath"]: m["name"] for m in fleet["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert mounts[str(Path(args.windows_log).parent)] in claims
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert fleet["securityContext"]["readOnlyRootFilesystem"] is True
    assert fleet["securityContext"]["capabilities"]["drop"] == ["ALL"]
    port = {p["name"]: p["containerPort"] for p in fleet["ports"]}["metrics"]
    assert args.listen_address == f":{port}"
    for probe in ("livenessProbe", "readinessProbe"):
        # not /healthz: it is 503 while the TSDB is down, and a restart would not help
        assert fleet[probe]["httpGet"] == {"path": "/metrics", "port": port}


def test_fleet_is_scraped_as_the_job_the_alert_rules_read() -> None:
    from alerts.config import RulesConfig

    sts = one("StatefulSet", "gpufeed-fleet")
    service, monitor = one("Service", "gpufeed-fleet"), one("ServiceMonitor", "gpufeed-fleet")
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    _, relabel = scraped_port(service, monitor, fleet_container())
    job = relabel["job"]["replacement"]
    assert RulesConfig().fleet_selector == f'job="{job}"'
    # each replica its own instance: two series per job, which the rules' `max by` folds
    assert relabel["instance"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]
