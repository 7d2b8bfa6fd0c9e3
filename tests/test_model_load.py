"""Model-load time (issue 17): the wire's LOAD message, the agent's sums per storage tier,
the SDK's `Job.load` and `gpufeed run`'s torch.load patch, each against the real SDK
server; and a job that registers before its first step (`gpufeed_job_processes`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpufeed
from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import JobTable
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import iter_samples
from gpufeed.run_cli import instrumented_env

LOAD = "gpufeed_job_model_load_seconds_total"
LOAD_BYTES = "gpufeed_job_model_load_bytes_total"
LOADING = "gpufeed_job_model_loading_bytes"


def _load(stage: str, seconds: float, device: int | None, nbytes: int | None) -> wire.Message:
    return wire.Message(
        wire.KIND_LOAD, "j1", "m", phase=stage, seconds=seconds, device=device, load_bytes=nbytes
    )


def test_load_messages_round_trip_and_bad_ones_are_refused() -> None:
    for msg in (_load("begin", 0.0, 2049, 4_000_000_000), _load("end", 20.5, None, None)):
        assert wire.decode_datagram(wire.encode(msg)) == [msg]
    head = wire.HEADER
    ok = head.pack(wire.MAGIC, 1, wire.KIND_LOAD, 1, 0, 2, 1, 3.0, 2049.0, 10) + b"j1m"
    assert isinstance(wire.decode_datagram(ok), list)
    for phase, a, b, n, reason in (
        (2, 3.0, 2049.0, 10, wire.REASON_PHASE),  # no third stage
        (0, 3.0, 2049.0, 10, wire.REASON_SCHEMA),  # a begin carries no seconds
        (1, -1.0, 2049.0, 10, wire.REASON_SCHEMA),
        (1, 3.0, 2049.5, 10, wire.REASON_SCHEMA),  # a device is a whole number
        (1, 3.0, float(wire.MAX_DEVICE), 10, wire.REASON_SCHEMA),
        (1, 3.0, 2049.0, -2, wire.REASON_SCHEMA),
    ):
        bad = head.pack(wire.MAGIC, 1, wire.KIND_LOAD, phase, 0, 2, 1, a, b, n) + b"j1m"
        assert wire.decode_datagram(bad) == reason, (phase, a, b, n)


def _values(fams: list, name: str) -> dict[str, float]:
    return {s.label("tier"): s.value for s in iter_samples(fams) if s.name == name}


def test_loads_are_summed_per_tier_and_a_running_one_is_seen() -> None:
    alive = {10, 11}
    table = JobTable(8, 60.0, lambda pid: pid in alive)
    cold = os.makedev(7, 3)
    tiers = {"7:3": "cold"}
    table.apply(_load("begin", 0.0, cold, 4_000_000_000), pid=10, now=0.0)
    table.apply(_load("begin", 0.0, os.makedev(8, 1), 1000), pid=11, now=0.0)
    fams = table.families(now=1.0, devices_to_tier=tiers)
    # running: the cold tier's file, and one on a device in no tier
    assert _values(fams, LOADING) == {"cold": 4e9, "unattributed": 1000.0}
    assert _values(fams, LOAD) == {}
    table.apply(_load("end", 0.0 + 20.0, cold, 4_000_000_000), pid=10, now=20.0)
    alive.discard(11)  # the other process died mid-load: its load is over
    table.expire(21.0)
    fams = table.families(now=21.0, devices_to_tier=tiers)
    assert _values(fams, LOADING) == {}
    assert _values(fams, LOAD) == {"cold": 20.0}
    assert _values(fams, LOAD_BYTES) == {"cold": 4e9}
    # the job's processes: 10 lives, 11 exited
    procs = [s.value for s in iter_samples(fams) if s.name == "gpufeed_job_processes"]
    assert procs == [1.0]


@pytest.fixture
def server(tmp_path: Path):
    srv = SdkServer(
        str(tmp_path / "sdk.sock"), max_jobs=8, max_messages_per_second=10000, grace_seconds=60
    )
    srv.start()
    yield srv
    srv.stop()


def _tier_map(path: Path) -> dict[str, str]:
    dev = os.stat(path).st_dev
    return {f"{os.major(dev)}:{os.minor(dev)}": "cold"}


def _wait_for(srv: SdkServer, tiers: dict[str, str], name: str, check, timeout: float = 10):
    deadline = time.monotonic() + timeout
    fams: list = []
    while time.monotonic() < deadline:
        fams = [s for s in iter_samples(srv.families(None, tiers)) if s.label("name") == name]
        if check(fams):
            return fams
        time.sleep(0.05)
    return fams


def test_sdk_job_registers_and_its_load_is_seen_while_it_runs(
    server: SdkServer, tmp_path: Path
) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"\0" * 123_456)
    tiers = _tier_map(weights)
    job = gpufeed.Job("sdk-load", socket=server.socket_path)
    try:
        # registered at once: a job that has not stepped, not an absent one
        got = _wait_for(
            server, tiers, "sdk-load", lambda f: any(s.name == "gpufeed_job_processes" for s in f)
        )
        assert {(s.name, s.value) for s in got} >= {
            ("gpufeed_job_processes", 1.0),
            ("gpufeed_job_steps_total", 0.0),
        }
        with job.load(str(weights)):
            running = _wait_for(server, tiers, "sdk-load", lambda f: _has(f, LOADING))
            assert [(s.label("tier"), s.value) for s in running if s.name == LOADING] == [
                ("cold", 123_456.0)
            ]
            with job.load(str(weights)):  # nested: part of the outer one, not its own
                time.sleep(0.2)
        done = _wait_for(server, tiers, "sdk-load", lambda f: _has(f, LOAD))
    finally:
        job.close()
    by = {s.name: s for s in done}
    assert LOADING not in by
    assert by[LOAD].label("tier") == "cold" and 0.2 <= by[LOAD].value < 5
    assert by[LOAD_BYTES].value == 2 * 123_456


def _has(fams: list, name: str) -> bool:
    return any(s.name == name for s in fams)


PROGRAM = r"""
import io, json, os, sys, time
import torch
path = os.path.join(sys.argv[1], "weights.pt")
torch.save({"w": torch.zeros(250_000)}, path)
time.sleep(1.0)                                    # registered, no step, no load yet
w = torch.load(path, weights_only=True)            # a model load from storage
buf = io.BytesIO(); torch.save({"x": torch.zeros(10)}, buf); buf.seek(0)
torch.load(buf, weights_only=True)                 # from memory: not a load
with open(path, "rb") as f:
    torch.load(f, weights_only=True)               # a real file object: a load
print(json.dumps({"bytes": os.path.getsize(path)}))
"""


@pytest.mark.slow
def test_gpufeed_run_times_torch_load_from_its_tier(server: SdkServer, tmp_path: Path) -> None:
    tiers = _tier_map(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(tmp_path)],
        env=instrumented_env({"PATH": os.environ["PATH"]}, server.socket_path, "run-load"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the job is there while the program sleeps before anything it does is timed
        early = _wait_for(
            server, tiers, "run-load", lambda f: _has(f, "gpufeed_job_processes"), timeout=60
        )
        assert _has(early, "gpufeed_job_processes") and not _has(early, LOAD)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    size = json.loads(out.strip().splitlines()[-1])["bytes"]
    got = _wait_for(server, tiers, "run-load", lambda f: any(s.name == LOAD_BYTES for s in f))
    by = {s.name: s for s in got}
    assert by[LOAD_BYTES].label("tier") == "cold"
    assert by[LOAD_BYTES].value == 2 * size  # the path and the file object, not the BytesIO
    assert 0 < by[LOAD].value < 30
    # checkpoints are untouched by this: the one torch.save to a path is one checkpoint
    assert by["gpufeed_job_checkpoint_written_bytes_total"].value == size


# A stand-in for transformers' modeling_utils (transformers is not a test dependency: it is
# large). Like the real one it binds `safe_open` at import and its from_pretrained opens
# the weight files of one format in the model directory.
FAKE_TRANSFORMERS = r"""
import os
from safetensors import safe_open

class PreTrainedModel:
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path):
        out = {}
        for name in sorted(os.listdir(pretrained_model_name_or_path)):
            if name.endswith(".safetensors"):
                path = os.path.join(pretrained_model_name_or_path, name)
                with safe_open(path, framework="pt") as f:
                    out.update({k: f.get_tensor(k) for k in f.keys()})
        return out
"""

SAFETENSORS_PROGRAM = r"""
import json, os, sys
import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open
from transformers.modeling_utils import PreTrainedModel
root = sys.argv[1]
path = os.path.join(root, "model.safetensors")
save_file({"w": torch.zeros(200_000), "b": torch.ones(1000)}, path)
load_file(path)                                    # a load (through safe_open: once)
with safe_open(path, framework="pt") as f:         # the header only: not a load
    f.metadata()
with safe_open(path, framework="pt") as f:         # a load
    [f.get_tensor(k) for k in f.keys()]
model = os.path.join(root, "model")
os.mkdir(model)
save_file({"w": torch.zeros(100_000)}, os.path.join(model, "model.safetensors"))
torch.save({"w": torch.zeros(100_000)}, os.path.join(model, "pytorch_model.bin"))
with open(os.path.join(model, "config.json"), "w") as c:
    c.write("{}" * 1000)
PreTrainedModel.from_pretrained(model)             # its safetensors file only
print(json.dumps({"file": os.path.getsize(path),
                  "model": os.path.getsize(os.path.join(model, "model.safetensors"))}))
"""


@pytest.mark.slow
def test_gpufeed_run_times_safetensors_loads_once_per_file(
    server: SdkServer, tmp_path: Path
) -> None:
    fake = tmp_path / "fake" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "modeling_utils.py").write_text(FAKE_TRANSFORMERS)
    env = instrumented_env({"PATH": os.environ["PATH"]}, server.socket_path, "run-st")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH"), str(tmp_path / "fake")) if p
    )
    tiers = _tier_map(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", SAFETENSORS_PROGRAM, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    sizes = json.loads(proc.stdout.strip().splitlines()[-1])
    want = 2 * sizes["file"] + sizes["model"]
    got = _wait_for(
        server, tiers, "run-st", lambda f: any(s.name == LOAD_BYTES and s.value >= want for s in f)
    )
    by = {s.name: s for s in got}
    # load_file and the safe_open that read tensors, once each; the header-only open
    # nothing; from_pretrained the directory's safetensors file, not the .bin copy nor
    # the config
    assert by[LOAD_BYTES].label("tier") == "cold"
    assert by[LOAD_BYTES].value == want
    assert by[LOAD].label("tier") == "cold" and 0 < by[LOAD].value < 30
    assert LOADING not in by
