"""Per-rank signals (issue 13): the SDK's rank, the agent's per-rank sums, their bounds."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from gpufeed import sdk
from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import MAX_RANKS_PER_JOB, JobTable
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import Family, iter_samples
from test_sdk import (
    SlowIterable,
    server,  # noqa: F401 (the real SDK server, a fixture)
    value,
    wait_value,
)

FIXTURES = Path(__file__).parent / "fixtures"
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
)


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1"}, (5, 16, 1)),
        ({"RANK": "5", "WORLD_SIZE": "16"}, (5, 16, -1)),  # local rank not said
        # torchrun under srun: SLURM_PROCID is torchrun's own task, RANK the rank
        ({"RANK": "9", "WORLD_SIZE": "16", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, (9, 16, -1)),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            },
            (3, 8, 3),
        ),
        (
            {
                "SLURM_PROCID": "7",
                "SLURM_STEP_NUM_TASKS": "8",
                "SLURM_NTASKS": "64",
                "SLURM_LOCALID": "3",
            },
            (7, 8, 3),
        ),
        ({"SLURM_PROCID": "7", "SLURM_NTASKS": "64", "SLURM_LOCALID": "7"}, (7, 64, 7)),
        ({}, None),
        ({"RANK": "4", "WORLD_SIZE": "4"}, None),  # rank outside the world
        ({"RANK": "x", "WORLD_SIZE": "4"}, None),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "9"}, (0, 4, -1)),
        ({"RANK": "0", "WORLD_SIZE": str(wire.MAX_WORLD_SIZE + 1)}, None),
    ],
)
def test_rank_from_the_launchers_environment(
    env: dict[str, str], want: tuple[int, int, int] | None
) -> None:
    assert sdk.launcher_rank(env) == want


def test_set_rank_refuses_what_is_not_a_rank() -> None:
    job = sdk.Job("x", socket="/nonexistent/s")
    with pytest.raises(ValueError, match="is not a rank"):
        job.set_rank(3, 3)
    job.set_rank(2, 3, local_rank=0)
    assert job.rank == 2


def test_rank_from_torch_distributed_once_initialised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    assert sdk.torch_rank() is None  # imported, not initialised
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert sdk.torch_rank() == (0, 1, -1)
        job = sdk.Job("t", socket="/nonexistent/s")
        assert job.rank is None  # no launcher variables: learnt at the first flush
        job._send_rank_datagram(0.0, time.perf_counter())
        assert job.rank == 0
    finally:
        dist.destroy_process_group()


def rank_samples(fams: list[Family]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels))): s.value
        for s in iter_samples(fams)
        if s.name.startswith("gpufeed_job_rank_")
    }


def _msg(kind: int, **fields: object) -> wire.Message:
    return wire.Message(kind, "j", "train", **fields)  # type: ignore[arg-type]


def test_ranks_are_summed_apart_and_the_job_as_before() -> None:
    table = JobTable(max_jobs=4, grace_seconds=5, pid_alive=lambda p: True)
    step = _msg(wire.KIND_STEP, seconds=0.5, compute_seconds=2.0, steps=4)
    table.apply(_msg(wire.KIND_RANK, rank=0, local_rank=0, world_size=16), 101, 0.0)
    table.apply(_msg(wire.KIND_RANK, rank=1, world_size=16), 102, 0.0)
    for pid in (101, 102, 103):  # 103 never says its rank (a DataLoader worker, an old SDK)
        table.apply(step, pid, 1.0)
    table.apply(_msg(wire.KIND_PHASE, phase="eval", seconds=1.0), 102, 1.0)
    table.apply(_msg(wire.KIND_CHECKPOINT, seconds=3.0, checkpoint_bytes=10), 101, 1.0)
    for pid, waited in ((101, 0.25), (102, 1.5), (103, 9.0)):
        table.apply(_msg(wire.KIND_PHASE, phase=wire.COLLECTIVE_WAIT, seconds=waited), pid, 1.0)
    fams = table.families({101: {"GPU-a"}, 102: {"GPU-a", "GPU-b"}})
    # the job: every process, as before; collective_wait is no job phase
    assert value(fams, "gpufeed_job_steps_total", job_id="j") == 12
    assert value(fams, "gpufeed_job_phase_seconds_total", job_id="j", phase="compute") == 6.0
    assert value(fams, "gpufeed_job_phase_seconds_total", job_id="j", phase="checkpoint") == 3.0
    assert (
        value(fams, "gpufeed_job_phase_seconds_total", job_id="j", phase="collective_wait") is None
    )
    got = rank_samples(fams)
    phases = "gpufeed_job_rank_phase_seconds_total"

    def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted({"job_id": "j", **labels}.items()))

    assert got == {
        key(phases, rank="0", phase="compute"): 2.0,
        key(phases, rank="0", phase="data_wait"): 0.5,
        key(phases, rank="0", phase="checkpoint"): 3.0,
        key(phases, rank="0", phase="collective_wait"): 0.25,
        key(phases, rank="1", phase="compute"): 2.0,
        key(phases, rank="1", phase="data_wait"): 0.5,
        key(phases, rank="1", phase="eval"): 1.0,
        key(phases, rank="1", phase="collective_wait"): 1.5,
        key("gpufeed_job_rank_steps_total", rank="0"): 4,
        key("gpufeed_job_rank_steps_total", rank="1"): 4,
        # rank 0 is on one GPU: named; rank 1 on two (a stray context): not guessed
        key("gpufeed_job_rank_info", rank="0", local_rank="0", world_size="16", uuid="GPU-a"): 1,
        key("gpufeed_job_rank_info", rank="1", world_size="16"): 1,
        key("gpufeed_job_rank_lost", rank="0"): 0,  # both run (issue 13's lost rank)
        key("gpufeed_job_rank_lost", rank="1"): 0,
    }


def test_a_sender_the_agent_cannot_see_gets_no_rank() -> None:
    table = JobTable(max_jobs=4, grace_seconds=5, pid_alive=lambda p: True)
    table.apply(_msg(wire.KIND_RANK, rank=0, world_size=2), 0, 0.0)
    table.apply(_msg(wire.KIND_STEP, steps=1), 0, 0.0)
    assert rank_samples(table.families()) == {}
    assert value(table.families(), "gpufeed_job_steps_total", job_id="j") == 1


def test_absurd_ranks_are_capped_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    table = JobTable(max_jobs=4, grace_seconds=5, pid_alive=lambda p: True)
    claims = MAX_RANKS_PER_JOB + 50
    with caplog.at_level(logging.WARNING, logger="gpufeed.jobs.aggregate"):
        for r in range(claims):
            msg = _msg(wire.KIND_RANK, rank=r, world_size=wire.MAX_WORLD_SIZE)
            assert table.apply(msg, 1000 + r, 0.0) is None
            table.apply(_msg(wire.KIND_STEP, steps=1), 1000 + r, 0.0)
    fams = table.families()
    infos = [s for s in iter_samples(fams) if s.name == "gpufeed_job_rank_info"]
    assert len(infos) == MAX_RANKS_PER_JOB
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "rank 256" in lines[0] and f"already has {MAX_RANKS_PER_JOB} ranks" in lines[0]
    # the refused ranks' steps still count for the job
    assert value(fams, "gpufeed_job_steps_total", job_id="j") == claims


def test_a_scheduler_job_keeps_what_its_messages_carry(tmp_path: Path) -> None:
    """The agent replaces a Slurm process's claimed job id by its cgroup's and keeps every
    other field (rank, IO bytes)."""
    srv = SdkServer(
        str(tmp_path / "s"),
        max_jobs=4,
        max_messages_per_second=100,
        grace_seconds=5,
        procfs=FIXTURES / "procfs_jobs",
    )
    msgs = [
        wire.Message(wire.KIND_RANK, "claimed", "train", rank=3, local_rank=1, world_size=8),
        wire.Message(wire.KIND_STEP, "claimed", "train", seconds=0.5, steps=2),
        wire.Message(wire.KIND_IO, "claimed", "train", read_bytes=4096, written_bytes=8192),
    ]
    assert srv.handle(b"".join(wire.encode(m) for m in msgs), 100) is None  # Slurm job 987654
    fams = srv.families()
    assert value(fams, "gpufeed_job_rank_steps_total", job_id="987654", rank="3") == 2
    io = srv.final_io_by_job()["987654"][100][1]
    assert (io.read_bytes, io.written_bytes) == (4096, 8192)


def test_the_sdk_reports_its_rank_and_collective_waits(
    server: SdkServer,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GPUFEED_JOB_ID", "ranked")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    job = sdk.Job("ranks", socket=server.socket_path)
    assert job.rank == 2
    waited = 0.0
    for _ in job.track(SlowIterable(6, 0.001)):
        t0 = time.perf_counter()
        with job.collective():
            time.sleep(0.004)
        with job.phase("collective_wait"):  # the same, by its phase name
            time.sleep(0.001)
        waited += time.perf_counter() - t0
    job.close()
    assert job.events_dropped == 0
    wait_value(server, "gpufeed_job_rank_steps_total", 6, job_id="ranked", rank="2")
    fams = server.families()
    got = value(
        fams,
        "gpufeed_job_rank_phase_seconds_total",
        job_id="ranked",
        rank="2",
        phase="collective_wait",
    )
    assert got is not None and 6 * 0.005 <= got <= waited
    # collective_wait overlaps compute: the loop body's compute still holds it
    compute = value(fams, "gpufeed_job_phase_seconds_total", job_id="ranked", phase="compute")
    assert compute is not None and compute >= got
    info = value(
        fams, "gpufeed_job_rank_info", job_id="ranked", rank="2", local_rank="0", world_size="4"
    )
    assert info == 1
    print(f"rank 2: collective_wait {got:.4f} s of {waited:.4f} s timed, compute {compute:.4f} s")


def test_the_sdk_collector_names_a_ranks_gpu_from_the_gpu_collectors_tick(
    tmp_path: Path,
) -> None:
    from gpufeed.collectors.base import CollectorContext, TickData
    from gpufeed.collectors.sdk import SdkCollector
    from gpufeed.gpu.backend import GpuIdentity, GpuProcess, GpuSample

    def gpu(index: int, *pids: int) -> GpuSample:
        ident = GpuIdentity(
            index, f"GPU-{index}", "NVIDIA H100", "550.54", f"0000:{index:02x}:00.0"
        )
        return GpuSample(ident, processes=tuple(GpuProcess(p) for p in pids))

    collector = SdkCollector(CollectorContext(), str(tmp_path / "s.sock"))
    srv = collector.server
    # live processes (the agent forgets the ranks of exited ones): this one, its parent, init
    me, parent = os.getpid(), os.getppid()
    for pid, rank in ((me, 0), (parent, 1), (1, 2)):
        msg = wire.Message(wire.KIND_RANK, "j", "n", rank=rank, local_rank=rank, world_size=3)
        assert srv.handle(wire.encode(msg), pid) is None
    # rank 0 on GPU 0; rank 1 on GPU 1 and (a stray context) GPU 0; rank 2 on none
    tick = TickData(gpu_samples=(gpu(0, me, parent), gpu(1, parent)))
    uuids = {
        dict(s.labels)["rank"]: dict(s.labels).get("uuid")
        for s in iter_samples(collector.collect_with(tick))
        if s.name == "gpufeed_job_rank_info"
    }
    assert uuids == {"0": "GPU-0", "1": None, "2": None}
    # without the GPU collector's reading (off, failed, late): no uuid, the rest all the same
    plain = [s for s in iter_samples(collector.collect()) if s.name == "gpufeed_job_rank_info"]
    assert len(plain) == 3 and all("uuid" not in dict(s.labels) for s in plain)


def test_a_collective_in_flight_reports_its_wait_as_it_grows(
    server: SdkServer,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank blocked in a collective (its peer stopped) sends nothing from its loop; the
    wait it accrues still reaches the agent each COLLECTIVE_SEND_SECONDS, and once the
    collective returns only the rest is added (the whole wait counted once)."""
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GPUFEED_JOB_ID", "blocked")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    job = sdk.Job("blocked", socket=server.socket_path)
    labels = {"job_id": "blocked", "rank": "1", "phase": "collective_wait"}
    t0 = time.perf_counter()
    with job.collective():
        # still inside: at least one reporter period has been counted and sent
        wait_value(server, "gpufeed_job_rank_phase_seconds_total", 1.0, timeout=6.0, **labels)
        inside = value(server.families(), "gpufeed_job_rank_phase_seconds_total", **labels)
    waited = time.perf_counter() - t0
    job.close()
    wait_value(server, "gpufeed_job_rank_phase_seconds_total", waited * 0.999, **labels)
    total = value(server.families(), "gpufeed_job_rank_phase_seconds_total", **labels)
    assert inside is not None and total is not None
    assert inside < waited and abs(total - waited) < 0.01, (inside, total, waited)
