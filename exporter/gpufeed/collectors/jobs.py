"""The "jobs" collector: gpufeed_job_info, which job holds which GPU.

For each GPU, the processes NVML lists on it are mapped through /proc/PID/cgroup to their
scheduler job (gpufeed.jobs.identity); the mapping directory (`jobs.mapping_dir`, written by
Slurm's prolog) adds jobs that hold a GPU before any process runs on it. A GPU no job holds
gets no series.

The GPU processes come from the GPU collector's reading of the same tick (it is a
`Consumer` of "gpu": the sampler hands it the tick's `TickData`), so this collector never
talks to NVML itself. `sdk_job_for_pid`, when given, lets a
process that runs no scheduler but uses the SDK appear under its SDK job id and name, so that
job_info joins the SDK's per-job series.

A Kubernetes job (its id is the pod UID) also gets its pod's namespace and name, and the
container's name where every process of the job on that GPU runs in the same container,
from the kubelet's log directories under --path.rootfs (gpufeed.jobs.kubernetes); labels
named as OpenTelemetry's k8s.* attributes, so they cannot collide with the `namespace`,
`pod` and `container` target labels Prometheus puts on the agent's own series. What is not
found is left out, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpufeed.catalogue import K8S_POD as K8S_POD_LABELS
from gpufeed.catalogue import spec
from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.gpu.backend import GpuSample
from gpufeed.jobs.identity import (
    SCHEDULER_KUBERNETES,
    SCHEDULER_PROCESS,
    SCHEDULER_SLURM,
    JobIdentity,
    read_job_identity,
    read_text,
)
from gpufeed.jobs.kubernetes import PodDirectory, PodRef
from gpufeed.jobs.mapping_dir import read_mapping_dir
from gpufeed.model import Families, Family

SdkJobLookup = Callable[[int], "tuple[str, str] | None"]

MAX_NAME_CHARS = 64
JOB_INFO = spec("gpufeed_job_info")
K8S_NAMESPACE, K8S_POD, K8S_CONTAINER = K8S_POD_LABELS


class JobsCollector:
    name = "jobs"
    needs = ("gpu",)

    def __init__(
        self, context: CollectorContext, sdk_job_for_pid: SdkJobLookup | None = None
    ) -> None:
        self._procfs = context.paths.procfs
        self._mapping_dir = context.config.jobs.mapping_dir
        self._sdk_job_for_pid = sdk_job_for_pid
        self._pods = PodDirectory(context.paths.rootfs)
        # pid -> (identity, command name); kept only for pids still on a GPU
        self._cache: dict[int, tuple[JobIdentity, str] | None] = {}

    def collect(self) -> list[Family]:
        """Without the GPU collector's reading: only the mapping directory's jobs."""
        return self.collect_with(TickData())

    def collect_with(self, data: TickData) -> list[Family]:
        samples = data.gpu_samples
        mapping = read_mapping_dir(Path(self._mapping_dir)) if self._mapping_dir else {}
        seen: dict[int, tuple[JobIdentity, str] | None] = {}
        f = Families()
        f.declare_spec(JOB_INFO)
        held: list[tuple[GpuSample, dict[str, tuple[str, str]]]] = []
        # (gpu index, job id) -> the (pod uid, container id) of each of its processes there
        containers: dict[tuple[int, str], set[tuple[str, str]]] = {}
        for sample in samples:
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
                if scheduler == SCHEDULER_KUBERNETES:
                    on_gpu = containers.setdefault((sample.identity.index, job_id), set())
                    on_gpu.add((ident.job_id, ident.container_id))
            for key in (str(sample.identity.index), sample.identity.uuid):
                for job_id in mapping.get(key, ()):
                    jobs.setdefault(job_id, (SCHEDULER_SLURM, ""))
            held.append((sample, jobs))
        wanted = set().union(*containers.values()) if containers else set()
        pods = self._pods.lookup(wanted) if wanted else {}
        for sample, jobs in held:
            for job_id, (scheduler, name) in sorted(jobs.items()):
                refs = containers.get((sample.identity.index, job_id), set())
                f.put(
                    JOB_INFO,
                    {
                        "job_id": job_id,
                        "gpu": str(sample.identity.index),
                        "uuid": sample.identity.uuid,
                        "scheduler": scheduler,
                        "name": name[:MAX_NAME_CHARS],
                        **pod_labels([pods.get(r) for r in refs]),
                    },
                    1.0,
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


def pod_labels(refs: Sequence[PodRef | None]) -> dict[str, str]:
    """The pod's labels for one job on one GPU, from what each of its processes there
    resolved to: none unless all found their pod; the container only if all agree on it."""
    if not refs or any(r is None for r in refs):
        return {}
    known = [r for r in refs if r is not None]
    out = {K8S_NAMESPACE: known[0].namespace, K8S_POD: known[0].name}
    names = {r.container for r in known}
    if len(names) == 1 and None not in names:
        out[K8S_CONTAINER] = str(known[0].container)
    return out
