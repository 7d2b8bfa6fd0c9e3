"""Pod namespace, name and container from the kubelet's log directories (jobs/kubernetes.py).

The fixture node (tests/fixtures/k8s/node1) holds the names of a real kubeadm node's
`/var/log/pods` and `/var/log/containers` (kube-proxy, and the static kube-apiserver pod
whose UID is the manifest's 32-hex hash), with the symlinks pointing where the kubelet
points them, plus a link no kubelet made.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.jobs import JobsCollector, pod_labels
from gpufeed.gpu.backend import GpuIdentity, GpuProcess, GpuSample
from gpufeed.hostpaths import HostPaths
from gpufeed.jobs.identity import parse_cgroup
from gpufeed.jobs.kubernetes import (
    ContainerLog,
    PodDirectory,
    PodName,
    PodRef,
    parse_container_log_link,
    parse_pod_logs_dir_name,
    read_container_logs,
    read_pod_names,
)
from gpufeed.model import iter_samples

FIXTURES = Path(__file__).parent / "fixtures"
NODE = FIXTURES / "k8s" / "node1"
PROXY_UID = "81e09ae0-12ec-4ec5-94b8-51cda7906370"
PROXY_CID = "c269a18400e27b14085c57f8e36f5b4d5471c140eb27e8b0f632c056547555de"
API_UID = "33d556edd3ae8ef21980288cef77ae8b"
API_CID = "3959d7abfbd0221e5043fccbcb8040e9a1a4e6518dad483b7a33a131885e0283"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            f"kube-system_kube-proxy-6xsx9_{PROXY_UID}",
            (PROXY_UID, "kube-system", "kube-proxy-6xsx9"),
        ),
        (
            f"kube-system_kube-apiserver-controlplane_{API_UID}",
            (API_UID, "kube-system", "kube-apiserver-controlplane"),
        ),
        (
            f"ml_llm.pretrain-0_{PROXY_UID}",
            (PROXY_UID, "ml", "llm.pretrain-0"),
        ),  # dots: a subdomain
        (f"ml_a_b_{PROXY_UID}", None),  # `_` in no Kubernetes name: not the kubelet's
        (f"ML_pod_{PROXY_UID}", None),  # upper case: no namespace
        ("kube-system_kube-proxy-6xsx9_not-a-uid", None),
        ("lost+found", None),
        (f"ns_{'p' * 254}_{PROXY_UID}", None),  # longer than a DNS subdomain
    ],
)
def test_parse_pod_logs_dir_name(entry: str, expected: tuple[str, str, str] | None) -> None:
    got = parse_pod_logs_dir_name(entry)
    assert got == (None if expected is None else (expected[0], PodName(*expected[1:])))


@pytest.mark.parametrize(
    ("entry", "target", "expected"),
    [
        (
            f"kube-proxy-6xsx9_kube-system_kube-proxy-{PROXY_CID}.log",
            f"/var/log/pods/kube-system_kube-proxy-6xsx9_{PROXY_UID}/kube-proxy/0.log",
            (PROXY_CID, PROXY_UID, "kube-proxy"),
        ),
        (  # a name the kubelet cut to 255 bytes at its front: the target still says it all
            f"y-long-container-name-{PROXY_CID}.log",
            f"/var/log/pods/ns_pod_{PROXY_UID}/a-very-long-container-name/3.log",
            (PROXY_CID, PROXY_UID, "a-very-long-container-name"),
        ),
        (f"x_y_z-{PROXY_CID}.log", "/var/lib/docker/containers/abc/abc-json.log", None),
        (f"x_y_z-{PROXY_CID[:12]}.log", f"/var/log/pods/ns_p_{PROXY_UID}/c/0.log", None),
        (f"x_y_z-{PROXY_CID}", f"/var/log/pods/ns_p_{PROXY_UID}/c/0.log", None),
    ],
)
def test_parse_container_log_link(
    entry: str, target: str, expected: tuple[str, str, str] | None
) -> None:
    got = parse_container_log_link(entry, target)
    assert got == (None if expected is None else (expected[0], ContainerLog(*expected[1:])))


def test_read_the_fixture_node() -> None:
    assert read_pod_names(NODE / "var/log/pods") == {
        PROXY_UID: PodName("kube-system", "kube-proxy-6xsx9"),
        API_UID: PodName("kube-system", "kube-apiserver-controlplane"),
    }
    assert read_container_logs(NODE / "var/log/containers") == {
        PROXY_CID: ContainerLog(PROXY_UID, "kube-proxy"),
        API_CID: ContainerLog(API_UID, "kube-apiserver"),
    }
    assert read_pod_names(NODE / "no-such-dir") == {}
    assert read_container_logs(NODE / "no-such-dir") == {}


@pytest.mark.parametrize(
    ("fixture", "uid", "cid"),
    [
        ("k8s_containerd_full_id.txt", PROXY_UID, PROXY_CID),
        ("k8s_cgroupfs_static_pod_full_id.txt", API_UID, API_CID),
        ("k8s_crio_conmon.txt", "0b7632a2-a56e-4278-987a-22de18008dbe", ""),  # the monitor
        ("k8s_systemd_burstable.txt", "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab", ""),  # short id
    ],
)
def test_container_id_from_the_cgroup(fixture: str, uid: str, cid: str) -> None:
    got = parse_cgroup((FIXTURES / "cgroup" / fixture).read_text())
    assert got is not None
    assert (got.scheduler, got.job_id, got.container_id) == ("kubernetes", uid, cid)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pod_directory_lists_again_for_a_new_pod_and_seldom_for_a_missing_one(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    shutil.copytree(NODE, root, symlinks=True)
    clock = Clock()
    pods = PodDirectory(root, clock)
    proxy = (PROXY_UID, PROXY_CID)
    assert pods.lookup({proxy}) == {proxy: PodRef("kube-system", "kube-proxy-6xsx9", "kube-proxy")}
    new_uid = "0a1b2c3d-0000-4000-8000-000000000001"
    new = (new_uid, "")
    assert pods.lookup({proxy, new}) == {proxy: pods.lookup({proxy})[proxy]}  # not there yet
    (root / f"var/log/pods/ml_train-0_{new_uid}").mkdir()
    assert new not in pods.lookup({new})  # missing at the last listing: not listed again yet
    clock.now += PodDirectory.RETRY_SECONDS
    assert pods.lookup({new}) == {new: PodRef("ml", "train-0", None)}
    other = ("0a1b2c3d-0000-4000-8000-000000000002", "")
    (root / f"var/log/pods/ml_train-1_{other[0]}").mkdir()
    assert pods.lookup({other}) == {other: PodRef("ml", "train-1", None)}  # new: listed now


def test_a_container_of_another_pod_is_not_taken(tmp_path: Path) -> None:
    pods = PodDirectory(NODE)
    got = pods.lookup({(PROXY_UID, API_CID)})  # a container id from another pod's cgroup
    assert got == {(PROXY_UID, API_CID): PodRef("kube-system", "kube-proxy-6xsx9", None)}


def test_pod_labels_only_what_all_processes_agree_on() -> None:
    a = PodRef("ml", "train-0", "trainer")
    b = PodRef("ml", "train-0", "sidecar")
    full = {"k8s_namespace_name": "ml", "k8s_pod_name": "train-0"}
    assert pod_labels([a, a]) == {**full, "k8s_container_name": "trainer"}
    assert pod_labels([a, b]) == full
    assert pod_labels([a, PodRef("ml", "train-0", None)]) == full
    assert pod_labels([a, None]) == {}
    assert pod_labels([]) == {}


def test_job_info_carries_the_pod_where_the_kubelet_names_it() -> None:
    uuid0, uuid1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-1"
    samples = [
        GpuSample(GpuIdentity(0, uuid0, "NVIDIA H100", "550.54", "0000:00:00.0"),
                  processes=(GpuProcess(102), GpuProcess(103), GpuProcess(100))),
        GpuSample(GpuIdentity(1, uuid1, "NVIDIA H100", "550.54", "0000:01:00.0"),
                  processes=(GpuProcess(101),)),
    ]  # fmt: skip
    ctx = CollectorContext(paths=HostPaths(procfs=FIXTURES / "procfs_jobs", rootfs=NODE))
    got = {
        (s.label("gpu"), s.label("job_id")): {k: v for k, v in s.labels if k.startswith("k8s_")}
        for s in iter_samples(JobsCollector(ctx).collect_with(TickData(gpu_samples=tuple(samples))))
    }
    assert got == {
        ("0", PROXY_UID): {
            "k8s_namespace_name": "kube-system",
            "k8s_pod_name": "kube-proxy-6xsx9",
            "k8s_container_name": "kube-proxy",
        },
        ("0", API_UID): {
            "k8s_namespace_name": "kube-system",
            "k8s_pod_name": "kube-apiserver-controlplane",
            "k8s_container_name": "kube-apiserver",
        },
        ("0", "987654"): {},  # Slurm: no pod
        ("1", "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab"): {},  # a pod the kubelet does not list
    }
