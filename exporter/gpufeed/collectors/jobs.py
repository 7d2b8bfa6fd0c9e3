"""The "jobs" collector: gpufeed_job_info, which job holds which GPU.

For each GPU, the processes NVML lists on it are mapped through /proc/PID/cgroup to their
scheduler job (gpufeed.jobs.identity); the mapping directory (`jobs.mapping_dir`, written by
Slurm's prolog) adds jobs that hold a GPU before any process runs on it. A GPU no job holds
gets no series.

The GPU processes come from the GPU collector's latest reading through `gpu_samples`, a
callable, so this collector never talks to NVML itself. `sdk_job_for_pid`, when given, lets a
process that runs no scheduler but uses the SDK appear under its SDK job id and name, so that
job_info joins the SDK's per-job series.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpufeed.collectors.base import CollectorContext
from gpufeed.gpu.backend import GpuSample
from gpufeed.jobs.identity import (
    SCHEDULER_PROCESS,
    SCHEDULER_SLURM,
    JobIdentity,
    read_job_identity,
    read_text,
)
from gpufeed.jobs.mapping_dir import read_mapping_dir
from gpufeed.model import Families, Family

GpuSamplesSource = Callable[[], Sequence[GpuSample]]
SdkJobLookup = Callable[[int], "tuple[str, str] | None"]

MAX_NAME_CHARS = 64
HELP = "Which job holds which GPU (1); absent for a GPU no job holds"


class JobsCollector:
    name = "jobs"

    def __init__(
        self,
        context: CollectorContext,
        gpu_samples: GpuSamplesSource,
        sdk_job_for_pid: SdkJobLookup | None = None,
    ) -> None:
        self._procfs = context.paths.procfs
        self._mapping_dir = context.config.jobs.mapping_dir
        self._gpu_samples = gpu_samples
        self._sdk_job_for_pid = sdk_job_for_pid
        # pid -> (identity, command name); kept only for pids still on a GPU
        self._cache: dict[int, tuple[JobIdentity, str] | None] = {}

    def collect(self) -> list[Family]:
        samples = self._gpu_samples()
        mapping = read_mapping_dir(Path(self._mapping_dir)) if self._mapping_dir else {}
        seen: dict[int, tuple[JobIdentity, str] | None] = {}
        f = Families()
        f.declare("gpufeed_job_info", "gauge", HELP)
        for sample in samples:
            gpu = str(sample.identity.index)
            jobs: dict[str, tuple[str, str]] = {}  # job id -> (scheduler, name)
            for proc in sample.processes:
                found = seen.get(proc.pid) if proc.pid in seen else self._lookup(proc.pid)
                seen[proc.pid] = found
                if found is None:
                    continue  # exited since NVML listed it
                ident, comm = found
                job_id, scheduler, name = ident.job_id, ident.scheduler, comm
                sdk = self._sdk_job_for_pid(proc.pid) if self._sdk_job_for_pid else None
                if sdk is not None:
                    name = sdk[1]
                    if scheduler == SCHEDULER_PROCESS:
                        job_id = sdk[0]
                jobs.setdefault(job_id, (scheduler, name))
            for key in (gpu, sample.identity.uuid):
                for job_id in mapping.get(key, ()):
                    jobs.setdefault(job_id, (SCHEDULER_SLURM, ""))
            for job_id, (scheduler, name) in sorted(jobs.items()):
                f.info(
                    "gpufeed_job_info",
                    HELP,
                    {
                        "job_id": job_id,
                        "gpu": gpu,
                        "uuid": sample.identity.uuid,
                        "scheduler": scheduler,
                        "name": name[:MAX_NAME_CHARS],
                    },
                )
        self._cache = seen
        return f.build()

    def close(self) -> None:
        self._cache = {}

    def _lookup(self, pid: int) -> tuple[JobIdentity, str] | None:
        if pid in self._cache:
            return self._cache[pid]
        ident = read_job_identity(self._procfs, pid)
        if ident is None:
            return None
        comm = (read_text(self._procfs / str(pid) / "comm") or "").strip()
        return ident, comm
