"""CPU starvation of the job's input workers.

`cpu_hog`: `hogs` busy processes started INSIDE the job's CPU cgroup (a sidecar, a
co-scheduled task, an over-threaded library): they compete with the DataLoader workers for
the job's share. Hogs in another Unix session do not slow the job at all where the kernel
groups CPU time per session (autogroup, on by default): the lab checked that, so it puts
them where they bite. `cgroup: neighbour` starts them in a cgroup beside the job's instead
(another tenant's job): a host that other work saturates; `cpu_shares` (v1 units, default
1024) below the job's makes that work yield to the job (batch work on idle CPUs). `cpu_quota`: the job's cgroup limited to `cpus` CPUs (a Kubernetes
limit, a Slurm cgroup). Stop kills the hogs / lifts the quota."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from lab.faults import FaultContext, dies_with_runner
from lab.scenario import Fault

HOG = "while True: pass"


class CpuHogs:
    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        self.ctx = ctx
        self.n = int(fault.param("hogs", 4))
        self.where = str(fault.param("cgroup", "job"))
        self.shares = int(fault.param("cpu_shares", 1024))  # a neighbour cgroup's weight
        if self.where not in ("job", "neighbour"):
            raise ValueError(f"cpu_hog cgroup must be job or neighbour, got {self.where!r}")
        self.procs: list[subprocess.Popen[bytes]] = []

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        for _ in range(self.n):
            hog = [*self.ctx.nice, sys.executable, "-c", HOG]
            cg = self.ctx.cgroup
            if self.where == "job":
                argv = cg.enter_argv(hog)
            else:
                argv = cg.neighbour_argv(hog, self.shares)
            self.procs.append(subprocess.Popen(dies_with_runner(argv), start_new_session=True))

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()
        self.procs.clear()


class CpuQuota:
    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        self.ctx = ctx
        self.cpus = float(fault.param("cpus", 0.25))
        self.on = False

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        self.ctx.cgroup.set_cpu_quota(self.cpus)
        self.on = True

    def stop(self) -> None:
        if self.on:
            self.ctx.cgroup.set_cpu_quota(None)
            self.on = False
