"""The scheduler collector's parsers and its one judgement, on recorded and fixture answers.

tests/fixtures/scheduler/slurm-22.05/ was recorded from a real slurmctld 22.05.8 (Debian
bookworm, the cluster of tests/slurm_cluster.py) with jobs running and pending for GPUs;
captured_at is the unix time of the recording. tests/fixtures/scheduler/kubernetes/ holds a
v1 PodList and NodeList in the API server's shape (kubectl get --raw /api/v1/pods): a pod
pending as Unschedulable, one bound but not started, one behind a scheduling gate, a
CPU-only one, a finished one; a cordoned node, a not-Ready node, a node without GPUs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufeed.model import iter_samples
from gpufeed.scheduler.backlog import NodeGpus, PendingJob, SchedulerReading, backlog_reason
from gpufeed.scheduler.collector import scheduler_families
from gpufeed.scheduler.kubernetes import KubernetesError, parse_nodes, parse_pods
from gpufeed.scheduler.slurm import (
    SlurmError,
    gpus_in_gres,
    gpus_in_tres,
    parse_sdiag,
    parse_sinfo_json,
    parse_sinfo_text,
    parse_squeue_json,
    parse_squeue_text,
)

FIX = Path(__file__).parent / "fixtures" / "scheduler"
SLURM = FIX / "slurm-22.05"
K8S = FIX / "kubernetes"


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("gres:gpu:3", 3),
        ("gres:gpu:a100:2", 2),
        ("gres/gpu:4", 4),
        ("gres/gpu=8", 8),
        ("cpu=4,mem=1G,gres/gpu=2,node=1", 2),
        ("gres:gpu:h100:2,gres:gpu:a100:1", 3),
        ("gres:mps:100", 0),
        ("cpu=1,mem=1M", 0),
        ("", 0),
    ],
)
def test_gpus_in_tres(text: str, gpus: int) -> None:
    assert gpus_in_tres(text) == gpus


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("gpu:4", 4),
        ("gpu:3(IDX:0-2)", 3),
        ("gpu:a100:2(S:0),gpu:h100:2(S:1)", 4),
        ("gpu:a100:1(IDX:0),mps:0", 1),
        ("(null)", 0),
        ("", 0),
    ],
)
def test_gpus_in_gres(text: str, gpus: int) -> None:
    assert gpus_in_gres(text) == gpus


def test_recorded_squeue_of_a_real_slurm() -> None:
    now = float((SLURM / "captured_at").read_text())
    jobs = {j.job_id: j for j in parse_squeue_json((SLURM / "squeue.json").read_text(), now)}
    # running jobs 1-2 and the CPU-only job 4 are not pending GPU jobs
    assert sorted(jobs) == ["3", "5", "6", "7"]
    assert (jobs["3"].reason, jobs["3"].gpus_per_node, jobs["3"].gpus_total) == ("Resources", 3, 3)
    assert (jobs["5"].gpus_per_node, jobs["5"].gpus_total) == (0, 2)  # --gpus=2: per job
    assert (jobs["6"].nodes, jobs["6"].gpus_per_node, jobs["6"].gpus_total) == (2, 2, 4)
    assert jobs["7"].reason == "JobHeldUser" and not jobs["7"].eligible
    assert jobs["3"].wait_seconds == 18.0 and jobs["3"].queue == "gpu"


def test_recorded_sinfo_and_sdiag_of_a_real_slurm() -> None:
    nodes = parse_sinfo_json((SLURM / "sinfo.json").read_text())
    assert nodes == (NodeGpus("gn1", 4, 3, True), NodeGpus("gn2", 4, 2, True))
    (main,) = parse_sdiag((SLURM / "sdiag.txt").read_text())
    assert (main.cycle, main.last_seconds, main.mean_seconds) == ("main", 93e-6, 274e-6)


def test_recorded_format_string_answers_of_a_real_slurm() -> None:
    """The fallback for a Slurm without JSON: `squeue -O`/`sinfo -O` (slurm.SQUEUE_FORMAT,
    SINFO_FORMAT) recorded from the same real Slurm (timestamps in its local time, UTC)."""
    now = float((SLURM / "captured_format_at").read_text())
    jobs = parse_squeue_text((SLURM / "squeue-format.txt").read_text(), now)
    assert [(j.job_id, j.reason, j.nodes, j.gpus_per_node, j.gpus_total) for j in jobs] == [
        ("3", "Resources", 1, 3, 3),
        ("4", "Priority", 2, 2, 4),
        ("5", "Priority", 1, 0, 2),
    ]
    assert jobs[0].queue == "gpu"
    nodes = parse_sinfo_text((SLURM / "sinfo-format.txt").read_text())
    assert nodes == (NodeGpus("gn1", 4, 3, True), NodeGpus("gn2", 4, 2, True))
    drained = parse_sinfo_text("gn3|gpu:8|gpu:0|idle+drain|\ngn4|gpu:8|gpu:0|idle*|\n")
    assert [n.schedulable for n in drained] == [False, False]
    with pytest.raises(SlurmError, match="line 1 has 3 fields"):
        parse_squeue_text("1|gpu|x\n", now)


def test_newer_slurm_json_shapes() -> None:
    """23.11+ (openapi v0.0.40): numbers as {set, number}, states as lists."""
    squeue = {
        "errors": [],
        "jobs": [
            {
                "job_id": 42,
                "job_state": ["PENDING"],
                "state_reason": "Resources",
                "partition": "h100",
                "node_count": {"set": True, "infinite": False, "number": 2},
                "tres_per_node": "gres/gpu:8",
                "submit_time": {"set": True, "infinite": False, "number": 1000},
                "eligible_time": {"set": True, "infinite": False, "number": 1100},
            }
        ],
    }
    (job,) = parse_squeue_json(json.dumps(squeue), 1400.0)
    assert (job.nodes, job.gpus_per_node, job.gpus_total, job.wait_seconds) == (2, 8, 16, 300.0)
    sinfo = {
        "errors": [],
        "nodes": [
            {"name": "h1", "state": ["IDLE", "DRAIN"], "gres": "gpu:h100:8", "gres_used": ""},
            {"name": "h2", "state": ["MIXED"], "gres": "gpu:h100:8", "gres_used": "gpu:h100:3"},
        ],
    }
    assert parse_sinfo_json(json.dumps(sinfo)) == (
        NodeGpus("h1", 8, 0, False),
        NodeGpus("h2", 8, 3, True),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("squeue: error: slurm_load_jobs error", "not JSON"),
        ('{"errors": [{"description": "Unable to contact slurm controller"}], "jobs": []}',
         "Unable to contact slurm controller"),
        ('{"meta": {}}', "no 'jobs' list"),
    ],
)  # fmt: skip
def test_bad_squeue_answers_are_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(SlurmError, match=message):
        parse_squeue_json(text, 0.0)


def test_kubernetes_pods_and_nodes() -> None:
    now = datetime(2026, 12, 1, 0, 30, tzinfo=UTC).timestamp()
    pending, allocated = parse_pods((K8S / "pods.json").read_text(), now)
    assert [(j.job_id, j.reason, j.gpus_total, j.wait_seconds) for j in pending] == [
        ("train/llama-ft-7xk2p", "Unschedulable", 4, 1200.0),
        ("train/resnet-dp-q8w4z", "Unschedulable", 2, 300.0),
        ("train/gated-9xk1", "SchedulingGated", 1, 120.0),  # an init container's GPU
    ]
    assert allocated == {"node-a": 7}  # running 6 + bound, not started 1; finished ones free
    nodes = parse_nodes((K8S / "nodes.json").read_text(), allocated)
    assert nodes == (
        NodeGpus("node-a", 8, 7, True),
        NodeGpus("node-b", 8, 0, False),  # cordoned
        NodeGpus("node-d", 4, 0, False),  # not Ready
    )
    reading = SchedulerReading("kubernetes", pending, nodes)
    # 1 GPU free; the gated pod would fit but cannot be scheduled: no backlog reason
    assert backlog_reason(reading) is None
    samples = {(s.name, s.labels): s.value for s in iter_samples(scheduler_families(reading, "k"))}
    assert samples[("gpufeed_scheduler_gpus", (("state", "unavailable"),))] == 12
    assert samples[("gpufeed_scheduler_pending_gpus", (("queue", "train"),))] == 7
    assert samples[("gpufeed_scheduler_pending_oldest_wait_seconds", (("queue", "train"),))] == 1200
    # Kubernetes reports no cycle time: absent, not zero
    assert not [k for k in samples if k[0].startswith("gpufeed_scheduler_cycle")]


def test_a_status_answer_is_not_a_pod_list() -> None:
    status = '{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403}'
    with pytest.raises(KubernetesError, match=r"expected a PodList.*'Status'"):
        parse_pods(status, 0.0)


def job(reason: str, nodes: int, per_node: int, total: int) -> PendingJob:
    return PendingJob("j", "q", reason, 10.0, nodes, per_node, total)


@pytest.mark.parametrize(
    ("free", "pending", "want"),
    [
        ((1, 2), [job("Resources", 1, 3, 3)], "fragmentation"),
        ((1, 2), [job("Priority", 1, 2, 2)], "stall"),
        ((2, 2), [job("Resources", 2, 2, 4)], "stall"),  # two nodes with 2 each
        ((3, 1), [job("Resources", 2, 2, 4)], "fragmentation"),
        ((2, 1), [job("Priority", 2, 0, 3)], "stall"),  # --gpus=3 over 2 nodes
        ((1, 1), [job("Resources", 1, 0, 2)], "fragmentation"),
        ((1, 2), [job("Resources", 1, 4, 4)], None),  # too few free in all
        ((4, 4), [job("JobHeldUser", 1, 1, 1)], None),  # cannot start anyway
        ((0, 0), [job("Resources", 1, 1, 1)], None),
        ((4, 4), [], None),
    ],
)
def test_backlog_reason(free: tuple[int, ...], pending: list[PendingJob], want: str) -> None:
    nodes = tuple(NodeGpus(f"n{i}", 8, 8 - f, True) for i, f in enumerate(free))
    assert backlog_reason(SchedulerReading("slurm", tuple(pending), nodes)) == want
