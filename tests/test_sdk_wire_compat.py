"""Wire format compatibility across the per-rank change (issue 13), with real code both ways.

- an SDK of 0.2.0 (tests/fixtures/sdk_v0_2_0/sdk.py, verbatim) against today's agent: its
  jobs add up exactly as before, and no per-rank series appear;
- today's SDK against the decoder of 0.2.0 (tests/fixtures/sdk_v0_2_0/wire.py, verbatim):
  the only datagrams it refuses are the new ones (RANK and collective_wait), and what it
  decodes of the rest is everything the job reported.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from gpufeed import sdk
from gpufeed.jobs import wire
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import iter_samples
from test_sdk import (
    SlowIterable,
    server,  # noqa: F401 (the real SDK server, a fixture)
    value,
    wait_value,
)

OLD = Path(__file__).parent / "fixtures" / "sdk_v0_2_0"
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def old_sdk() -> Iterator[ModuleType]:
    yield _load("gpufeed_sdk_v0_2_0", OLD / "sdk.py")
    sys.modules.pop("gpufeed_sdk_v0_2_0", None)


@pytest.fixture
def old_wire() -> Iterator[ModuleType]:
    yield _load("gpufeed_wire_v0_2_0", OLD / "wire.py")
    sys.modules.pop("gpufeed_wire_v0_2_0", None)


def test_an_sdk_of_0_2_0_reports_to_this_agent_as_before(
    old_sdk: ModuleType,
    server: SdkServer,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a launcher's rank in the environment: the old SDK does not know it and says nothing
    for var, val in zip(RANK_ENV, ("1", "2", "1"), strict=True):
        monkeypatch.setenv(var, val)
    monkeypatch.setenv("GPUFEED_JOB_ID", "old-job")
    job = old_sdk.Job("old", socket=server.socket_path)
    for _ in job.track(SlowIterable(4, 0.002)):
        pass
    with job.phase("eval"):
        pass
    job.epoch()
    job.close()
    assert job.events_dropped == 0
    wait_value(server, "gpufeed_job_epoch_seconds_count", 1, job_id="old-job")
    fams = server.families()
    assert value(fams, "gpufeed_job_steps_total", job_id="old-job") == 4
    wait = value(fams, "gpufeed_job_phase_seconds_total", job_id="old-job", phase="data_wait")
    assert wait is not None and wait >= 4 * 0.002
    assert value(fams, "gpufeed_job_epoch_seconds_count", job_id="old-job") == 1
    assert value(fams, "gpufeed_sdk_messages_dropped_total", reason="schema") == 0
    ranked = [s for s in iter_samples(fams) if s.name.startswith("gpufeed_job_rank_")]
    assert ranked == []


class Capture:
    """A bare datagram socket that keeps what arrives (a thread drains it: the kernel queues
    only net.unix.max_dgram_qlen datagrams)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.datagrams: list[bytes] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.datagrams.append(self._sock.recv(65536))
            except TimeoutError:
                continue

    def close(self) -> list[bytes]:
        time.sleep(0.3)  # the last datagrams: drained by the thread before it stops
        self._stop.set()
        self._thread.join()
        self._sock.close()
        return self.datagrams


def test_this_sdk_loses_only_its_new_datagrams_at_an_agent_of_0_2_0(
    old_wire: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, val in zip(RANK_ENV, ("3", "4", "1"), strict=True):
        monkeypatch.setenv(var, val)
    monkeypatch.setattr(sdk, "FLUSH_SECONDS", 0.0)  # one flush per event: many datagrams
    capture = Capture(tmp_path / "capture.sock")
    try:
        job = sdk.Job("new", socket=capture.path)
        steps = 0
        for _ in job.track(SlowIterable(5, 0.001)):
            with job.collective():
                time.sleep(0.001)
            steps += 1
        job.close()
    finally:
        datagrams = capture.close()
    assert job.events_dropped == 0
    refused, decoded = [], []
    for d in datagrams:
        got = old_wire.decode_datagram(d)
        (refused if isinstance(got, str) else decoded).append((d, got))
    # every refused datagram is one of the new ones: RANK first, collective_wait maybe
    assert refused, "the new SDK sent no RANK datagram"
    for raw, reason in refused:
        assert reason == "schema"
        new = sdk.HEADER.unpack_from(raw)
        assert new[2] == sdk.KIND_RANK
    # ... which carried the rank and the collective waits (this agent's decoder reads them)
    new_msgs = [m for raw, _ in refused for m in _decoded(raw)]
    assert {(m.rank, m.world_size, m.local_rank) for m in new_msgs if m.kind == wire.KIND_RANK} == {
        (3, 4, 1)
    }
    waited = sum(m.seconds for m in new_msgs if m.phase == wire.COLLECTIVE_WAIT)
    assert waited >= 5 * 0.001
    # and none of the old kinds was packed into a refused datagram
    old_steps = sum(m.steps for _, msgs in decoded for m in msgs)
    assert old_steps == steps == 5
    kinds = {m.kind for _, msgs in decoded for m in msgs}
    assert kinds >= {old_wire.KIND_STEP, old_wire.KIND_CLOSE}


def _decoded(raw: bytes) -> list[wire.Message]:
    got = wire.decode_datagram(raw)
    assert isinstance(got, list), got
    return got
