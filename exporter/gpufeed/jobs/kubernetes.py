"""A Kubernetes pod's namespace, name and container names, from the kubelet's log paths.

A Kubernetes job is identified by its pod UID, read from the cgroup of its processes
(gpufeed.jobs.identity); people know pods by namespace and name. The kubelet keeps, for
every pod on the node, a log directory named after all three (`BuildPodLogsDirectory` in
kubernetes pkg/kubelet/kuberuntime/helpers.go), and for every container a symlink to that
container's log inside it (`legacyLogSymlink`, kuberuntime_container.go):

    /var/log/pods/<namespace>_<pod name>_<pod uid>/<container name>/<restart>.log
    /var/log/containers/<pod name>_<namespace>_<container name>-<container id>.log
        -> /var/log/pods/<namespace>_<pod name>_<pod uid>/<container name>/<restart>.log

Only names are read (directory listings and link targets, never a log's content): this needs
no API server, no service-account token and no gRPC, whatever the container runtime. A
namespace is a DNS label and a pod name a DNS subdomain, neither can hold `_`, so the split
is exact; a name that does not fit is skipped, and what is not found stays unknown (the
caller leaves its labels out). docs/jobs.md says why not the kubelet's pod-resources API.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

POD_LOGS_DIR = "/var/log/pods"  # the kubelet's podLogsDir default
CONTAINER_LOGS_DIR = "/var/log/containers"  # fixed in the kubelet
MAX_ENTRIES = 20000  # a listing longer than this is cut: a node runs at most a few hundred pods

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_HEX = "[0-9a-f]"
_UID = re.compile(rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}|{_HEX}{{32}}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class ContainerLog:
    pod_uid: str
    container: str


def parse_pod_logs_dir_name(entry: str) -> tuple[str, PodName] | None:
    """(pod uid, pod) from a `/var/log/pods` entry `<namespace>_<name>_<uid>`."""
    parts = entry.split("_")
    if len(parts) != 3:
        return None
    namespace, name, uid = parts
    if not (
        _DNS_LABEL.fullmatch(namespace) and _DNS_SUBDOMAIN.fullmatch(name) and _UID.fullmatch(uid)
    ):
        return None
    return uid, PodName(namespace, name)


def parse_container_log_link(entry: str, target: str) -> tuple[str, ContainerLog] | None:
    """(container id, its pod and name) from a `/var/log/containers` symlink and its target.

    The id comes from the link's name (`...-<64 hex>.log`); the pod UID and container name
    from the target, since the kubelet shortens a link name that would pass 255 bytes by
    cutting its front, which holds the container's name."""
    stem = entry.removesuffix(".log")
    cid = stem.rpartition("-")[2]
    if stem == entry or not _CONTAINER_ID.fullmatch(cid):
        return None
    path = PurePosixPath(target)
    if len(path.parts) < 3 or not path.name.endswith(".log"):
        return None
    container, pod_dir = path.parent.name, path.parent.parent.name
    pod = parse_pod_logs_dir_name(pod_dir)
    if pod is None or not _DNS_LABEL.fullmatch(container):
        return None
    return cid, ContainerLog(pod[0], container)


def read_pod_names(pods_dir: Path) -> dict[str, PodName]:
    """Pod uid -> namespace and name, for every pod log directory; {} if unreadable."""
    out: dict[str, PodName] = {}
    for entry in _names(pods_dir):
        got = parse_pod_logs_dir_name(entry)
        if got is not None:
            out[got[0]] = got[1]
    return out


def read_container_logs(containers_dir: Path) -> dict[str, ContainerLog]:
    """Container id -> pod uid and container name, from the symlinks; {} if unreadable."""
    out: dict[str, ContainerLog] = {}
    for entry in _names(containers_dir):
        try:
            target = os.readlink(containers_dir / entry)
        except OSError:
            continue
        got = parse_container_log_link(entry, target)
        if got is not None:
            out[got[0]] = got[1]
    return out


def _names(directory: Path) -> list[str]:
    try:
        with os.scandir(directory) as it:
            names = []
            for e in it:
                names.append(e.name)
                if len(names) >= MAX_ENTRIES:
                    break
            return names
    except OSError:
        return []


@dataclass(frozen=True, slots=True)
class PodRef:
    """What is known of a job's pod; `container` is None where it is not known."""

    namespace: str
    name: str
    container: str | None


class PodDirectory:
    """Looks pods and containers up by uid and id. The kubelet's directories are listed
    again when something asked for is missing (a pod started since the last listing), at
    most once per `lookup`, and for what was still missing after a listing (no such
    directory here, a runtime without the symlinks) at most every RETRY_SECONDS. Not
    thread-safe: one collector uses it."""

    RETRY_SECONDS = 30.0

    def __init__(self, rootfs: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._pods_dir = rootfs / POD_LOGS_DIR.lstrip("/")
        self._containers_dir = rootfs / CONTAINER_LOGS_DIR.lstrip("/")
        self._clock = clock
        self._pods: dict[str, PodName] = {}
        self._containers: dict[str, ContainerLog] = {}
        # what a listing did not find, and when it was listed
        self._pods_missing: tuple[frozenset[str], float] = (frozenset(), 0.0)
        self._containers_missing: tuple[frozenset[str], float] = (frozenset(), 0.0)

    def lookup(self, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], PodRef]:
        """(pod uid, container id or "") -> PodRef, for the pairs whose pod is found."""
        uids = {uid for uid, _ in wanted}
        if self._should_list(uids - self._pods.keys(), self._pods_missing):
            self._pods = read_pod_names(self._pods_dir)
            self._pods_missing = (frozenset(uids - self._pods.keys()), self._clock())
        cids = {cid for _, cid in wanted if cid}
        if self._should_list(cids - self._containers.keys(), self._containers_missing):
            self._containers = read_container_logs(self._containers_dir)
            self._containers_missing = (frozenset(cids - self._containers.keys()), self._clock())
        out: dict[tuple[str, str], PodRef] = {}
        for uid, cid in wanted:
            pod = self._pods.get(uid)
            if pod is None:
                continue
            log = self._containers.get(cid) if cid else None
            container = log.container if log is not None and log.pod_uid == uid else None
            out[(uid, cid)] = PodRef(pod.namespace, pod.name, container)
        return out

    def _should_list(self, missing: set[str], known: tuple[frozenset[str], float]) -> bool:
        if not missing:
            return False
        return not missing <= known[0] or self._clock() - known[1] >= self.RETRY_SECONDS
