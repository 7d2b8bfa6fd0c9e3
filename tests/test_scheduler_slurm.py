"""`gpufeed scheduler --scheduler slurm` against a real slurmctld with two GPU nodes
(tests/slurm_cluster.py): jobs that hold GPUs, jobs that pend for them, and what the
exporter says about the queue, the free GPUs and why they stay idle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufeed.model import iter_samples
from gpufeed.scheduler.backlog import SchedulerReading
from gpufeed.scheduler.collector import scheduler_families
from gpufeed.scheduler.slurm import SlurmReader
from slurm_cluster import SlurmCluster, slurm_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def scheduler_once(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command: `gpufeed scheduler --scheduler slurm --once ARGS`."""
    argv = [sys.executable, "-m", "gpufeed", "scheduler", "--scheduler", "slurm", "--once"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60, check=False)


def exported(cluster: SlurmCluster) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The page of the real command, `gpufeed scheduler --once`, as {(name, labels): value}."""
    done = scheduler_once("--slurm.conf", str(cluster.conf))
    assert done.returncode == 0, done.stderr
    out = {}
    for line in done.stdout.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name, _, rest = head.partition("{")
            labels = tuple(tuple(kv.split("=", 1)) for kv in rest.rstrip("}").split(",") if kv)
            out[(name, tuple((k, v.strip('"')) for k, v in labels))] = float(value)
    return out


def test_fragmentation_then_stall_on_a_real_slurm(cluster: SlurmCluster, tmp_path: Path) -> None:
    # gn1 holds 3 of its 4 GPUs, gn2 2 of 4: 3 free in all, at most 2 on one node
    cluster.wait_state(cluster.sbatch("-N1", "-w", "gn1", "--gres=gpu:3", "-J", "run3"), "RUNNING")
    cluster.wait_state(cluster.sbatch("-N1", "-w", "gn2", "--gres=gpu:2", "-J", "run2"), "RUNNING")
    submitted = time.time()
    want3 = cluster.sbatch("-N1", "--gres=gpu:3", "-J", "want3")
    held = cluster.sbatch("-N1", "--gres=gpu:1", "-H", "-J", "held")  # cannot start: no stall
    cluster.wait_state(want3, "PENDING Resources")
    time.sleep(max(1.5 - (time.time() - submitted), 0.0))  # a wait the exporter must see
    page = exported(cluster)
    q = (("queue", "gpu"),)
    assert page[("gpufeed_scheduler_up", (("scheduler", "slurm"),))] == 1
    assert page[("gpufeed_scheduler_pending_jobs", (*q, ("reason", "Resources")))] == 1
    assert page[("gpufeed_scheduler_pending_jobs", (*q, ("reason", "JobHeldUser")))] == 1
    assert page[("gpufeed_scheduler_pending_gpus", q)] == 4
    oldest = page[("gpufeed_scheduler_pending_oldest_wait_seconds", q)]
    assert 1.0 <= oldest <= time.time() - submitted + 1.0
    assert page[("gpufeed_scheduler_gpus", (("state", "free"),))] == 3
    assert page[("gpufeed_scheduler_gpus", (("state", "allocated"),))] == 5
    assert page[("gpufeed_scheduler_node_free_gpus_max", ())] == 2
    # 3 GPUs free, but no node has the 3 the job asks on one node
    assert page[("gpufeed_scheduler_backlog_idle_gpus", (("reason", "fragmentation"),))] == 3
    assert page[("gpufeed_scheduler_cycle_seconds", (("cycle", "main"),))] > 0
    assert page[("gpufeed_scheduler_pending_wait_seconds_count", q)] == 2

    # A 2-GPU job fits on gn2 but waits behind want3 in the strict-order queue: a stall
    fits = cluster.sbatch("-N1", "--gres=gpu:2", "-J", "fits")
    cluster.wait_state(fits, "PENDING Priority")
    reading = SlurmReader(env=cluster.env).read(time.time())
    waiting = {j.job_id: j.reason for j in reading.pending}
    assert waiting == {want3: "Resources", held: "JobHeldUser", fits: "Priority"}
    samples = {
        (s.name, s.labels): s.value for s in iter_samples(scheduler_families(reading, "slurm"))
    }
    assert samples[("gpufeed_scheduler_backlog_idle_gpus", (("reason", "stall"),))] == 3
    assert not [k for k in samples if k[1] == (("reason", "fragmentation"),)]

    # A Slurm without JSON output (before 21.08): squeue and sinfo refuse --json, and the
    # reader falls back to format strings, which read the same queue and nodes
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("squeue", "sinfo"):
        real = shutil.which(tool)
        (fake / tool).write_text(
            "#!/bin/sh\n"
            f'case " $* " in *" --json "*) echo "{tool}: unrecognized option \'--json\'" >&2;'
            f' exit 1;; esac\nexec {real} "$@"\n'
        )
        (fake / tool).chmod(0o755)
    os.symlink(shutil.which("sdiag") or "sdiag", fake / "sdiag")
    text = SlurmReader(bin_dir=str(fake), env=cluster.env).read(time.time())

    def same(r: SchedulerReading) -> object:
        jobs = sorted(
            (j.job_id, j.reason, j.nodes, j.gpus_per_node, j.gpus_total) for j in r.pending
        )
        return jobs, r.nodes

    assert same(text) == same(reading)


def test_a_scheduler_that_does_not_answer_is_down_not_empty(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\n")
    done = scheduler_once("--slurm.conf", str(conf), "--scheduler.timeout", "1")
    assert done.returncode == 1
    assert 'gpufeed_scheduler_up{scheduler="slurm"} 0' in done.stdout
    assert "gpufeed_scheduler_pending_jobs{" not in done.stdout
    # one line that names the command, after the 1 s timeout rather than Slurm's own retries
    assert done.stderr.strip() == "gpufeed scheduler: squeue --json: no answer in 1 s"
