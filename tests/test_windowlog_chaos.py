"""The windows log under random kill -9, a disk that fills up for real and rotation.

A real process (tests/helpers/windowlog_writer.py: the live correlator on the log) closes
numbered windows on a small tmpfs with a small rotation size; the test kills it with
SIGKILL at random moments (also while it starts), and fills the filesystem to the last
byte and frees it again at random. Then:
- every start succeeds ("up"), whatever the previous kill left;
- every window the writer reported durable is in the log exactly once, in order;
- every line of every file is a whole window (nothing torn, glued or corrupted);
- windows handed to the log but not yet durable may be missing only if the kill came
  while they were not yet written (in flight, or held back by the full disk).

GPUFEED_CHAOS_SECONDS and GPUFEED_CHAOS_WINDOWS bound the run (default 30 s or 1200
windows, whichever comes first: the bounded run of `make test`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpufeed.correlator.outputs.windowlog_read import decode_line, iter_lines, log_files
from windowlog_helpers import fill, small_tmpfs

REPO = Path(__file__).resolve().parent.parent
WRITER = REPO / "tests" / "helpers" / "windowlog_writer.py"
# Windows per run (GPUFEED_CHAOS_WINDOWS); the filesystem and the rotation size scale with
# it so that nothing rotates out of the retention (150 backups) and the disk still fills.
WINDOWS = int(os.environ.get("GPUFEED_CHAOS_WINDOWS", "1200"))
FS_KIB = max(512, WINDOWS * 600 // 1024)
MAX_BYTES = max(4096, FS_KIB * 1024 // 120)


class Writer:
    def __init__(self, log: Path, start: int, seed: int, count: int = 0) -> None:
        cmd = [sys.executable, str(WRITER), "--log", str(log), "--start", str(start)]
        cmd += ["--seed", str(seed), "--count", str(count), "--max-bytes", str(MAX_BYTES)]
        env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        self.up = threading.Event()
        self.closing = -1  # the last window number handed over (maybe written)
        self.durable = -1
        self.done = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, _, n = line.strip().partition(" ")
            if word == "up":
                self.up.set()
            elif word == "closing":
                self.closing = int(n)
            elif word == "durable":
                self.durable = int(n)
            elif word == "done":
                self.done = True

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.thread.join(5)


def _all_lines(log: Path) -> tuple[list[int], int]:
    """Sequence numbers of every window in the log's files, and the bad lines."""
    seqs, bad = [], 0
    for name in log_files(str(log)):
        for item in iter_lines(name):
            if isinstance(item, bytes):
                try:
                    w, _ = decode_line(item)
                except ValueError:
                    bad += 1
                    continue
                seqs.append(int(w.job_id.split("-")[1]))
            else:
                bad += 1
    return seqs, bad


@pytest.mark.slow
@pytest.mark.root
def test_no_durable_window_is_lost_duplicated_or_corrupted(tmp_path: Path) -> None:
    seconds = float(os.environ.get("GPUFEED_CHAOS_SECONDS", "30"))
    rng = random.Random(int(os.environ.get("GPUFEED_CHAOS_SEED", str(time.time_ns()))))
    with small_tmpfs(tmp_path, FS_KIB) as mnt:
        log = mnt / "windows.jsonl"
        filler = mnt / "filler"
        durable: set[int] = set()
        maybe_lost: set[int] = set()  # handed over, not reported durable, then killed
        kills = fills = starts = 0
        seq = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and seq < WINDOWS:
            w = Writer(log, seq, rng.randrange(1 << 30))
            starts += 1
            assert w.up.wait(30), "the writer did not start"
            # fill the disk now and then, sometimes right away, sometimes later
            if rng.random() < 0.4:
                time.sleep(rng.uniform(0, 0.3))
                fill(filler)
                fills += 1
                time.sleep(rng.uniform(0, 0.5))
                if rng.random() < 0.6:
                    filler.unlink()
            time.sleep(rng.uniform(0.05, 0.8))
            w.kill()
            kills += 1
            durable.update(range(seq, w.durable + 1))
            maybe_lost.update(range(max(seq, w.durable + 1), w.closing + 1))
            seq = max(seq, w.closing + 1)
            if filler.exists() and rng.random() < 0.5:
                filler.unlink()
        if filler.exists():
            filler.unlink()
        last = Writer(log, seq, 0, count=5)  # a clean last run: repairs what a kill left
        assert last.proc.wait(60) == 0 and last.thread.join(5) is None and last.done
        durable.update(range(seq, seq + 5))
        seqs, bad = _all_lines(log)
    logged = set(seqs)
    lost = maybe_lost - logged
    print(
        f"\nchaos: {seconds:.0f}s, {starts} starts, {kills} kill -9, {fills} disk-full, "
        f"{len(durable)} durable, {len(seqs)} logged, {len(lost)} not durable and lost "
        f"(killed before written), {bad} bad lines, {len(seqs) - len(logged)} duplicates"
    )
    assert bad == 0
    assert len(seqs) == len(logged), "a window is in the log twice"
    assert seqs == sorted(seqs), "the log is out of order"
    assert durable <= logged, f"durable windows lost: {sorted(durable - logged)[:10]}"
    assert logged <= durable | maybe_lost
    assert starts > 5 and kills > 5
