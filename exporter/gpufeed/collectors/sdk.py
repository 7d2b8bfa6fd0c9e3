"""The "sdk" collector: per-job series from the training-loop SDK (see gpufeed.jobs).

Owns the SDK socket server: `start()` binds `sdk.socket_path` and starts its receiving
thread, `stop()` / `close()` undo that. `collect()` serves the current per-job sums and
the drop counters; a job with no GPU gets its series all the same.

It is a `Consumer` of "gpu": the processes NVML lists on each GPU in the same tick name the
GPU (`uuid`) of each rank in gpufeed_job_rank_info; without that reading the label is left
out, and everything else is served as before. And of "storage": its map of devices to tiers
names the tier each model load read from (`unattributed` without it).
"""

from __future__ import annotations

from functools import partial

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.jobs.io_accounting import DeviceBytes
from gpufeed.jobs.process_tree import ProcessTree
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import Family
from gpufeed.serving.endpoints import DeclaredServing
from gpufeed.storage.objects import resolve_location


class SdkCollector:
    name = "sdk"
    needs = ("gpu", "storage")

    def __init__(self, context: CollectorContext, socket_path: str | None = None) -> None:
        cfg = context.config.sdk
        self.server = SdkServer(
            socket_path or cfg.socket_path,
            max_jobs=cfg.max_jobs,
            max_messages_per_second=cfg.max_messages_per_second,
            grace_seconds=cfg.job_grace_seconds,
            procfs=context.paths.procfs,
            object_tier=partial(resolve_location, entries=context.config.object_tiers),
        )
        self._tree = ProcessTree(context.paths.procfs)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def collect(self) -> list[Family]:
        return self.server.families()

    def collect_with(self, data: TickData) -> list[Family]:
        gpus_of_pid: dict[int, set[str]] = {}
        for sample in data.gpu_samples:
            for proc in sample.processes:
                gpus_of_pid.setdefault(proc.pid, set()).add(sample.identity.uuid)
        return self.server.families(gpus_of_pid, data.devices_to_tier)

    def close(self) -> None:
        self.server.stop()

    def job_for_pid(self, pid: int) -> tuple[str, str] | None:
        return self.server.job_for_pid(pid)

    def pids_by_job(self) -> dict[str, list[int]]:
        """The processes that speak for each SDK job and their descendants: the job's I/O,
        CPU and page cache include its DataLoader workers' before the workers are reaped."""
        return self._tree.expand(self.server.pids_by_job())

    def final_io_by_job(self) -> dict[str, dict[int, tuple[int, DeviceBytes]]]:
        return self.server.final_io_by_job()

    def object_bytes_by_job(self) -> dict[str, dict[str, DeviceBytes]]:
        return self.server.object_bytes_by_job()

    def serving_by_job(self) -> dict[str, DeclaredServing]:
        return self.server.serving_by_job()
