"""How the agent puts the job layer together: three collectors and what they need.

    jobs = build_job_collectors(ctx, gpu.last_samples, storage.devices_to_tier)
    jobs.start()                       # binds the SDK socket (OSError if it cannot)
    collectors += jobs.collectors()    # "sdk", "jobs", "job_io"
    ...
    jobs.stop()                        # or the sampler's close() of each collector

- "sdk" serves the SDK's per-job series; it owns the socket server.
- "jobs" needs the GPU collector's latest readings (which processes are on which GPU) and
  asks "sdk" which SDK job a process speaks for.
- "job_io" needs the storage collector's device-to-tier map and asks "sdk" for the
  processes of SDK jobs that run under no scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufeed.collectors.base import Collector, CollectorContext
from gpufeed.collectors.job_io import DevicesToTier, JobIoCollector
from gpufeed.collectors.jobs import GpuSamplesSource, JobsCollector
from gpufeed.collectors.sdk import SdkCollector


@dataclass(frozen=True, slots=True)
class JobCollectors:
    sdk: SdkCollector
    jobs: JobsCollector
    job_io: JobIoCollector

    def collectors(self) -> list[Collector]:
        return [self.sdk, self.jobs, self.job_io]

    def start(self) -> None:
        self.sdk.start()

    def stop(self) -> None:
        self.sdk.stop()


def build_job_collectors(
    context: CollectorContext,
    gpu_samples: GpuSamplesSource,
    devices_to_tier: DevicesToTier,
    socket_path: str | None = None,
) -> JobCollectors:
    """`socket_path` overrides the config's sdk.socket_path (the --sdk.socket flag)."""
    sdk = SdkCollector(context, socket_path)
    return JobCollectors(
        sdk=sdk,
        jobs=JobsCollector(context, gpu_samples, sdk.job_for_pid),
        job_io=JobIoCollector(context, devices_to_tier, sdk.pids_by_job, sdk.final_io_by_job),
    )
