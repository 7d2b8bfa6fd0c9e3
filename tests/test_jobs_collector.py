from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.jobs import JobsCollector
from gpufeed.config import AgentConfig, JobsConfig
from gpufeed.gpu.backend import GpuIdentity, GpuProcess, GpuSample
from gpufeed.hostpaths import HostPaths
from gpufeed.jobs.identity import parse_proc_stat
from gpufeed.jobs.mapping_dir import parse_mapping_file, read_mapping_dir
from gpufeed.model import iter_samples

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parents[1]
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID1 = "GPU-11111111-1111-1111-1111-111111111111"
UUID2 = "GPU-5a0e3b1c-0000-1111-2222-333344445555"


def gpu(index: int, uuid: str, *pids: int) -> GpuSample:
    ident = GpuIdentity(index, uuid, "NVIDIA H100", "550.54", f"0000:{index:02x}:00.0")
    return GpuSample(ident, processes=tuple(GpuProcess(p) for p in pids))


def infos(collector: JobsCollector, samples: list[GpuSample]) -> set[tuple[str, str, str, str]]:
    out = set()
    for s in iter_samples(collector.collect_with(TickData(gpu_samples=tuple(samples)))):
        assert s.name == "gpufeed_job_info" and s.value == 1
        assert s.label("uuid") in (UUID0, UUID1, UUID2)
        out.add((s.label("gpu"), s.label("job_id"), s.label("scheduler"), s.label("name")))
    return out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4242\n", ("4242",)),
        ("4242 1000\n5151 1001\n", ("4242", "5151")),  # jobstats' "JOBID UID"
        ("# comment\n\n4242\n4242\n", ("4242",)),
        ("bad!id x\n$(x)\n", ()),
        ("", ()),
        ("\n".join(str(i) for i in range(100)), tuple(str(i) for i in range(16))),
    ],
)
def test_parse_mapping_file(text: str, expected: tuple[str, ...]) -> None:
    assert parse_mapping_file(text) == expected


def test_read_mapping_dir_fixture() -> None:
    assert read_mapping_dir(FIXTURES / "job-map") == {
        "0": ("4242",),
        "1": ("4242", "5151"),
        UUID2: ("777",),
    }
    assert read_mapping_dir(FIXTURES / "no-such-dir") == {}


def test_job_info_per_held_gpu_none_for_idle_gpu() -> None:
    ctx = CollectorContext(paths=HostPaths(procfs=FIXTURES / "procfs_jobs"))
    samples = [gpu(0, UUID0, 100, 101), gpu(1, UUID1, 300, 555), gpu(2, UUID2)]
    c = JobsCollector(ctx)
    assert infos(c, samples) == {
        ("0", "987654", "slurm", "python"),
        ("0", "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab", "kubernetes", "python3"),
        ("1", "pg200-7000", "process", "pt_main_thread"),  # pid 555 has exited: skipped
    }


def test_mapping_dir_adds_allocated_gpus_and_sdk_names_jobs() -> None:
    cfg = AgentConfig(jobs=JobsConfig(mapping_dir=str(FIXTURES / "job-map")))
    ctx = CollectorContext(paths=HostPaths(procfs=FIXTURES / "procfs_jobs"), config=cfg)
    samples = [gpu(0, UUID0, 100), gpu(1, UUID1, 300), gpu(2, UUID2)]
    sdk_jobs = {300: ("my-run", "resnet50"), 100: ("ignored-id", "bert")}
    c = JobsCollector(ctx, sdk_job_for_pid=sdk_jobs.get)
    assert infos(c, samples) == {
        # the scheduler's id wins over the SDK's; the SDK's name is used
        ("0", "987654", "slurm", "bert"),
        ("0", "4242", "slurm", ""),
        ("1", "my-run", "process", "resnet50"),
        ("1", "4242", "slurm", ""),
        ("1", "5151", "slurm", ""),
        ("2", "777", "slurm", ""),  # file named by the GPU's UUID
    }


def test_real_process_of_this_test_is_found() -> None:
    """Against the real /proc: this pytest process, as NVML would list it."""
    c = JobsCollector(CollectorContext())
    ((_, job_id, scheduler, name),) = infos(c, [gpu(0, UUID0, os.getpid())])
    assert scheduler in ("process", "slurm", "kubernetes")
    if scheduler == "process":
        pgid = os.getpgid(0)
        try:
            leader = parse_proc_stat(Path(f"/proc/{pgid}/stat").read_text())
        except FileNotFoundError:  # the group's leader has exited (e.g. a backgrounded CI job)
            assert job_id == f"pg{pgid}"
        else:
            assert leader is not None
            assert job_id == f"pg{pgid}-{leader.start_ticks}"
    assert name == Path("/proc/self/comm").read_text().strip()


def run_script(name: str, env: dict[str, str]) -> None:
    subprocess.run(
        ["sh", str(REPO / "deploy" / "slurm" / name)],
        env={"PATH": os.environ["PATH"], **env},
        check=True,
        timeout=30,
    )


def test_slurm_prolog_and_epilog_write_and_clear_the_mapping(tmp_path: Path) -> None:
    d = tmp_path / "job-map"
    base = {"GPUFEED_JOB_MAPPING_DIR": str(d)}
    run_script("gpufeed-prolog.sh", {**base, "SLURM_JOB_ID": "101", "SLURM_JOB_GPUS": "0,2"})
    run_script("gpufeed-prolog.sh", {**base, "SLURM_JOB_ID": "102", "CUDA_VISIBLE_DEVICES": "2"})
    run_script("gpufeed-prolog.sh", {**base, "SLURM_JOB_ID": "103"})  # no GPU: nothing
    run_script("gpufeed-prolog.sh", {**base, "SLURM_JOB_ID": "1;rm -rf /", "SLURM_JOB_GPUS": "1"})
    assert read_mapping_dir(d) == {"0": ("101",), "2": ("101", "102")}
    assert oct(os.stat(d / "0").st_mode & 0o777) == "0o644"
    run_script("gpufeed-prolog.sh", {**base, "SLURM_JOB_ID": "101", "SLURM_JOB_GPUS": "0,2"})
    assert read_mapping_dir(d) == {"0": ("101",), "2": ("102", "101")}  # no duplicate
    run_script("gpufeed-epilog.sh", {**base, "SLURM_JOB_ID": "101", "SLURM_JOB_GPUS": "0,2"})
    assert read_mapping_dir(d) == {"2": ("102",)}
    assert not (d / "0").exists()
    run_script("gpufeed-epilog.sh", {**base, "SLURM_JOB_ID": "102"})  # GPUs unknown: all files
    assert read_mapping_dir(d) == {}
    assert sorted(p.name for p in d.iterdir()) == [".lock"]


def test_wiring_builds_three_collectors_sharing_the_sdk(tmp_path: Path) -> None:
    from gpufeed import sdk
    from gpufeed.agent.wiring import Wiring, build_collectors
    from gpufeed.collectors.sdk import SdkCollector

    sock = str(tmp_path / "sdk.sock")
    wiring = Wiring(CollectorContext(), sdk_socket=sock)
    built = build_collectors(wiring, lambda name: name in ("sdk", "jobs", "job_io"))
    assert [c.name for c in built] == ["sdk", "jobs", "job_io"]
    sdk_collector, jobs, _ = built
    assert isinstance(sdk_collector, SdkCollector) and isinstance(jobs, JobsCollector)
    try:
        job = sdk.Job("wired", socket=sock)
        for _ in job.track(range(3)):
            pass
        job._flush()
        deadline = time.monotonic() + 5
        while sdk_collector.job_for_pid(os.getpid()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # this process holds "GPU 0" and speaks for an SDK job: job_info carries its name
        tick = TickData(gpu_samples=(gpu(0, UUID0, os.getpid()),))
        (info,) = iter_samples(jobs.collect_with(tick))
        assert info.label("name") == "wired"
        if info.label("scheduler") == "process":
            assert info.label("job_id") == job.job_id
        job.close()
    finally:
        sdk_collector.stop()
    assert not Path(sock).exists()


def test_gpufeed_cli_has_the_run_subcommand(tmp_path: Path) -> None:
    from gpufeed.cli import main

    assert main(["run", "--socket", str(tmp_path / "s"), "--", "true"]) == 0
    assert main(["run", "--", "false"]) == 1
