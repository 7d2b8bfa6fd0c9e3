"""The GPU-to-job mapping directory, as dcgm-exporter's `--hpc-job-mapping-dir` reads it.

One file per GPU, named by the GPU's index (or, for MIG and GPU-UUID-minded sites, its UUID);
each line names one job holding that GPU. Lines may carry more fields after the job id
(Princeton's jobstats writes "JOBID UID"); only the first is read. Slurm prolog and epilog
scripts in deploy/slurm/ write and clear it. It says which job was *given* a GPU, before or
without any process on it, which NVML's process list cannot tell.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

MAX_FILES = 1024
MAX_FILE_BYTES = 4096
MAX_JOBS_PER_GPU = 16
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_GPU_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,96}")


def parse_mapping_file(text: str) -> tuple[str, ...]:
    """The job ids one mapping file names, in order, without duplicates or junk lines."""
    out: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        job = fields[0]
        if _JOB_ID.fullmatch(job) and job not in out:
            out.append(job)
            if len(out) == MAX_JOBS_PER_GPU:
                break
    return tuple(out)


def read_mapping_dir(directory: Path) -> dict[str, tuple[str, ...]]:
    """GPU key (index or UUID, the file's name) -> job ids. A missing directory is empty."""
    out: dict[str, tuple[str, ...]] = {}
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)[:MAX_FILES]
    except OSError:
        return out
    for entry in entries:
        if entry.name.startswith(".") or not _GPU_KEY.fullmatch(entry.name):
            continue  # temporary files of a prolog in progress, or junk
        try:
            if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                continue
            with open(entry.path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES)
        except OSError:
            continue
        jobs = parse_mapping_file(raw.decode("utf-8", errors="replace"))
        if jobs:
            out[entry.name] = jobs
    return out
