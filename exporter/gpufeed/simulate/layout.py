"""Where each simulated quantity lives in the engine's flat value lists.

The engine keeps every gauge of one time cell in one list of floats and every counter's
running total in another, so that a cell is cheap to compute, to copy into the history, and
to turn into millions of trace samples. This module names the offsets.
"""

from __future__ import annotations

from gpufeed.simulate.scenario import CLOCK_EVENT_REASONS, Scenario

SDK_PHASES = ("compute", "data_wait", "checkpoint", "communication", "startup", "eval", "other")
CPU_MODES = ("user", "system", "iowait", "idle", "irq", "softirq", "steal", "nice")
PRESSURE_SOME = ("cpu", "io", "memory")
PRESSURE_FULL = ("io", "memory")
CHECKPOINT_BUCKETS_SECONDS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
EPOCH_BUCKETS_SECONDS = (60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0)

# per-GPU gauges
(G_UP, G_UTIL, G_SMACT, G_MEMBW, G_MEMUSED, G_POWER, G_TEMP, G_CLOCK,
 G_OCCUPANCY, G_TENSOR, G_DRAM, G_REASONS) = range(12)  # fmt: skip
GPU_GAUGES = G_REASONS + len(CLOCK_EVENT_REASONS)
# per-GPU counters
C_ENERGY, C_PCIE_TX, C_PCIE_RX, C_NVL_TX, C_NVL_RX, C_XID79, C_BUSY = range(7)
GPU_COUNTERS = 7
# per-tier counters (and one gauge: free bytes)
T_READ_B, T_WRITE_B, T_READS, T_WRITES, T_READ_T, T_WRITE_T, T_IO_T, T_IO_W = range(8)
T_REQUESTED_B = 8  # bytes applications read, cached or not (exported for NFS tiers)
TIER_COUNTERS = 9
# The share of every read the simulated page cache (or NFS client cache) serves.
SIMULATED_CACHE_HIT_RATIO = 0.5
# The tier whose I/O the simulated nvidia-fs driver counts and whose targets the simulated
# config states.
SIMULATED_GDS_TIER = "gpu_direct"
# per-port counters
P_RX, P_TX, P_WAIT = range(3)
PORT_COUNTERS = 3
# a job's cgroup CPU counters: usage seconds, quota periods, throttled periods, throttled s;
# its threads' run and run-queue wait seconds (schedstat), its cgroup's CPU pressure (v2)
(
    J_CPU_USAGE,
    J_CPU_PERIODS,
    J_CPU_THROTTLED,
    J_CPU_THROTTLED_S,
    J_CPU_RUNNING,
    J_CPU_WAITING,
    J_CPU_PRESSURE,
) = range(7)
JOB_CPU_COUNTERS = 7
# a job's page-cache counters: bytes its reads returned, bytes storage fetched for them
J_CACHE_REQUESTED, J_CACHE_FETCHED = range(2)
JOB_CACHE_COUNTERS = 2
# a serving job's gauges: its endpoint up, requests waiting and running, KV-cache usage
S_UP, S_WAITING, S_RUNNING, S_KV = range(4)
SERVING_GAUGES = 4
JOB_CPU_PERIODS_PER_SECOND = 10.0  # the kernel's default CFS period, 100 ms
# host counters: cpu modes, then pressure some, then pressure full
H_CPU = 0
H_SOME = len(CPU_MODES)
H_FULL = H_SOME + len(PRESSURE_SOME)
HOST_COUNTERS = H_FULL + len(PRESSURE_FULL)


class Layout:
    """Offsets of every entity's block in the gauge and counter lists of one scenario."""

    def __init__(self, scenario: Scenario) -> None:
        s = scenario
        self.n_gpus = s.node.gpus
        self.n_tiers = len(s.tiers)
        self.n_ports = len(s.ports)
        self.n_jobs = len(s.jobs)
        # gauges: GPUs, then tier free bytes, then host memory available
        self.g_gpu = 0
        self.g_tier_free = self.n_gpus * GPU_GAUGES
        self.g_mem_available = self.g_tier_free + self.n_tiers
        # per job and tier: bytes of its model load in progress (the SDK's, in start-up)
        self.g_job_loading = self.g_mem_available + 1
        # per job: its serving endpoint's gauges (zero for a job that does not serve)
        self.g_job_serving = self.g_job_loading + self.n_jobs * self.n_tiers
        self.n_gauges = self.g_job_serving + self.n_jobs * SERVING_GAUGES
        # counters: GPUs, tiers, ports, host, jobs
        self.c_gpu = 0
        self.c_tier = self.n_gpus * GPU_COUNTERS
        self.c_port = self.c_tier + self.n_tiers * TIER_COUNTERS
        self.c_host = self.c_port + self.n_ports * PORT_COUNTERS
        self.c_job = self.c_host + HOST_COUNTERS
        # per job: sdk phases, steps, checkpoint bytes, per-tier read+write, cgroup CPU
        # (usage, quota periods, throttled periods, throttled seconds, threads' run and
        # wait, CPU pressure), page cache (requested, fetched), per-tier model-load seconds
        # and bytes, two histograms
        self.j_phase = 0
        self.j_steps = len(SDK_PHASES)
        self.j_ckpt_bytes = self.j_steps + 1
        self.j_tier_read = self.j_ckpt_bytes + 1
        self.j_tier_write = self.j_tier_read + self.n_tiers
        self.j_cpu = self.j_tier_write + self.n_tiers
        self.j_cache = self.j_cpu + JOB_CPU_COUNTERS
        self.j_load_seconds = self.j_cache + JOB_CACHE_COUNTERS
        self.j_load_bytes = self.j_load_seconds + self.n_tiers
        self.j_served = self.j_load_bytes + self.n_tiers  # requests a serving job completed
        self.j_ckpt_hist = self.j_served + 1  # buckets..., +Inf, sum, count
        self.j_epoch_hist = self.j_ckpt_hist + len(CHECKPOINT_BUCKETS_SECONDS) + 3
        self.job_counters = self.j_epoch_hist + len(EPOCH_BUCKETS_SECONDS) + 3
        self.n_counters = self.c_job + self.n_jobs * self.job_counters
        # counters that jump by whole events (histograms, XIDs) are never interpolated
        self.event_counter = [False] * self.n_counters
        for g in range(self.n_gpus):
            self.event_counter[self.gc(g, C_XID79)] = True
        for j in range(self.n_jobs):
            for i in range(self.j_ckpt_hist, self.job_counters):
                self.event_counter[self.jc(j, i)] = True

    def gg(self, gpu: int, i: int) -> int:
        return self.g_gpu + gpu * GPU_GAUGES + i

    def gc(self, gpu: int, i: int) -> int:
        return self.c_gpu + gpu * GPU_COUNTERS + i

    def tc(self, tier: int, i: int) -> int:
        return self.c_tier + tier * TIER_COUNTERS + i

    def pc(self, port: int, i: int) -> int:
        return self.c_port + port * PORT_COUNTERS + i

    def hc(self, i: int) -> int:
        return self.c_host + i

    def jg(self, job: int, tier: int) -> int:
        return self.g_job_loading + job * self.n_tiers + tier

    def sg(self, job: int, i: int) -> int:
        return self.g_job_serving + job * SERVING_GAUGES + i

    def jc(self, job: int, i: int) -> int:
        return self.c_job + job * self.job_counters + i
