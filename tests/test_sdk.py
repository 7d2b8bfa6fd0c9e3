"""The SDK against the real agent-side server on a real Unix socket (no mocks)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufeed import sdk
from gpufeed.config import DEFAULT_SDK_SOCKET
from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import JobTable
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import Family, iter_samples

FIXTURES = Path(__file__).parent / "fixtures"


def value(families: list[Family], name: str, **labels: str) -> float | None:
    """The one sample `name` whose labels are `labels` (a job's `name` label aside)."""
    want = sorted(labels.items())
    found = [
        s.value
        for s in iter_samples(families)
        if s.name == name and sorted((k, v) for k, v in s.labels if k != "name") == want
    ]
    assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
    return found[0] if found else None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SdkServer]:
    srv = SdkServer(
        str(tmp_path / "run" / "sdk.sock"),
        max_jobs=8,
        max_messages_per_second=100000,
        grace_seconds=300,
    )
    srv.start()
    yield srv
    srv.stop()


def wait_received(srv: SdkServer, n: int, timeout: float = 5.0) -> None:
    wait_value(srv, "gpufeed_sdk_messages_received_total", n, timeout)


def wait_value(srv: SdkServer, name: str, want: float, timeout: float = 5.0, **labels: str) -> None:
    """Datagrams are processed by the server's thread: wait until `name` reaches `want`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = value(srv.families(), name, **labels) or 0
        if got >= want:
            return
        time.sleep(0.005)
    raise AssertionError(f"{name}{labels} did not reach {want}")


def test_sdk_and_agent_share_the_wire_format() -> None:
    assert sdk.HEADER.format == wire.HEADER.format
    assert sdk.PHASES == wire.PHASES
    assert (sdk.RANK_PHASES, sdk.COLLECTIVE_WAIT) == (wire.RANK_PHASES, wire.COLLECTIVE_WAIT)
    assert (sdk.MAGIC, sdk.WIRE_VERSION) == (wire.MAGIC, wire.WIRE_VERSION)
    assert sdk.MAX_WORLD_SIZE == wire.MAX_WORLD_SIZE
    kinds = ("STEP", "PHASE", "CHECKPOINT", "EPOCH", "CLOSE", "IO", "RANK")
    assert [getattr(sdk, "KIND_" + k) for k in kinds] == [getattr(wire, "KIND_" + k) for k in kinds]
    assert (sdk.MAX_JOB_ID_BYTES, sdk.MAX_NAME_BYTES) == (
        wire.MAX_JOB_ID_BYTES,
        wire.MAX_NAME_BYTES,
    )
    assert sdk.DEFAULT_SOCKET == DEFAULT_SDK_SOCKET
    assert sdk.MAX_DATAGRAM_BYTES == wire.MAX_DATAGRAM_BYTES
    assert sdk._MAX_IO_BYTES == wire.MAX_IO_BYTES
    assert sdk.REFUSED_CATEGORIES == wire.REFUSED_CATEGORIES


def test_socket_is_created_0660_and_removed_on_stop(tmp_path: Path) -> None:
    path = tmp_path / "sdk.sock"
    srv = SdkServer(str(path), max_jobs=1, max_messages_per_second=1, grace_seconds=1)
    srv.start()
    try:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o660
    finally:
        srv.stop()
    assert not path.exists()


def test_refuses_to_replace_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "sdk.sock"
    path.write_text("precious")
    srv = SdkServer(str(path), max_jobs=1, max_messages_per_second=1, grace_seconds=1)
    with pytest.raises(OSError, match="not a socket"):
        srv.start()
    assert path.read_text() == "precious"


def test_replaces_a_stale_socket_but_not_a_live_one(tmp_path: Path) -> None:
    path = str(tmp_path / "sdk.sock")
    first = SdkServer(path, max_jobs=1, max_messages_per_second=1, grace_seconds=1)
    first.start()
    second = SdkServer(path, max_jobs=1, max_messages_per_second=1, grace_seconds=1)
    with pytest.raises(OSError, match="another agent"):
        second.start()
    first.stop()
    # an agent killed with SIGKILL leaves its socket file behind, with nobody listening
    import socket

    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(path)
    dead.close()
    second.start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    finally:
        second.stop()


class SlowIterable:
    """Yields `n` items, each after `wait_s` of (real) sleeping in next()."""

    def __init__(self, n: int, wait_s: float) -> None:
        self.n, self.wait_s = n, wait_s

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            time.sleep(self.wait_s)
            yield i


def test_track_phase_checkpoint_epoch_reach_the_agent(
    server: SdkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_startup_reported", False)
    job = sdk.Job("resnet-test", socket=server.socket_path)
    assert job.job_id == os.environ.get("SLURM_JOB_ID", "resnet-test")
    ckpt = tmp_path / "ckpt.bin"
    t_wait = t_body = 0.0
    steps = 0
    for _ in job.track(SlowIterable(6, 0.004)):
        time.sleep(0.006)
        steps += 1
    with job.phase("eval"):
        time.sleep(0.01)
    with job.checkpoint(str(ckpt)):
        ckpt.write_bytes(b"x" * 12345)
    job.epoch()
    job.close()
    # events: startup, 6 steps, the end-of-data wait, eval, checkpoint, epoch, close
    assert (job.events_sent, job.events_dropped) == (12, 0)
    wait_value(server, "gpufeed_job_epoch_seconds_count", 1, job_id=job.job_id)
    fams = server.families()
    jid = job.job_id
    assert value(fams, "gpufeed_job_steps_total", job_id=jid) == steps == 6
    data_wait = value(fams, "gpufeed_job_phase_seconds_total", job_id=jid, phase="data_wait")
    compute = value(fams, "gpufeed_job_phase_seconds_total", job_id=jid, phase="compute")
    evals = value(fams, "gpufeed_job_phase_seconds_total", job_id=jid, phase="eval")
    assert data_wait is not None and compute is not None and evals is not None
    # the first item's wait ends the process's start-up: it is startup, not data_wait
    t_wait, t_body = 5 * 0.004, 6 * 0.006
    # sleeps last at least as long as asked; a loaded 2-core runner may add a lot
    assert t_wait <= data_wait < t_wait + 0.5
    assert t_body <= compute < t_body + 0.5
    assert 0.01 <= evals < 0.5
    assert value(fams, "gpufeed_job_checkpoint_written_bytes_total", job_id=jid) == 12345
    assert value(fams, "gpufeed_job_checkpoint_seconds_count", job_id=jid) == 1
    assert value(fams, "gpufeed_job_epoch_seconds_count", job_id=jid) == 1
    assert value(fams, "gpufeed_job_phase_seconds_total", job_id=jid, phase="startup") is not None


def test_a_process_older_than_the_agents_limit_still_reports(
    server: SdkServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up longer than the agent accepts in one event (a notebook kernel started 40
    days ago) is capped, so the flush that carries it, steps and all, is not refused."""
    monkeypatch.setattr(sdk, "_startup_reported", False)
    monkeypatch.setattr(sdk, "process_age_seconds", lambda: 40 * 86400.0)
    job = sdk.Job("old-kernel", socket=server.socket_path)
    for _ in job.track(range(3)):
        pass
    job.close()
    wait_received(server, 3)  # startup + step + end-of-data wait in one flush, then close
    fams = server.families()
    assert value(fams, "gpufeed_sdk_messages_dropped_total", reason="schema") == 0
    assert value(fams, "gpufeed_job_steps_total", job_id=job.job_id) == 3
    startup = value(fams, "gpufeed_job_phase_seconds_total", job_id=job.job_id, phase="startup")
    assert startup == wire.MAX_EVENT_SECONDS


def test_nested_phases_are_not_counted_twice(server: SdkServer) -> None:
    job = sdk.Job("nested", socket=server.socket_path)
    for _ in job.track([1]):
        with job.checkpoint():
            time.sleep(0.05)
    job.close()
    wait_value(server, "gpufeed_job_steps_total", 1, job_id=job.job_id)
    fams = server.families()
    jid = job.job_id
    ckpt = value(fams, "gpufeed_job_phase_seconds_total", job_id=jid, phase="checkpoint")
    compute = value(fams, "gpufeed_job_phase_seconds_total", job_id=jid, phase="compute")
    assert ckpt is not None and compute is not None
    assert ckpt >= 0.05
    assert compute < 0.02  # the body was all checkpoint
    assert value(fams, "gpufeed_job_checkpoint_written_bytes_total", job_id=jid) is None


def test_unknown_phase_is_a_clear_error() -> None:
    job = sdk.Job("x", socket="/nonexistent/sock")
    with pytest.raises(ValueError, match="phases are: compute"), job.phase("lunch"):
        pass


def test_without_an_agent_events_are_dropped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_startup_reported", False)
    job = sdk.Job("lonely", socket=str(tmp_path / "nobody.sock"))
    for _ in job.track(range(3)):
        pass
    job.epoch()
    job.close()
    # startup, 3 steps, the end-of-data wait, the epoch, close
    assert (job.events_sent, job.events_dropped) == (0, 7)


def test_no_file_descriptor_left_drops_events_without_raising(tmp_path: Path) -> None:
    """The SDK never raises into the training loop, even when socket() itself fails."""
    code = f"""
import os, resource
from gpufeed import sdk
job = sdk.Job("x", socket={str(tmp_path / "nobody.sock")!r})
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
fds = []
try:
    while True:
        fds.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
job.epoch()
job._flush()
job.close()
print(job.events_sent, job.events_dropped)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(sdk.__file__).parent.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "2"]


def test_agent_restart_reconnects(tmp_path: Path) -> None:
    path = str(tmp_path / "sdk.sock")
    job = sdk.Job("restart", socket=path)
    job.epoch()
    job._flush()  # no agent yet: dropped
    srv = SdkServer(path, max_jobs=4, max_messages_per_second=1000, grace_seconds=1)
    srv.start()
    try:
        job._retry_at = 0.0  # skip the one-second reconnect back-off
        job.epoch()
        job.close()
        wait_received(srv, 2)
        assert (job.events_sent, job.events_dropped) == (2, 1)
        assert value(srv.families(), "gpufeed_job_epoch_seconds_count", job_id=job.job_id) == 1
    finally:
        srv.stop()


def plain_sdk_env() -> dict[str, str]:
    """This environment, with gpufeed importable and no job id from outside (a scheduler's
    or `gpufeed run`'s, should the tests run under one): the job id is the name."""
    env = {**os.environ, "PYTHONPATH": str(Path(sdk.__file__).parents[1])}
    for var in (
        "SLURM_JOB_ID",
        "POD_UID",
        "GPUFEED_JOB_ID",
        "TORCHELASTIC_RUN_ID",
        "GPUFEED_RUN_ID",
    ):
        env.pop(var, None)
    return env


def test_several_processes_of_one_job_add_up(server: SdkServer) -> None:
    code = (
        "import sys; from gpufeed import sdk\n"
        "j = sdk.Job('ddp', socket=sys.argv[1])\n"
        "for _ in j.track(range(5)): pass\n"
        "j.close(); print(j.events_dropped)\n"
    )
    env = plain_sdk_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, server.socket_path], env=env, stdout=subprocess.PIPE
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [o.strip() for o in outs] == [b"0", b"0", b"0"]
    wait_value(server, "gpufeed_job_steps_total", 15, job_id="ddp")
    fams = server.families()
    assert value(fams, "gpufeed_job_steps_total", job_id="ddp") == 15


def test_garbage_is_dropped_by_reason(server: SdkServer) -> None:
    import socket

    good = wire.encode(wire.Message(wire.KIND_EPOCH, "g", "g", seconds=1.0))
    bad_version = good[:2] + bytes([9]) + good[3:]
    bad_phase = wire.encode(wire.Message(wire.KIND_PHASE, "g", "g", phase="eval", seconds=1))
    bad_phase = bad_phase[:4] + bytes([200]) + bad_phase[5:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(server.socket_path)
    for payload in (b"", b"x" * 9000, b"\x00" * 40, bad_version, bad_phase, good):
        s.send(payload)
    s.close()
    wait_received(server, 6)
    fams = server.families()
    dropped = {
        r: value(fams, "gpufeed_sdk_messages_dropped_total", reason=r) for r in wire.DROP_REASONS
    }
    assert dropped == {
        "size": 2,  # empty and oversized (truncated by the kernel)
        "version": 1,
        "schema": 1,  # no magic
        "phase": 1,
        "name_length": 0,
        "characters": 0,
        "max_jobs": 0,
        "rate": 0,
    }
    assert value(fams, "gpufeed_job_epoch_seconds_count", job_id="g") == 1


# Characters that make two job ids look alike or garble a log line: invisible (U+200B,
# U+FEFF, U+2060), bidirectional (U+202E, U+2066), line and paragraph separators, controls.
LOOKALIKE = ["\u200b", "\u202e", "\ufeff", "\u2028", "\u2029", "\u2060", "\u2066", "\x1b", "\x85"]


@pytest.mark.parametrize("char", LOOKALIKE)
@pytest.mark.parametrize("field", ["job_id", "name"])
def test_invisible_and_bidirectional_characters_are_refused(char: str, field: str) -> None:
    import unicodedata

    assert unicodedata.category(char) in wire.REFUSED_CATEGORIES
    fields = {"job_id": "train", "name": "resnet"}
    fields[field] = fields[field][:2] + char + fields[field][2:]
    msg = wire.Message(wire.KIND_EPOCH, fields["job_id"], fields["name"], seconds=1.0)
    assert wire.decode_datagram(wire.encode(msg)) == wire.REASON_CHARACTERS


def test_other_unicode_in_job_ids_is_kept() -> None:
    for text in ("résumé-训练", "job 7", "Ωmega\u00a0run", "emoji-\U0001f680"):
        msg = wire.Message(wire.KIND_EPOCH, text, text[:8], seconds=1.0)
        (got,) = wire.decode_datagram(wire.encode(msg))  # type: ignore[misc]
        assert got.job_id == text


def test_refused_characters_are_counted_by_reason(server: SdkServer) -> None:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(server.socket_path)
    for char in LOOKALIKE:
        s.send(wire.encode(wire.Message(wire.KIND_EPOCH, "job" + char, "n", seconds=1.0)))
    s.send(wire.encode(wire.Message(wire.KIND_EPOCH, "job", "n", seconds=1.0)))
    s.close()
    wait_received(server, len(LOOKALIKE) + 1)
    fams = server.families()
    got = value(fams, "gpufeed_sdk_messages_dropped_total", reason="characters")
    assert got == len(LOOKALIKE)
    assert value(fams, "gpufeed_job_epoch_seconds_count", job_id="job") == 1


def clocked_server(tmp_path: Path, max_jobs: int, rate: int) -> tuple[SdkServer, list[float]]:
    """A server not started (tests call handle()) on a clock the test moves: now[0]."""
    now = [100.0]
    srv = SdkServer(
        str(tmp_path / "s"),
        max_jobs=max_jobs,
        max_messages_per_second=rate,
        grace_seconds=60,
        clock=lambda: now[0],
    )
    return srv, now


def test_rate_and_max_jobs_limits(tmp_path: Path) -> None:
    srv, now = clocked_server(tmp_path, max_jobs=2, rate=10)
    msgs = [wire.encode(wire.Message(wire.KIND_EPOCH, f"job{i}", "n", seconds=1)) for i in range(3)]
    reasons = [srv.handle(m, 0) for m in msgs]
    assert reasons == [None, None, "max_jobs"]
    reasons = [srv.handle(msgs[0], 0) for _ in range(10)]
    assert reasons.count("rate") == 3  # 10 tokens a second, 3 used above
    now[0] += 1.0
    assert srv.handle(msgs[0], 0) is None


def test_ended_job_goes_after_grace_and_frees_its_slot() -> None:
    dead_pid = 4242
    alive = {dead_pid: True}
    table = JobTable(max_jobs=1, grace_seconds=30, pid_alive=lambda p: alive.get(p, False))
    m = wire.Message(wire.KIND_STEP, "j1", "n", seconds=0.1, compute_seconds=0.2, steps=1)
    assert table.apply(m, dead_pid, now=0.0) is None
    table.expire(10.0)
    assert table.job_ids() == ["j1"]
    alive[dead_pid] = False  # the process exits without close()
    table.expire(20.0)  # ended now; series stay for the grace period
    assert table.job_ids() == ["j1"]
    other = wire.Message(wire.KIND_EPOCH, "j2", "n", seconds=1)
    assert table.apply(other, 0, now=21.0) is None  # the ended job's slot is reused
    assert table.job_ids() == ["j2"]
    table.expire(21.0 + 299.0)  # pid-less process: alive until 300 s of silence
    assert table.job_ids() == ["j2"]
    table.expire(21.0 + 300.0)  # silent for 300 s: ended now
    assert table.job_ids() == ["j2"]
    table.expire(21.0 + 300.0 + 30.0)
    assert table.job_ids() == []


def test_a_reused_pid_neither_keeps_an_ended_job_nor_joins_it() -> None:
    alive = {4242: True, 4243: True}
    table = JobTable(max_jobs=4, grace_seconds=30, pid_alive=lambda p: alive.get(p, False))
    m = wire.Message(wire.KIND_EPOCH, "j", "n", seconds=1)
    table.apply(m, 4242, 0.0)
    table.apply(m, 4243, 0.0)
    table.expire(1.0)
    assert table.pids_by_job() == {"j": [4242, 4243]}
    alive[4242] = False  # exits without close()
    table.expire(2.0)
    assert table.pids_by_job() == {"j": [4243]} and table.job_for_pid(4242) is None
    alive[4242] = True  # the pid now belongs to some unrelated process
    alive[4243] = False
    table.expire(3.0)
    assert table.pids_by_job() == {"j": []}
    table.expire(3.0 + 30.0)
    assert table.job_ids() == []


def test_close_ends_the_job_after_grace() -> None:
    table = JobTable(max_jobs=4, grace_seconds=5, pid_alive=lambda p: True)
    table.apply(wire.Message(wire.KIND_EPOCH, "j", "n", seconds=1), 4242, 0.0)
    table.apply(wire.Message(wire.KIND_CLOSE, "j", "n"), 4242, 1.0)
    table.expire(2.0)
    assert table.job_ids() == ["j"]
    table.expire(7.0)
    assert table.job_ids() == []


def test_agent_takes_the_job_id_from_the_senders_cgroup(tmp_path: Path) -> None:
    srv = SdkServer(
        str(tmp_path / "s"),
        max_jobs=4,
        max_messages_per_second=100,
        grace_seconds=5,
        procfs=FIXTURES / "procfs_jobs",
    )
    m = wire.encode(wire.Message(wire.KIND_EPOCH, "claimed-id", "train", seconds=2.0))
    assert srv.handle(m, 100) is None  # pid 100 of the fixture procfs is in Slurm job 987654
    assert srv.handle(m, 200) is None  # pid 200 is a plain process: its own claim stands
    fams = srv.families()
    assert value(fams, "gpufeed_job_epoch_seconds_count", job_id="987654") == 1
    assert value(fams, "gpufeed_job_epoch_seconds_count", job_id="claimed-id") == 1
    assert srv.job_for_pid(100) == ("987654", "train")


def test_job_id_from_slurm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    assert sdk.Job("x", socket="/nonexistent").job_id == "777"
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("POD_UID", "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab")
    assert sdk.Job("x", socket="/nonexistent").job_id == "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab"


def test_socket_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFEED_SOCKET", "/tmp/elsewhere.sock")
    assert sdk.Job("x").socket_path == "/tmp/elsewhere.sock"
    monkeypatch.delenv("GPUFEED_SOCKET")
    assert sdk.Job("x").socket_path == DEFAULT_SDK_SOCKET
    assert sdk.Job("x", socket="/a").socket_path == "/a"


def test_import_gpufeed_and_sdk_stay_light() -> None:
    code = (
        "import sys, gpufeed\n"
        "j = gpufeed.Job('x', socket='/nonexistent')\n"
        "heavy = {'torch', 'aiohttp', 'pynvml', 'yaml', 'prometheus_client', 'psutil'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(sdk.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
    assert out.stdout.strip() == b"[]"


def test_steps_are_summed_in_the_process_not_sent_one_by_one(
    server: SdkServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_startup_reported", False)
    job = sdk.Job("batched", socket=server.socket_path)
    for _ in job.track(range(5000)):
        pass
    job.close()
    assert (job.events_sent, job.events_dropped) == (5000 + 3, 0)  # + startup, end wait, close
    wait_value(server, "gpufeed_job_steps_total", 5000, job_id=job.job_id)
    received = value(server.families(), "gpufeed_sdk_messages_received_total")
    assert received is not None and received < 100  # one datagram per FLUSH_SECONDS or so


def test_a_process_reports_its_own_io_when_it_closes(server: SdkServer, tmp_path: Path) -> None:
    """At close (here: at exit, without calling close()), before CLOSE: the process's
    /proc/self/io, read after its last write, in a datagram of its own."""
    code = (
        "import os, sys; from gpufeed import sdk\n"
        "j = sdk.Job('writer', socket=sys.argv[1])\n"
        "for _ in j.track(range(2)): pass\n"
        "with open(sys.argv[2], 'wb') as f: f.write(os.urandom(3 << 20))\n"
        "print(os.getpid(), os.getppid(), flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, server.socket_path, str(tmp_path / "ckpt")],
        env=plain_sdk_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    pid, ppid = map(int, out.stdout.split())
    deadline = time.monotonic() + 5
    while not server.final_io_by_job() and time.monotonic() < deadline:
        time.sleep(0.01)
    (job_id, reports), *_ = server.final_io_by_job().items()
    assert job_id == "writer"
    got_ppid, got = reports[pid]
    assert got_ppid in (ppid, 0)  # 0 if it had exited before the agent read its parent
    assert 3 << 20 <= got.written_bytes < (3 << 20) + (1 << 20)
    fams = server.families()
    assert value(fams, "gpufeed_sdk_messages_dropped_total", reason="schema") == 0


def test_rate_is_shared_fairly_between_senders(tmp_path: Path) -> None:
    """A flooding sender beside a real job: the job keeps every message while it sends
    less than its share (before 0.2.0 one bucket for all: the job lost 73%)."""
    srv, now = clocked_server(tmp_path, max_jobs=8, rate=1000)
    flood = wire.encode(wire.Message(wire.KIND_EPOCH, "flood", "f", seconds=1))
    real = wire.encode(wire.Message(wire.KIND_EPOCH, "real", "r", seconds=1))
    real_ok = flood_ok = 0
    for tick in range(10_000):  # 10 s: the flood sends 900 a tick, the job 1 in 25
        now[0] = 100.0 + tick / 1000
        flood_ok += sum(srv.handle(flood, 0, uid=1001) is None for _ in range(9))
        if tick % 25 == 0:
            real_ok += srv.handle(real, 0, uid=1000) is None
    assert real_ok == 400  # all of them
    # the flood gets its share, half the agent's rate (plus a first second's burst)
    assert 500 * 10 - 100 <= flood_ok <= 500 * 10 + 1000
    assert srv.senders_active() == 2


def test_a_sender_cannot_keep_every_job_slot(tmp_path: Path) -> None:
    """One sender may fill the table while alone, but gives slots back when another comes:
    each keeps at least max_jobs / senders."""
    srv, now = clocked_server(tmp_path, max_jobs=8, rate=100_000)

    def epoch(job: str, uid: int) -> str | None:
        now[0] += 0.001
        return srv.handle(
            wire.encode(wire.Message(wire.KIND_EPOCH, job, "n", seconds=1)), 0, uid=uid
        )

    assert [epoch(f"hog-{i}", 1001) for i in range(8)] == [None] * 8
    assert epoch("hog-8", 1001) == "max_jobs"  # alone, it still cannot exceed the table
    for i in range(8):  # keeps all its jobs busy
        epoch(f"hog-{i}", 1001)
    assert [epoch(f"real-{i}", 1000) for i in range(5)] == [None] * 4 + ["max_jobs"]
    assert epoch("hog-new", 1001) == "max_jobs"  # it cannot take them back
    fams = srv.families()
    jobs = {
        s.label("job_id") for s in iter_samples(fams) if s.name == "gpufeed_job_epoch_seconds_count"
    }
    assert {j for j in jobs if j.startswith("real")} == {f"real-{i}" for i in range(4)}
    assert len({j for j in jobs if j.startswith("hog")}) == 4
    # the hog lost its least recently updated jobs, not the ones it just used
    assert value(fams, "gpufeed_sdk_messages_dropped_total", reason="max_jobs") == 3


def test_a_sender_back_from_silence_does_not_reset_the_shares() -> None:
    """The senders active are counted by their last message: one coming back after a
    silence is counted with the others, not alone."""
    from gpufeed.jobs.senders import ACTIVE_SECONDS, Senders

    s = Senders(1000.0, now=0.0)
    a, b, c = (1000, "process", "a"), (1001, "process", "b"), (1002, "process", "c")
    assert s.take(a, 0.0) and s.take(b, 0.0)
    assert s.active() == 2
    t = 0.0
    while t < ACTIVE_SECONDS + 5:  # a and b keep sending; c has not been heard yet
        t += 0.5
        s.take(a, t)
        s.take(b, t)
    s.take(c, t)
    assert s.active() == 3
    t += ACTIVE_SECONDS + 5  # everyone silent, then a alone comes back: it has it all
    s.take(a, t)
    t += 2.0
    s.take(b, t)  # b comes back after a silence: two active, not one
    assert s.active() == 2 and s.share_per_second == 500.0


def _fill(path: str) -> socket.socket:
    """Another sender's datagrams until the receiver's kernel queue refuses one: a busy
    agent whose queue (net.unix.max_dgram_qlen, 10 by default) every rank shares."""
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.connect(path)
    for sent in range(10_000):
        try:
            other.send(b"x", socket.MSG_DONTWAIT)
        except BlockingIOError:
            assert sent > 0, "the queue refused the very first datagram"
            return other
    raise AssertionError("the receiver's queue never filled")


def test_a_full_queue_delays_steps_and_checkpoints_it_does_not_lose_them(tmp_path: Path) -> None:
    """A real receiving socket nobody reads for a while: the flushes meanwhile are refused,
    their sums and observations go with the first flush the queue takes, none is lost."""
    path = str(tmp_path / "sdk.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)
    other = _fill(path)
    job = sdk.Job("burst", socket=path)
    steps = 0
    for flush in range(5):
        for _ in range(7):
            job._add_step(0.001, 0.01, 0.0)  # now=0.0: summed, no flush of its own
            steps += 1
        job._emit(sdk.KIND_CHECKPOINT, 0.5, 1000 + flush)
        job._flush()  # refused: the queue is full
    assert job.events_dropped == 0, "a full queue lost events"
    assert job.events_sent == 0, "nothing can have gone yet"
    agent.setblocking(False)
    while True:  # the agent catches up
        try:
            agent.recv(65536)
        except BlockingIOError:
            break
    job.close()
    got = []
    while True:
        try:
            decoded = wire.decode_datagram(agent.recv(65536))
        except BlockingIOError:
            break
        assert not isinstance(decoded, str), decoded
        got += decoded
    stepped = [m for m in got if m.kind == wire.KIND_STEP]
    checkpoints = sorted(m.checkpoint_bytes or 0 for m in got if m.kind == wire.KIND_CHECKPOINT)
    assert sum(m.steps for m in stepped) == steps == 35
    assert sum(m.compute_seconds for m in stepped) == pytest.approx(35 * 0.01)
    assert checkpoints == [1000, 1001, 1002, 1003, 1004]
    assert (job.events_sent, job.events_dropped) == (35 + 5 + 1, 0)  # + CLOSE
    other.close()
    agent.close()


def test_close_gives_a_full_queue_half_a_second_then_drops(tmp_path: Path) -> None:
    """Nothing comes after close(): it tries a full queue again for a moment (the loop is
    over), then counts what did not go as dropped rather than wait for ever."""
    path = str(tmp_path / "sdk.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)
    other = _fill(path)
    job = sdk.Job("stuck", socket=path)
    for _ in range(3):
        job._add_step(0.001, 0.01, 0.0)
    began = time.monotonic()
    job.close()
    took = time.monotonic() - began
    assert job.events_sent == 0
    assert job.events_dropped == 3 + 1  # the steps, the CLOSE
    assert 0.5 <= took < 5.0, took
    other.close()
    agent.close()
