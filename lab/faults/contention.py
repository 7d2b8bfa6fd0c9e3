"""`io_contention`: another tenant reads the same tier with O_DIRECT at depth: `threads`
threads (default 16) each reading `block_kib` blocks (default 256) at random offsets of a
file of `file_mib` (default 48) made on the tier before the run. The reader runs in its
own process (outside the job's cgroup: it is someone else's job) and session; stop kills
its process group.

`python -m lab.faults.contention FILE THREADS BLOCK_KIB` is the reader itself."""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import signal
import subprocess
import sys
import threading

from lab.faults import FaultContext, dies_with_runner, tier_of
from lab.scenario import Fault


class DirectReaders:
    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        self.tier = tier_of(fault, ctx)
        self.threads = int(fault.param("threads", 16))
        self.block_kib = int(fault.param("block_kib", 256))
        self.file_mib = int(fault.param("file_mib", 48))
        self.path = self.tier.mnt / f"tenant-{os.getpid()}.bin"
        self.proc: subprocess.Popen[bytes] | None = None

    def prepare(self) -> None:
        chunk = os.urandom(1 << 20)
        with open(self.path, "wb") as f:
            for _ in range(self.file_mib):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())

    def start(self) -> None:
        argv = [sys.executable, "-m", "lab.faults.contention", str(self.path)]
        argv += [str(self.threads), str(self.block_kib)]
        self.proc = subprocess.Popen(dies_with_runner(argv), start_new_session=True)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None


def _reader(path: str, block: int, stop: threading.Event) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    blocks = max(1, os.fstat(fd).st_size // block)
    rnd = random.Random()
    try:
        while not stop.is_set():
            os.preadv(fd, [buf], rnd.randrange(blocks) * block)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    path, threads, block_kib = argv[0], int(argv[1]), int(argv[2])
    stop = threading.Event()
    workers = [
        threading.Thread(target=_reader, args=(path, block_kib << 10, stop), daemon=True)
        for _ in range(threads)
    ]
    for w in workers:
        w.start()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    stop.set()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    sys.exit(main(sys.argv[1:]))
