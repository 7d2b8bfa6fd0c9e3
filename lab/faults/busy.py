"""`busy_host` (a scenario's `background:` entry): unrelated work that keeps the host's CPUs
and its disk busy at once, the way package installs and test suites do. Not a fault of
the job: no `expect` entry is about it, and the job must be judged by its own starvation
whatever this does to the host's CPU and disk counters.

- `spinners` CPU-bound processes at `spinner_nice`, each in a Unix session of its own
  (outside every lab cgroup: another user's work; with autogroup each session is one
  share of the CPUs, as each build or test run is);
- one driver process, in its own session, that does the rest: `procs_per_s` short-lived
  processes forked and exec'd one after another (an interpreter started and ended, as a
  compiler's or a test runner's subprocesses are), and `disk_mib_per_s` of buffered 64 KiB
  writes, each 1 MiB file fsync'd and dropped from the page cache, read back from the disk
  and every few MiB a burst of small fsync'd files (what dpkg does per file). All of it on
  a scratch tier of its own (`scratch_mib`, an ext4 image on a loop device in the run
  directory, like the job's tiers: on the same host disk, so its load reaches the disk
  under the job's tiers too) that the job never reads and the agent is not told about.

Stop kills the spinners' and the driver's process groups (the driver's children are in its
group) and unmounts the scratch tier. Every process dies with the runner thread that
started it (`dies_with_runner`); the driver's short-lived children end by themselves.

`python -m lab.faults.busy DIR PROCS_PER_S DISK_MIB_PER_S` is the driver itself."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from lab.faults import FaultContext, dies_with_runner
from lab.host import LoopTier
from lab.scenario import Fault

SPIN = "while True: pass"
CHUNK = 64 << 10  # one buffered write
FILE_MIB = 1  # fsync'd, dropped from the cache and read back, one file at a time
SMALL_FILES = 16  # per burst: fsync'd 4 KiB files, created and removed (a package's files)
BURST_EVERY_MIB = 4
# the scratch files it cycles through, a share of the tier (ext4's own metadata needs room)
FILL_SHARE = 0.5


class BusyHost:
    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        self.ctx = ctx
        self.spinners = int(fault.param("spinners"))
        self.nice = int(fault.param("spinner_nice"))
        self.procs_per_s = int(fault.param("procs_per_s"))
        self.disk_mib_per_s = int(fault.param("disk_mib_per_s"))
        self.scratch = LoopTier("scratch", ctx.run_dir, int(fault.param("scratch_mib")))
        self.procs: list[subprocess.Popen[bytes]] = []

    def prepare(self) -> None:
        self.scratch.open()

    def start(self) -> None:
        for _ in range(self.spinners):
            argv = ["nice", "-n", str(self.nice), sys.executable, "-c", SPIN]
            self.procs.append(subprocess.Popen(dies_with_runner(argv), start_new_session=True))
        if self.procs_per_s or self.disk_mib_per_s:
            argv = [sys.executable, "-m", "lab.faults.busy", str(self.scratch.mnt)]
            argv += [str(self.procs_per_s), str(self.disk_mib_per_s)]
            self.procs.append(subprocess.Popen(dies_with_runner(argv), start_new_session=True))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()
        self.procs.clear()
        self.scratch.close()


def _churn(per_s: int) -> None:
    """Short-lived processes one after another, `per_s` a second at most: each an
    interpreter that starts and exits (fork, exec, page faults, exit: a test run's or a
    build's subprocesses)."""
    argv = [sys.executable, "-S", "-c", "pass"]
    began, n = time.monotonic(), 0
    while True:
        subprocess.run(argv, check=False)
        n += 1
        _pace(began, n / per_s)


def _disk(directory: Path, mib_per_s: int) -> None:
    """Writes, fsyncs and reads back 1 MiB files at `mib_per_s`, cycling through a set of
    files that fills part of the scratch tier; every few MiB a burst of small fsync'd
    files. Reads come from the disk: each file is dropped from the page cache first."""
    st = os.statvfs(directory)
    files = max(2, int(st.f_blocks * st.f_frsize * FILL_SHARE) >> 20)
    block = os.urandom(CHUNK)
    rnd = random.Random()
    began, n = time.monotonic(), 0
    while True:
        path = directory / f"f{n % files:05d}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range((FILE_MIB << 20) // CHUNK):
                os.write(fd, block)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        n += 1
        _read_back(directory / f"f{rnd.randrange(min(n, files)):05d}")
        if n % BURST_EVERY_MIB == 0:
            _small_files(directory)
        _pace(began, n * FILE_MIB / mib_per_s)


def _read_back(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)


def _small_files(directory: Path) -> None:
    d = directory / "pkg"
    d.mkdir(exist_ok=True)
    for i in range(SMALL_FILES):
        fd = os.open(d / f"s{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, os.urandom(4096))
            os.fsync(fd)
        finally:
            os.close(fd)
    for i in range(SMALL_FILES):
        with contextlib.suppress(FileNotFoundError):
            (d / f"s{i}").unlink()


def _pace(began: float, due_s: float) -> None:
    """Sleeps until `due_s` after `began`; behind schedule (a busy host), goes on at once."""
    wait = began + due_s - time.monotonic()
    if wait > 0:
        time.sleep(wait)


def main(argv: list[str]) -> int:
    directory, procs_per_s, mib_per_s = Path(argv[0]), int(argv[1]), int(argv[2])
    work = []
    if procs_per_s:
        work.append(threading.Thread(target=_churn, args=(procs_per_s,), daemon=True))
    if mib_per_s:
        work.append(threading.Thread(target=_disk, args=(directory, mib_per_s), daemon=True))
    for t in work:
        t.start()
    for t in work:
        t.join()  # until killed: the runner ends it with its process group
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
