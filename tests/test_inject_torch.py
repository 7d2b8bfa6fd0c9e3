"""The torch patches of `gpufeed run`, with real torch (CPU) and the real SDK server; no root.

Covers what the end-to-end training test does not: torch.distributed.checkpoint.save, a
torch.save into memory (not a checkpoint), a torch.save nested in dcp.save (counted once),
and a DataLoader loop left with `break`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import iter_samples
from gpufeed.run_cli import instrumented_env

pytestmark = pytest.mark.slow

EXPORTER = Path(__file__).parents[1] / "exporter"

PROGRAM = r"""
import io, json, os, sys, time
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader

out = {}
loader = DataLoader(list(range(20)), batch_size=2)
for i, batch in enumerate(loader):          # 10 batches; leave after the 4th
    time.sleep(0.01)
    if i == 3:
        break
del batch
torch.save({"x": torch.zeros(10)}, io.BytesIO())          # memory: not a checkpoint
path = os.path.join(sys.argv[1], "model.pt")
with open(path, "wb") as f:                               # a real file object
    torch.save({"w": torch.zeros(1000)}, f)
out["file_bytes"] = os.path.getsize(path)
ck = os.path.join(sys.argv[1], "dcp")
dcp.save({"w": torch.zeros(5000)}, checkpoint_id=ck)
out["dcp_bytes"] = sum(os.path.getsize(os.path.join(ck, n)) for n in os.listdir(ck))
print(json.dumps(out))
"""


def test_torch_patches_under_gpufeed_run(tmp_path: Path) -> None:
    srv = SdkServer(
        str(tmp_path / "sdk.sock"), max_jobs=8, max_messages_per_second=10000, grace_seconds=60
    )
    srv.start()
    try:
        code = (
            "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from gpufeed.run_cli import main; sys.exit(main(sys.argv[1:]))"
        )
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                str(EXPORTER),
                "--socket",
                srv.socket_path,
                "--name",
                "patched",
                "--",
                sys.executable,
                "-c",
                PROGRAM,
                str(tmp_path),
            ],
            env={"PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        own = json.loads(out.stdout.strip().splitlines()[-1])
        deadline = time.monotonic() + 10
        got: dict[tuple[str, str], float] = {}
        while time.monotonic() < deadline:
            samples = [s for s in iter_samples(srv.families()) if s.label("name") == "patched"]
            job_ids = {s.label("job_id") for s in samples}
            got = {(s.name, s.label("phase")): s.value for s in samples}
            if got.get(("gpufeed_job_checkpoint_seconds_count", "")) == 2:
                break
            time.sleep(0.05)
    finally:
        srv.stop()
    (job_id,) = job_ids  # the run's own id (no scheduler here), not the name
    assert job_id.startswith(("run", "pg")), job_id
    assert got[("gpufeed_job_steps_total", "")] == 4  # the step left with break included
    assert got[("gpufeed_job_phase_seconds_total", "compute")] >= 4 * 0.01
    assert ("gpufeed_job_phase_seconds_total", "data_wait") in got
    assert ("gpufeed_job_phase_seconds_total", "startup") in got
    # two checkpoints: the file object and dcp.save (the BytesIO save and the torch.save
    # calls inside dcp.save are not counted)
    assert got[("gpufeed_job_checkpoint_seconds_count", "")] == 2
    assert (
        got[("gpufeed_job_checkpoint_written_bytes_total", "")]
        == own["file_bytes"] + own["dcp_bytes"]
    )


def test_a_job_that_cannot_be_made_never_breaks_the_program(tmp_path: Path) -> None:
    """With no Job to report to (here a blank job name, which the SDK refuses), the
    patched DataLoader and torch.save still do their work; the user is told once."""
    program = (
        "import os, sys, torch\n"
        "from torch.utils.data import DataLoader\n"
        "assert sum(int(b.sum()) for b in DataLoader(list(range(6)), batch_size=2)) == 15\n"
        "torch.save({'w': torch.zeros(10)}, os.path.join(sys.argv[1], 'a.pt'))\n"
        "torch.save({'w': torch.zeros(10)}, os.path.join(sys.argv[1], 'b.pt'))\n"
    )
    env = instrumented_env({"PATH": os.environ["PATH"]}, str(tmp_path / "none.sock"))
    env["GPUFEED_JOB_NAME"] = "   "  # set by hand: `gpufeed run --name` refuses it
    out = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "a.pt").stat().st_size > 0 and (tmp_path / "b.pt").stat().st_size > 0
    # told once: when torch is imported (the job registers then), not at every save
    assert out.stderr.count("gpufeed: ") == 1
    assert "gpufeed: job not registered" in out.stderr


# DLIO's training loop (dlio_benchmark.main._train) in small: a DataLoader with persistent
# workers that the data-loader object keeps, read through a generator, left with `break`
# at the last step; the program then goes on (DLIO's end of epoch, its statistics, MPI's
# finalize) and exits with the iterator still alive. The step in flight at the break was
# lost (DLIO: 63 of 64 steps); at exit it must be reported once, without the tail.
DLIO_SHAPE = r"""
import json, sys, time
from torch.utils.data import DataLoader

class Loader:
    def __init__(self):
        self.dataset = DataLoader(list(range(64)), batch_size=4, num_workers=1,
                                  persistent_workers=True)
    def next(self):
        for batch in self.dataset:
            yield batch

loader = Loader()
steps = 0
for batch in loader.next():
    time.sleep(0.05)                     # the "computation_time"
    steps += 1
    if steps == int(sys.argv[1]):
        break
time.sleep(float(sys.argv[2]))           # after the loop: not the last step's compute
print(json.dumps({"steps": steps}))
"""


def _run_instrumented(srv: SdkServer, program: str, *args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", program, *args],
        env=instrumented_env({"PATH": os.environ["PATH"]}, srv.socket_path, "dlio-shape"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    want = json.loads(out.stdout.strip().splitlines()[-1])["steps"]
    deadline = time.monotonic() + 10
    got: dict[str, float] = {}
    while time.monotonic() < deadline:
        got = {
            s.name + ":" + s.label("phase"): s.value
            for s in iter_samples(srv.families())
            if s.label("name") == "dlio-shape"
        }
        if got.get("gpufeed_job_steps_total:") == want:
            break
        time.sleep(0.05)
    return got


def test_the_step_in_flight_at_exit_is_reported_once(tmp_path: Path) -> None:
    srv = SdkServer(
        str(tmp_path / "sdk.sock"), max_jobs=8, max_messages_per_second=10000, grace_seconds=60
    )
    srv.start()
    try:
        got = _run_instrumented(srv, DLIO_SHAPE, "16", "1.0")
    finally:
        srv.stop()
    assert got["gpufeed_job_steps_total:"] == 16, got  # all of them, the last one once
    compute = got["gpufeed_job_phase_seconds_total:compute"]
    # 16 x 50 ms; the second after the loop is no step's compute
    assert 16 * 0.05 <= compute < 16 * 0.05 + 0.4, got
