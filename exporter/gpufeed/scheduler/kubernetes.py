"""Kubernetes: pods that pend for GPUs and the GPUs of each node, from the API server.

Read with a read-only service account (deploy/kubernetes/scheduler-rbac.yaml: get/list on
pods and nodes, nothing else). A pod pends for GPUs while it is `Pending` with no node
assigned and asks for an extended GPU resource (`nvidia.com/gpu`, `amd.com/gpu`, ...); a
node's GPUs are its allocatable count, allocated to the pods bound to it that have not
finished. Extended resources cannot be overcommitted, so a limit alone is the request.
The scheduler's cycle time is not in the API (kube-scheduler exports it on its own
/metrics as scheduler_scheduling_attempt_duration_seconds): it is left out, not zero.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufeed.scheduler.backlog import NodeGpus, PendingJob, SchedulerReading

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "habana.ai/gaudi")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PAGE_LIMIT = 500


class KubernetesError(RuntimeError):
    """The API server refused or answered something that is not a list of the kind asked."""


def _gpus(resources: Any) -> int:
    if not isinstance(resources, dict):
        return 0
    for part in ("limits", "requests"):  # equal where both are set (extended resources)
        values = resources.get(part)
        if isinstance(values, dict):
            got = sum(_count(values.get(r)) for r in GPU_RESOURCES)
            if got:
                return got
    return 0


def _count(x: Any) -> int:
    try:
        return int(str(x)) if x is not None else 0
    except ValueError:
        return 0  # "1k" and the like are not GPU counts a device plugin hands out


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod asks for: its containers' sum, or its largest init container's if more."""
    spec = pod.get("spec") or {}
    main = sum(_gpus(c.get("resources")) for c in spec.get("containers") or [])
    init = max((_gpus(c.get("resources")) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


def _document(text: str, kind: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise KubernetesError(f"{kind}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        got = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise KubernetesError(f"expected a {kind}, the API server answered {got!r}")
    return doc


def _items(text: str, kind: str) -> list[dict[str, Any]]:
    return [i for i in _document(text, kind).get("items") or [] if isinstance(i, dict)]


def _timestamp(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_pods(text: str, now_seconds: float) -> tuple[tuple[PendingJob, ...], dict[str, int]]:
    """From a v1 PodList: the pods that pend for GPUs, and GPUs allocated per node."""
    pending: list[PendingJob] = []
    allocated: dict[str, int] = {}
    for pod in _items(text, "PodList"):
        gpus = pod_gpus(pod)
        if gpus <= 0:
            continue
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        phase = status.get("phase", "")
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if phase in ("Succeeded", "Failed"):
            continue
        if node:
            allocated[node] = allocated.get(node, 0) + gpus
            continue
        if phase != "Pending":
            continue
        reason = "Pending"
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                reason = str(c.get("reason") or reason)
        created = _timestamp(str(meta.get("creationTimestamp") or ""))
        pending.append(
            PendingJob(
                job_id=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                queue=str(meta.get("namespace") or ""),
                reason=reason,
                wait_seconds=max(now_seconds - created, 0.0) if created is not None else 0.0,
                nodes=1,
                gpus_per_node=gpus,
                gpus_total=gpus,
            )
        )
    return tuple(pending), allocated


def parse_nodes(text: str, allocated: Mapping[str, int]) -> tuple[NodeGpus, ...]:
    """From a v1 NodeList: every node with allocatable GPUs; a cordoned or not-Ready node's
    GPUs are not schedulable."""
    out: list[NodeGpus] = []
    for n in _items(text, "NodeList"):
        name = str((n.get("metadata") or {}).get("name") or "")
        status = n.get("status") or {}
        total = sum(_count((status.get("allocatable") or {}).get(r)) for r in GPU_RESOURCES)
        if total <= 0:
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        cordoned = bool((n.get("spec") or {}).get("unschedulable"))
        out.append(NodeGpus(name, total, allocated.get(name, 0), ready and not cordoned))
    return tuple(sorted(out, key=lambda x: x.name))


@dataclass(frozen=True, slots=True)
class KubernetesReader:
    """Lists pods and nodes from the API server (paged); in a pod, the service account's
    token and CA are the defaults."""

    api_url: str = "https://kubernetes.default.svc"
    token_file: str = f"{SA_DIR}/token"
    ca_file: str = f"{SA_DIR}/ca.crt"
    timeout_seconds: float = 10.0

    def read(self, now_seconds: float) -> SchedulerReading:
        fields = "status.phase!=Succeeded,status.phase!=Failed"
        pods_text = self._list("/api/v1/pods", "PodList", {"fieldSelector": fields})
        pending, allocated = parse_pods(pods_text, now_seconds)
        nodes = parse_nodes(self._list("/api/v1/nodes", "NodeList", {}), allocated)
        return SchedulerReading("kubernetes", pending, nodes)

    def _list(self, path: str, kind: str, query: Mapping[str, str]) -> str:
        """Every page of a list, joined into one list document."""
        items: list[Any] = []
        cont = ""
        while True:
            q = {**query, "limit": str(PAGE_LIMIT), **({"continue": cont} if cont else {})}
            doc = _document(self._get(f"{path}?{urllib.parse.urlencode(q)}", kind), kind)
            items += doc.get("items") or []
            cont = str((doc.get("metadata") or {}).get("continue") or "")
            if not cont:
                return json.dumps({"kind": kind, "items": items})

    def _get(self, path_query: str, kind: str) -> str:
        headers = {"Accept": "application/json"}
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            except OSError as e:
                raise KubernetesError(f"token {self.token_file}: {e.strerror or e}") from None
        ctx = None
        if self.api_url.startswith("https:"):
            try:
                ctx = ssl.create_default_context(cafile=self.ca_file or None)
            except OSError as e:
                raise KubernetesError(f"CA {self.ca_file}: {e.strerror or e}") from None
        req = urllib.request.Request(self.api_url.rstrip("/") + path_query, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_seconds, context=ctx) as r:
                return str(r.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            raise KubernetesError(f"listing {kind}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", None) or e
            raise KubernetesError(f"listing {kind}: {why}") from None
