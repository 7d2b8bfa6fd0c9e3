"""End to end, with real parts: a real PyTorch training run on the CPU reads its samples from
one loop-mounted ext4 tier and writes torch.save checkpoints to another, inside a real
(v1 blkio) cgroup laid out the way Slurm lays out a job's. Once with the SDK, once unmodified
under `gpufeed run` in a Python environment that does not have gpufeed. The agent side is
the real SDK server on a temporary socket and the real jobs / job_io collectors.

Tolerance for phase times: the agent's figures and the loop's own come from the same clock
(perf_counter, same process) bracketing the same code; they differ by the few microseconds
of tracking code between the two pairs of timestamps, per step, and by any preemption that
lands between them on a loaded 2-core runner. Measured: 2-4 ms apart in total over 24 steps
(0.1-0.2 ms a step). We allow 0.5 ms per step plus 2%, which still tells data_wait from
compute (the loop body does about twice the work of the data wait).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.job_io import JobIoCollector
from gpufeed.collectors.jobs import JobsCollector
from gpufeed.collectors.sdk import SdkCollector
from gpufeed.config import AgentConfig, SdkConfig
from gpufeed.gpu.backend import GpuIdentity, GpuProcess, GpuSample
from gpufeed.model import Family, iter_samples
from host_needs import missing

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).parents[1]
EXPORTER = REPO / "exporter"
SCRIPT = REPO / "tests" / "helpers" / "train_tiny.py"
BLKIO = Path("/sys/fs/cgroup/blkio")
SAMPLES = 48
SAMPLE_BYTES = 128 * 1024
TIB_PER_S = 1 << 40  # a throttle rule that never throttles, only switches accounting on


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def _needs_root() -> None:
    if os.geteuid() != 0:
        missing("needs root (loop mounts, cgroups)")
    if not (BLKIO / "cgroup.procs").exists():
        missing("needs the cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio")


class Tier:
    def __init__(self, base: Path, name: str) -> None:
        self.name = name
        self.image = base / f"{name}.img"
        self.mnt = base / name
        self.mnt.mkdir()
        with open(self.image, "wb") as f:
            f.truncate(48 * 1024 * 1024)
        sh("mkfs.ext4", "-q", "-F", str(self.image))
        self.loop = sh("losetup", "--find", "--show", str(self.image))
        try:
            sh("mount", "-o", "noatime", self.loop, str(self.mnt))
        except subprocess.CalledProcessError:
            sh("losetup", "-d", self.loop)
            raise
        st = os.stat(self.mnt)
        self.dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"

    def close(self) -> None:
        subprocess.run(["umount", str(self.mnt)], check=False)
        subprocess.run(["losetup", "-d", self.loop], check=False)


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Tier, Tier]]:
    _needs_root()
    base = tmp_path_factory.mktemp("tiers")
    made: list[Tier] = []
    try:
        hot = Tier(base, "hot")
        made.append(hot)
        warm = Tier(base, "warm")
        made.append(warm)
        data = hot.mnt / "data"
        data.mkdir()
        for i in range(SAMPLES):
            (data / f"{i:04d}.bin").write_bytes(os.urandom(SAMPLE_BYTES))
        os.sync()
        yield hot, warm
    finally:
        for t in reversed(made):
            t.close()


@pytest.fixture(scope="module")
def foreign_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh venv without gpufeed that sees torch (from the test venv's site-packages)."""
    env_dir = tmp_path_factory.mktemp("train-env") / "venv"
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(env_dir)], check=True)
    import importlib.util

    spec = importlib.util.find_spec("torch")  # where torch is, without importing it
    assert spec is not None and spec.origin is not None
    site_packages = Path(spec.origin).parents[1]
    (py,) = env_dir.glob("lib/python3*/site-packages")
    (py / "torch_from_test_env.pth").write_text(f"{site_packages}\n")
    return str(env_dir / "bin" / "python")


class JobCgroup:
    """A v1 blkio cgroup shaped like Slurm's: <test>/slurm/uid_0/job_<id>."""

    def __init__(self, job_id: str, devs: list[str]) -> None:
        self.top = BLKIO / f"gpufeed-test-{uuid.uuid4().hex[:8]}"
        self.dir = self.top / "slurm" / "uid_0" / f"job_{job_id}"
        self.dir.mkdir(parents=True)
        for dev in devs:
            for rule in ("read_bps_device", "write_bps_device"):
                (self.dir / f"blkio.throttle.{rule}").write_text(f"{dev} {TIB_PER_S}\n")

    def remove(self) -> None:
        # Anything still in the job's cgroup is the training run this test started (a
        # DataLoader worker outliving a killed parent): end it, or the rmdir fails.
        with contextlib.suppress(OSError):
            for pid in (self.dir / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for d in (self.dir, self.dir.parent, self.dir.parent.parent, self.top):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # processes still leaving


def evict_page_cache(directory: Path) -> None:
    """Drops the data files' pages from the page cache, so that the run reads the device."""
    for p in directory.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def value(fams: list[Family], name: str, **labels: str) -> float | None:
    want = tuple(sorted(labels.items()))
    for s in iter_samples(fams):  # a job's `name` label aside
        if s.name == name and tuple(kv for kv in s.labels if kv[0] != "name") == want:
            return s.value
    return None


def run_training(
    cmd: list[str], env: dict[str, str], cg: JobCgroup, out: Path
) -> tuple[subprocess.Popen[bytes], dict[str, float]]:
    # Enter the job's cgroup from a shell, then exec: the launcher-through-a-script case.
    wrapped = ["sh", "-c", f'echo $$ > {cg.dir}/cgroup.procs && exec "$@"', "sh", *cmd]
    proc = subprocess.Popen(wrapped, env=env, stdin=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not out.exists():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("training did not finish in 120 s")
        time.sleep(0.05)
    return proc, json.loads(out.read_text())


def wait_for(sdk: SdkCollector, job_id: str, steps: float, checkpoints: float) -> list[Family]:
    deadline = time.monotonic() + 10
    while True:
        fams = sdk.collect()
        got = (
            value(fams, "gpufeed_job_steps_total", job_id=job_id),
            value(fams, "gpufeed_job_checkpoint_seconds_count", job_id=job_id),
        )
        if got == (steps, checkpoints) or time.monotonic() > deadline:
            return fams
        time.sleep(0.05)


def check_phases(fams: list[Family], job_id: str, own: dict[str, float]) -> None:
    steps = own["steps"]
    assert value(fams, "gpufeed_job_steps_total", job_id=job_id) == steps
    for phase in ("data_wait", "compute", "checkpoint"):
        agent = value(fams, "gpufeed_job_phase_seconds_total", job_id=job_id, phase=phase)
        assert agent is not None, phase
        tolerance = 0.0005 * (steps + 2) + 0.02 * own[phase]
        print(f"{phase}: agent {agent:.4f} s, loop {own[phase]:.4f} s, tolerance {tolerance:.4f}")
        assert abs(agent - own[phase]) <= tolerance, (phase, agent, own[phase])
    startup = value(fams, "gpufeed_job_phase_seconds_total", job_id=job_id, phase="startup")
    assert startup is not None and startup > 0
    assert value(fams, "gpufeed_job_checkpoint_seconds_count", job_id=job_id) == own["checkpoints"]
    written = value(fams, "gpufeed_job_checkpoint_written_bytes_total", job_id=job_id)
    assert written == own["checkpoint_bytes"]


def check_job_info(ctx: CollectorContext, sdk: SdkCollector, job_id: str, pid: int) -> None:
    """While the training process lives: NVML would list it on a GPU; which job is it?"""
    ident = GpuIdentity(0, "GPU-test", "none", "0", "0000:00:00.0")
    gpu = GpuSample(ident, processes=(GpuProcess(pid),))
    jobs = JobsCollector(ctx, sdk.job_for_pid)
    ((info,),) = [f.samples for f in jobs.collect_with(TickData(gpu_samples=(gpu,)))]
    assert dict(info.labels) == {
        "job_id": job_id,
        "gpu": "0",
        "uuid": "GPU-test",
        "scheduler": "slurm",
        "name": "tiny-mlp",
    }


def check_job_io(
    ctx: CollectorContext, sdk: SdkCollector, job_id: str, hot: Tier, warm: Tier
) -> None:
    job_io = JobIoCollector(ctx, sdk_job_pids=sdk.pids_by_job)
    fams = job_io.collect_with(TickData(devices_to_tier={hot.dev: "hot", warm.dev: "warm"}))
    print({(s.label("tier"), s.name[-19:]): s.value for s in iter_samples(fams)})
    hot_read = value(fams, "gpufeed_job_storage_read_bytes_total", job_id=job_id, tier="hot")
    warm_read = value(fams, "gpufeed_job_storage_read_bytes_total", job_id=job_id, tier="warm")
    hot_written = value(fams, "gpufeed_job_storage_written_bytes_total", job_id=job_id, tier="hot")
    # every sample was read from the hot tier's device at least once (cache evicted first)
    assert hot_read is not None and hot_read >= SAMPLES * SAMPLE_BYTES
    # and nothing was read from the checkpoint tier, or written to the data tier, beyond
    # filesystem metadata
    assert warm_read is None or warm_read < 256 * 1024
    assert hot_written is None or hot_written < 256 * 1024


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[CollectorContext, SdkCollector]]:
    cfg = AgentConfig(sdk=SdkConfig(socket_path=str(tmp_path / "agent" / "sdk.sock")))
    ctx = CollectorContext(config=cfg)
    sdk = SdkCollector(ctx)
    sdk.start()
    yield ctx, sdk
    sdk.stop()


def _run_case(
    tiers: tuple[Tier, Tier],
    tmp_path: Path,
    agent: tuple[CollectorContext, SdkCollector],
    mode: str,
    launcher: list[str],
    env: dict[str, str],
) -> tuple[str, dict[str, float]]:
    hot, warm = tiers
    ctx, sdk = agent
    job_id = str(900000 + os.getpid() % 10000 + (0 if mode == "sdk" else 50000))
    ckpt = warm.mnt / f"ckpt-{mode}"
    ckpt.mkdir()
    out = tmp_path / "result.json"
    evict_page_cache(hot.mnt / "data")
    cg = JobCgroup(job_id, [hot.dev, warm.dev])
    cmd = [
        *launcher,
        str(SCRIPT),
        "--mode",
        mode,
        "--data",
        str(hot.mnt / "data"),
        "--ckpt",
        str(ckpt),
        "--out",
        str(out),
    ]
    proc = None
    try:
        proc, own = run_training(cmd, {**env, "SLURM_JOB_ID": job_id}, cg, out)
        check_job_info(ctx, sdk, job_id, int(own["pid"]))
        proc.communicate(timeout=30)  # the job closes: the SDK sends what it still holds
        assert proc.returncode == 0
        fams = wait_for(sdk, job_id, own["steps"], own["checkpoints"])
        check_phases(fams, job_id, own)
        check_job_io(ctx, sdk, job_id, hot, warm)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        cg.remove()
        shutil.rmtree(ckpt, ignore_errors=True)
    return job_id, own


def test_training_with_the_sdk(
    tiers: tuple[Tier, Tier], tmp_path: Path, agent: tuple[CollectorContext, SdkCollector]
) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(EXPORTER),
        "GPUFEED_SOCKET": agent[1].server.socket_path,
    }
    job_id, own = _run_case(tiers, tmp_path, agent, "sdk", [sys.executable], env)
    assert own["dropped"] == 0
    fams = agent[1].collect()
    assert value(fams, "gpufeed_job_epoch_seconds_count", job_id=job_id) == 2
    for reason in ("size", "version", "schema", "phase", "name_length", "max_jobs", "rate"):
        assert value(fams, "gpufeed_sdk_messages_dropped_total", reason=reason) == 0


def test_unmodified_training_under_gpufeed_run_in_a_foreign_env(
    tiers: tuple[Tier, Tier],
    tmp_path: Path,
    agent: tuple[CollectorContext, SdkCollector],
    foreign_python: str,
) -> None:
    run_cli = [
        sys.executable,
        "-c",
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        "from gpufeed.run_cli import main; sys.exit(main(sys.argv[1:]))",
        str(EXPORTER),
        "--socket",
        agent[1].server.socket_path,
        "--name",
        "tiny-mlp",
        "--",
        foreign_python,
    ]
    env = {"PATH": os.environ["PATH"]}  # no PYTHONPATH: gpufeed is not importable there
    _, own = _run_case(tiers, tmp_path, agent, "plain", run_cli, env)
    assert own["gpufeed_importable"] is False
    assert own["instrumented"] is True
