"""A multi-node lab node's agent sees the cgroups of its own node only (issue 13: the
CPU-starved node was not named because every node's agent read the CPU quota of whichever
node's job cgroup came first in the host's tree; the job has the same id on every node).

Real parts: a network namespace, two Slurm-shaped job cgroups with one job id (the lab's
`JobCgroup`, one per "node"), a CPU quota on one of them, and the real job_cpu collector
run through the wrapper the harness starts each node's agent with (`node_argv`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_needs import missing
from lab.host import JobCgroup
from lab.multinode.harness import node_argv
from lab.multinode.host import host_problem

# What a node's agent would see: the job cgroups in its CPU hierarchy and what job_cpu says.
PROBE = """
import json
from pathlib import Path
from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.job_cpu import JobCpuCollector
from gpufeed.jobs.cpu_accounting import cpu_hierarchy
from gpufeed.jobs.io_accounting import find_job_cgroups
hier = cpu_hierarchy(Path("/sys/fs/cgroup"))
jobs = [j.job_id for j in find_job_cgroups(hier.root)] if hier else []
said = {
    f.name: {dict(s.labels)["job_id"]: s.value for s in f.samples}
    for f in JobCpuCollector(CollectorContext()).collect()
}
print(json.dumps({"jobs": jobs, "said": said}))
"""


@pytest.fixture
def netns() -> Iterator[str]:
    problem = host_problem()
    if problem is not None:
        missing(problem)
    name = f"gfview{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _seen(netns: str, views: list[tuple[Path, Path]]) -> tuple[list[str], dict[str, Any]]:
    """(the job ids whose cgroups the node's agent finds, what job_cpu exports by family)"""
    cmd = node_argv(netns, "node-x", views, [sys.executable, "-c", PROBE])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    return out["jobs"], out["said"]


@pytest.mark.root
def test_each_node_agent_sees_its_own_job_cgroup_only(netns: str) -> None:
    job_id = f"view{os.getpid()}"
    starved, healthy = JobCgroup(job_id), JobCgroup(job_id)
    try:
        starved.open([])
        healthy.open([])
        starved.set_cpu_quota(0.5)
        # the whole host's tree: two job directories of one id (what the agents saw before)
        jobs, _ = _seen(netns, [])
        assert jobs.count(job_id) == 2

        jobs, said = _seen(netns, starved.views())
        assert jobs == [job_id]
        assert job_id in said["gpufeed_job_cpu_throttled_periods_total"]

        jobs, said = _seen(netns, healthy.views())
        assert jobs == [job_id]
        # no quota on this node's job: nothing throttles it, so the series is absent
        assert job_id not in said["gpufeed_job_cpu_throttled_periods_total"]
    finally:
        starved.close()
        healthy.close()
