"""`busy_host`: unrelated work keeps the host's CPUs and disks busy at once, as package
installs and test suites do (issue 23: a quota-starved job was named preprocessing for 30%
of the fault on such a host, 100% on a quiet one). `spinners` busy processes (default 2)
and one disk churner run in a cgroup beside the job's (another tenant: lab.host
JobCgroup.neighbour_argv), the churner writing `write_mib` (default 8) with fsync and
reading `block_kib` (default 256) blocks back with O_DIRECT at random offsets, in turn, on
`tier`: a tier the job does not read, on its own loop device (the host disk under both is
shared, as on a real host); `cpu_shares` (v1 units, default 1024: as much as the job)
weighs the neighbour cgroup. Stop kills their process groups.

`python -m lab.faults.busy FILE WRITE_MIB BLOCK_KIB` is the churner itself."""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import signal
import subprocess
import sys

from lab.faults import FaultContext, dies_with_runner, tier_of
from lab.faults.cpu import HOG
from lab.scenario import Fault


class BusyHost:
    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        self.ctx = ctx
        self.tier = tier_of(fault, ctx)
        self.spinners = int(fault.param("spinners", 2))
        self.write_mib = int(fault.param("write_mib", 8))
        self.block_kib = int(fault.param("block_kib", 256))
        self.shares = int(fault.param("cpu_shares", 1024))  # the neighbour cgroup's weight
        self.path = self.tier.mnt / f"busy-{os.getpid()}.bin"
        self.procs: list[subprocess.Popen[bytes]] = []

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        churn = [sys.executable, "-m", "lab.faults.busy", str(self.path)]
        churn += [str(self.write_mib), str(self.block_kib)]
        work = [[sys.executable, "-c", HOG] for _ in range(self.spinners)] + [churn]
        for argv in work:
            tenant = self.ctx.cgroup.neighbour_argv([*self.ctx.nice, *argv], self.shares)
            self.procs.append(subprocess.Popen(dies_with_runner(tenant), start_new_session=True))

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()
        self.procs.clear()


def churn(path: str, write_mib: int, block_kib: int) -> None:
    """Writes the file with fsync, then reads as many bytes back with O_DIRECT; forever."""
    chunk = os.urandom(1 << 20)
    block = block_kib << 10
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    rnd = random.Random()
    while True:
        with open(path, "wb") as f:
            for _ in range(write_mib):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            blocks = max(1, os.fstat(fd).st_size // block)
            for _ in range((write_mib << 20) // block):
                os.preadv(fd, [buf], rnd.randrange(blocks) * block)
        finally:
            os.close(fd)


if __name__ == "__main__":
    churn(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
