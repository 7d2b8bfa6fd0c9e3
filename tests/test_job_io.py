from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.job_io import JobIoCollector
from gpufeed.collectors.sdk import SdkCollector
from gpufeed.hostpaths import HostPaths
from gpufeed.jobs.io_accounting import (
    DeviceBytes,
    find_job_cgroups,
    parse_blkio_service_bytes,
    parse_io_stat,
    parse_proc_io,
)
from gpufeed.jobs.process_tree import ProcessTree
from gpufeed.model import iter_samples

FIXTURES = Path(__file__).parent / "fixtures"
TIERS = {"7:0": "hot", "7:1": "warm", "7:2": "warm"}
POD = "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab"


def series(c: JobIoCollector) -> dict[tuple[str, str, str], float]:
    return {
        (s.name.removeprefix("gpufeed_job_storage_"), s.label("job_id"), s.label("tier")): s.value
        for s in iter_samples(c.collect_with(TickData(devices_to_tier=TIERS)))
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "7:0 rbytes=10 wbytes=20 rios=1 wios=2 dbytes=0 dios=0\n8:16 rbytes=5 wbytes=0\n",
            {"7:0": DeviceBytes(10, 20), "8:16": DeviceBytes(5, 0)},
        ),
        ("7:0 rios=1\n\ngarbage\n", {}),
        ("", {}),
    ],
)
def test_parse_io_stat(text: str, expected: dict[str, DeviceBytes]) -> None:
    assert parse_io_stat(text) == expected


def test_parse_blkio_service_bytes_fixture() -> None:
    path = "sysfs_jobs_v1/fs/cgroup/blkio/slurm/uid_1000/job_43/blkio.throttle.io_service_bytes"
    assert parse_blkio_service_bytes((FIXTURES / path).read_text()) == {
        "7:0": DeviceBytes(3145728, 0),
        "7:1": DeviceBytes(4096, 1048576),
    }
    assert parse_blkio_service_bytes("Total 0\n") == {}


def test_parse_proc_io() -> None:
    assert parse_proc_io((FIXTURES / "procfs_jobs/200/io").read_text()) == DeviceBytes(4096, 8192)
    assert parse_proc_io("rchar: 1\n") is None


def test_find_job_cgroups_stops_at_the_job_directory() -> None:
    root = FIXTURES / "sysfs_jobs_v2/fs/cgroup"
    found = sorted(
        (j.scheduler, j.job_id, j.directory.relative_to(root).as_posix())
        for j in find_job_cgroups(root)
    )
    assert found == [
        (
            "kubernetes",
            POD,
            "kubepods.slice/kubepods-burstable.slice/"
            "kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_0123456789ab.slice",
        ),
        ("slurm", "42", "system.slice/slurmstepd.scope/job_42"),
        ("slurm", "44", "system.slice/slurmstepd.scope/job_44"),
    ]


def test_cgroup_v2_job_io_per_tier_with_proc_io_fallback() -> None:
    paths = HostPaths(procfs=FIXTURES / "procfs_jobs", sysfs=FIXTURES / "sysfs_jobs_v2")
    c = JobIoCollector(CollectorContext(paths=paths))
    assert series(c) == {
        # job 42: the job-level io.stat (covers its steps); 7:1 and 7:2 are both warm; 8:0
        # is in no tier and left out
        ("read_bytes_total", "42", "hot"): 1048576,
        ("written_bytes_total", "42", "hot"): 4096,
        ("read_bytes_total", "42", "warm"): 8193,
        ("written_bytes_total", "42", "warm"): 2097153,
        ("read_bytes_total", POD, "hot"): 500,
        ("written_bytes_total", POD, "hot"): 0,
        # job 44 has no io.stat: its processes' /proc/PID/io (pids 200 and 300)
        ("read_bytes_total", "44", "unattributed"): 5096,
        ("written_bytes_total", "44", "unattributed"): 8192,
        ("gpufeed_job_io_processes", "44", ""): 2,
    }


def test_cgroup_v1_blkio_and_sdk_job_pids() -> None:
    paths = HostPaths(procfs=FIXTURES / "procfs_jobs", sysfs=FIXTURES / "sysfs_jobs_v1")
    c = JobIoCollector(CollectorContext(paths=paths), sdk_job_pids=lambda: {"my-run": [200]})
    assert series(c) == {
        ("read_bytes_total", "43", "hot"): 3145728,
        ("written_bytes_total", "43", "hot"): 0,
        ("read_bytes_total", "43", "warm"): 4096,
        ("written_bytes_total", "43", "warm"): 1048576,
        # job 45: the kernel counted nothing ("Total 0"): /proc/PID/io of pid 301
        ("read_bytes_total", "45", "unattributed"): 65536,
        ("written_bytes_total", "45", "unattributed"): 512,
        ("gpufeed_job_io_processes", "45", ""): 1,
        # an SDK job under no scheduler
        ("read_bytes_total", "my-run", "unattributed"): 4096,
        ("written_bytes_total", "my-run", "unattributed"): 8192,
        ("gpufeed_job_io_processes", "my-run", ""): 1,
    }


def test_proc_io_fallback_stays_monotonic_when_a_process_exits(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "procfs_jobs", procfs)
    pids = {"j": [200, 300]}
    c = JobIoCollector(
        CollectorContext(paths=HostPaths(procfs=procfs, sysfs=tmp_path / "nosys")),
        sdk_job_pids=lambda: pids,
    )
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 5096
    shutil.rmtree(procfs / "300")  # the process exits; its bytes stay in the job's counter
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 5096
    pids["j"] = []
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 5096
    pids.clear()  # the job is gone: so are its series
    assert series(c) == {}


def test_proc_io_fallback_counts_a_reaped_child_once(tmp_path: Path) -> None:
    """The kernel adds a reaped child's I/O to its parent's /proc/PID/io (a DataLoader
    worker and its main process): the job's sum must not count it a second time."""
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "procfs_jobs", procfs)
    c = JobIoCollector(
        CollectorContext(paths=HostPaths(procfs=procfs, sysfs=tmp_path / "nosys")),
        sdk_job_pids=lambda: {"j": [200, 300]},  # 300 is 200's child
    )
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 4096 + 1000
    shutil.rmtree(procfs / "300")  # exited, not yet reaped: the sum holds
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 4096 + 1000
    io = procfs / "200" / "io"
    io.write_text(io.read_text().replace("read_bytes: 4096", "read_bytes: 5096"))  # reaped
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 4096 + 1000
    io.write_text(io.read_text().replace("read_bytes: 5096", "read_bytes: 5196"))
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 4096 + 1000 + 100


def test_a_dataloader_workers_reads_count_before_it_is_reaped(tmp_path: Path) -> None:
    """Only the main process speaks to the SDK; its worker (300, 200's child) reads the
    samples. The SDK collector's pids hold the worker, so its bytes count while it lives,
    and once when it is reaped into its parent's reading."""
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "procfs_jobs", procfs)
    (procfs / "200" / "task" / "200").mkdir(parents=True)  # no children file: a stat scan
    tree = ProcessTree(procfs, rescan_seconds=0.0)
    c = JobIoCollector(
        CollectorContext(paths=HostPaths(procfs=procfs, sysfs=tmp_path / "nosys")),
        sdk_job_pids=lambda: tree.expand({"j": [200]}),
    )
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 4096 + 1000
    # and says it sums both: a job counted reading nothing then reads nothing (issue 23)
    assert series(c)[("gpufeed_job_io_processes", "j", "")] == 2
    shutil.rmtree(procfs / "300")
    io = procfs / "200" / "io"
    io.write_text(io.read_text().replace("read_bytes: 4096", "read_bytes: 5096"))  # reaped
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 4096 + 1000
    assert series(c)[("gpufeed_job_io_processes", "j", "")] == 1


def test_the_sdk_collectors_job_pids_hold_their_descendants(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "procfs_jobs", procfs)
    (procfs / "200" / "task" / "200").mkdir(parents=True)
    ctx = CollectorContext(paths=HostPaths(procfs=procfs, sysfs=tmp_path / "nosys"))
    sdk = SdkCollector(ctx, socket_path=str(tmp_path / "sdk.sock"))  # never started
    sdk.server.pids_by_job = lambda: {"j": [200]}  # type: ignore[method-assign]
    assert sorted(sdk.pids_by_job()["j"]) == [200, 300]


def final_io_collector(
    tmp_path: Path,
    pids: dict[str, list[int]],
    finals: dict[str, dict[int, tuple[int, DeviceBytes]]],
) -> tuple[JobIoCollector, Path]:
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "procfs_jobs", procfs)
    c = JobIoCollector(
        CollectorContext(paths=HostPaths(procfs=procfs, sysfs=tmp_path / "nosys")),
        sdk_job_pids=lambda: pids,
        sdk_final_io=lambda: finals,
    )
    return c, procfs


WRITTEN = ("written_bytes_total", "j", "unattributed")


def test_a_final_io_report_replaces_the_last_sample_of_a_process(tmp_path: Path) -> None:
    """The process wrote a checkpoint after the last sample and exited (defect 4 of
    issue 9): its own report at close holds those bytes, the sample did not."""
    pids: dict[str, list[int]] = {"j": [200]}
    finals: dict[str, dict[int, tuple[int, DeviceBytes]]] = {}
    c, procfs = final_io_collector(tmp_path, pids, finals)
    assert series(c)[WRITTEN] == 8192
    finals["j"] = {200: (150, DeviceBytes(4096, 8192 + 27_000_000))}  # report, then CLOSE:
    pids["j"] = []  # a closed process is no longer sampled
    shutil.rmtree(procfs / "200")
    assert series(c)[WRITTEN] == 8192 + 27_000_000
    assert series(c)[WRITTEN] == 8192 + 27_000_000  # counted once, however often collected


def test_a_final_io_report_arriving_after_the_process_was_retired(tmp_path: Path) -> None:
    pids: dict[str, list[int]] = {"j": [200]}
    finals: dict[str, dict[int, tuple[int, DeviceBytes]]] = {}
    c, procfs = final_io_collector(tmp_path, pids, finals)
    assert series(c)[WRITTEN] == 8192
    shutil.rmtree(procfs / "200")  # gone before its report was read: the sample stays
    assert series(c)[WRITTEN] == 8192
    finals["j"] = {200: (150, DeviceBytes(4096, 10_000))}  # only the difference is added
    assert series(c)[WRITTEN] == 10_000
    assert series(c)[WRITTEN] == 10_000


def test_a_process_that_never_was_sampled_counts_by_its_report(tmp_path: Path) -> None:
    """A job shorter than the sampling interval: known only from its report."""
    finals = {"j": {4242: (1, DeviceBytes(0, 5_000_000))}}
    c, _ = final_io_collector(tmp_path, {"j": []}, finals)
    assert series(c)[WRITTEN] == 5_000_000


def test_a_final_report_of_a_child_whose_parent_is_summed_counts_once(tmp_path: Path) -> None:
    """300 is 200's child: once 200 reaps it, 200's own reading holds 300's bytes."""
    finals = {"j": {300: (200, DeviceBytes(1000, 0))}}
    c, _ = final_io_collector(tmp_path, {"j": [200]}, finals)
    assert series(c)[("read_bytes_total", "j", "unattributed")] == 4096
