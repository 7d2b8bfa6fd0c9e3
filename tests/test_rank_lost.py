"""A rank lost without closing its job (issue 13): the agent notices, `gpufeed run` says how.

A rank killed with SIGKILL (or crashed hard) sends no CLOSE: the agent sees its pid gone and
exports `gpufeed_job_rank_lost` 1; `gpufeed run`, its parent, reports its exit status
(EXIT), exported as `gpufeed_job_rank_exit_status` (137: killed by signal 9).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import JobTable
from gpufeed.jobs.sdk_server import SdkServer
from test_sdk import (
    server,  # noqa: F401 (the real SDK server, a fixture)
    value,
)

EXPORTER = Path(wire.__file__).parents[2]


def _msg(kind: int, **fields: object) -> wire.Message:
    return wire.Message(kind, "j", "train", **fields)  # type: ignore[arg-type]


def _lost(table: JobTable, rank: str) -> float | None:
    table.expire(3.0)  # what the SDK server does before each scrape
    return value(table.families(), "gpufeed_job_rank_lost", job_id="j", rank=rank)


def test_a_rank_gone_without_close_is_lost_and_a_closed_one_is_not() -> None:
    alive = {101, 102, 103, 104}
    table = JobTable(max_jobs=4, grace_seconds=60, pid_alive=lambda p: p in alive)
    for pid, rank in ((101, 0), (102, 1), (103, 2)):
        table.apply(_msg(wire.KIND_RANK, rank=rank, world_size=3), pid, 0.0)
        table.apply(_msg(wire.KIND_STEP, steps=1), pid, 0.0)
    table.apply(_msg(wire.KIND_STEP, steps=1), 104, 0.0)  # a worker: no rank
    assert [_lost(table, r) for r in "012"] == [0.0, 0.0, 0.0]  # known, running: 0
    table.apply(_msg(wire.KIND_CLOSE), 101, 1.0)
    alive -= {101, 102, 104}  # 101 closed first; 102 killed; a worker gone is no rank
    assert [_lost(table, r) for r in "012"] == [0.0, 1.0, 0.0]
    fams = table.families()
    assert value(fams, "gpufeed_job_rank_exit_status", job_id="j", rank="1") is None  # not said
    # the rank registered again by a new process (an elastic restart): not lost any more
    alive.add(105)
    table.apply(_msg(wire.KIND_RANK, rank=1, world_size=3), 105, 2.0)
    assert _lost(table, "1") == 0.0


def test_a_rank_with_another_live_process_is_not_lost() -> None:
    alive = {201, 202}
    table = JobTable(max_jobs=4, grace_seconds=60, pid_alive=lambda p: p in alive)
    for pid in (201, 202):  # two processes that said they are rank 0 (a re-exec)
        table.apply(_msg(wire.KIND_RANK, rank=0, world_size=2), pid, 0.0)
    alive.discard(201)
    assert _lost(table, "0") == 0.0
    alive.discard(202)
    assert _lost(table, "0") == 1.0


def test_the_launchers_exit_report_names_the_status_and_nothing_else() -> None:
    alive = {301, 302}
    table = JobTable(max_jobs=4, grace_seconds=60, pid_alive=lambda p: p in alive)
    table.apply(_msg(wire.KIND_RANK, rank=0, world_size=2), 301, 0.0)
    table.apply(_msg(wire.KIND_RANK, rank=1, world_size=2), 302, 0.0)
    # rank 0 closed its job, then exited 1 (its collectives failed); rank 1 was killed
    table.apply(_msg(wire.KIND_CLOSE), 301, 1.0)
    assert table.apply(_msg(wire.KIND_EXIT, exit_pid=301, exit_status=1), 900, 1.0) is None
    assert table.apply(_msg(wire.KIND_EXIT, exit_pid=302, exit_status=137), 901, 1.0) is None
    table.expire(1.0)
    fams = table.families(now=1.0)  # 302 "alive" to /proc: the report closed it at once
    got = {
        r: (
            value(fams, "gpufeed_job_rank_lost", job_id="j", rank=r),
            value(fams, "gpufeed_job_rank_exit_status", job_id="j", rank=r),
        )
        for r in "01"
    }
    assert got == {"0": (0.0, 1.0), "1": (1.0, 137.0)}
    # the launcher is no process of the job, and a report for another job creates none
    assert value(fams, "gpufeed_job_processes", job_id="j") == 0
    other = wire.Message(wire.KIND_EXIT, "nobody", "x", exit_pid=302, exit_status=9)
    assert table.apply(other, 902, 1.0) is None
    assert table.job_ids() == ["j"]


def test_exit_reports_decode_only_in_range() -> None:
    ok = wire.Message(wire.KIND_EXIT, "j", "t", exit_pid=4242, exit_status=137)
    assert wire.decode_datagram(wire.encode(ok)) == [ok]
    for pid, status in ((0, 1), (wire.MAX_PID + 1, 1), (1, 256)):
        bad = wire.Message(wire.KIND_EXIT, "j", "t", exit_pid=pid, exit_status=status)
        assert wire.decode_datagram(wire.encode(bad)) == wire.REASON_SCHEMA


def test_gpufeed_run_reports_a_killed_rank(server: SdkServer) -> None:  # noqa: F811
    """Real processes: a rank under `gpufeed run` kills itself with SIGKILL mid-job; the
    agent's SDK server exports it lost, with exit status 137 from its launcher."""
    child = (
        "import os, signal, gpufeed.sdk as s\n"
        "j = s.Job('train')\n"
        "for _ in j.track(range(3)): pass\n"
        "j._flush(final=True)\n"
        "import time; time.sleep(0.3)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(EXPORTER),
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "gpufeed.run_cli", "--socket", server.socket_path,
         "--job-id", "killed-job", "--", sys.executable, "-c", child],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 137, done.stderr
    deadline = time.monotonic() + 10
    got: tuple[float | None, float | None] = (None, None)
    while time.monotonic() < deadline:
        fams = server.families()
        got = (
            value(fams, "gpufeed_job_rank_lost", job_id="killed-job", rank="1"),
            value(fams, "gpufeed_job_rank_exit_status", job_id="killed-job", rank="1"),
        )
        if got == (1.0, 137.0):
            break
        time.sleep(0.05)
    assert got == (1.0, 137.0)


def test_a_rank_its_launcher_saw_exit_0_is_not_lost() -> None:
    """A rank that finished without its CLOSE (os._exit(0), a dropped datagram) is not
    lost, whether the launcher's report comes first or a scrape saw its pid gone first:
    else a healthy job's end reads as a rank killed and its node as brought down."""
    alive = {401, 402}
    table = JobTable(max_jobs=4, grace_seconds=60, pid_alive=lambda p: p in alive)
    table.apply(_msg(wire.KIND_RANK, rank=0, world_size=2), 401, 0.0)
    table.apply(_msg(wire.KIND_RANK, rank=1, world_size=2), 402, 0.0)
    table.apply(_msg(wire.KIND_EXIT, exit_pid=401, exit_status=0), 900, 1.0)  # report first
    alive.discard(402)
    assert _lost(table, "1") == 1.0  # the scrape first: lost until the report says
    table.apply(_msg(wire.KIND_EXIT, exit_pid=402, exit_status=0), 901, 1.0)
    assert [_lost(table, r) for r in "01"] == [0.0, 0.0]
