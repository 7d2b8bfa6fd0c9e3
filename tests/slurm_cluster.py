"""A real Slurm on this host for tests: slurmctld and two slurmd ("gn1", "gn2", 4 GPUs
each) from Debian's slurm-wlm, with a generated slurm.conf in a temp dir.

GPUs: gres/gpu needs device files per GPU (slurmd counts them, nothing opens them for a
batch job that does not ask CUDA), so each node's GPUs are character devices made with
mknod in the temp dir (the /dev/null device numbers). Authentication is auth/none and
cred/none (plugins Debian ships): no munge key or daemon to share between test runs.
Ports: Slurm cannot be told "port 0", so free ports are taken from the kernel, released
and handed over, and the daemons are checked to own them once they listen (tests/procports).
The scheduler is sched/builtin, strictly in priority order without backfill, so a job
behind a blocked one stays pending for as long as the test looks (a real head-of-line
stall, not one that backfill ends after bf_interval); its main loop runs every second
(sched_interval=1) so that pending reasons are set within a second.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

from host_needs import missing
from procports import owns_port, stop

NODES = ("gn1", "gn2")
GPUS_PER_NODE = 4


@dataclass(frozen=True, slots=True)
class SlurmCluster:
    conf: Path
    workdir: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr}")
        return done.stdout

    def sbatch(self, *options: str) -> str:
        """Submits `sleep 600` with `options`; returns the job id."""
        out = self.run(
            "sbatch", "--parsable", "-c1", "-o", "/dev/null", "-D", str(self.workdir),
            *options, "--wrap", "sleep 600",
        )  # fmt: skip
        return out.strip().split(";")[0]

    def wait_state(self, job_id: str, state: str, timeout: float = 20.0) -> None:
        """Waits until the job is in `state` ("RUNNING") or, for "PENDING Reason", pends
        with the reason the scheduler gave."""
        deadline = time.monotonic() + timeout
        got = ""
        while time.monotonic() < deadline:
            got = self.run("squeue", "-h", "-j", job_id, "-o", "%T %r").strip()
            if got == state or got.split()[:1] == [state]:
                return
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} is {got!r}, not {state} after {timeout}s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(d: Path, ctld_port: int, node_ports: dict[str, int]) -> str:
    nodes = "".join(
        f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs=2 "
        f"RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN\n"
        for n, p in node_ports.items()
    )
    return f"""ClusterName=gpufeedtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
{nodes}PartitionName=gpu Nodes={",".join(node_ports)} Default=YES MaxTime=INFINITE State=UP
"""


def _stray_stepds(workdir: Path) -> list[psutil.Process]:
    """slurmstepd processes of this cluster's jobs (their working directory is ours)."""
    out = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == "slurmstepd" and p.cwd().startswith(str(workdir)):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@contextmanager
def slurm_cluster(tmp: Path) -> Iterator[SlurmCluster]:
    need = ("slurmctld", "slurmd", "squeue", "sinfo", "sdiag", "sbatch")
    absent = [b for b in need if shutil.which(b) is None]
    if absent:
        missing(f"Slurm is not installed ({', '.join(absent)}; Debian: slurmctld slurmd)")
    if os.geteuid() != 0:
        missing("a test Slurm runs its daemons as root")
    for sub in ("state", "log", "dev", "jobs", *(f"spool/{n}" for n in NODES)):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    gres = ["AutoDetect=off"]
    for i, n in enumerate(NODES):
        first = i * GPUS_PER_NODE
        for k in range(first, first + GPUS_PER_NODE):
            os.mknod(tmp / "dev" / f"gpu{k}", 0o600 | 0o020000, os.makedev(1, 3))
        gres.append(f"NodeName={n} Name=gpu File={tmp}/dev/gpu[{first}-{first + 3}]")
    (tmp / "gres.conf").write_text("\n".join(gres) + "\n")
    ctld_port = _free_port()
    node_ports = {n: _free_port() for n in NODES}
    conf = tmp / "slurm.conf"
    conf.write_text(_conf(tmp, ctld_port, node_ports))
    cluster = SlurmCluster(conf, tmp / "jobs")
    env = cluster.env
    log = (tmp / "log" / "daemons.out").open("wb")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ctld = subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=log, stderr=log
        )
        procs.append(ctld)
        _wait(lambda: owns_port(ctld.pid, ctld_port), "slurmctld to listen", procs)
        for n in NODES:
            procs.append(
                subprocess.Popen(
                    ["slurmd", "-D", "-N", n, "-f", str(conf)], env=env, stdout=log, stderr=log
                )
            )
        _wait(lambda: _idle_nodes(cluster) == len(NODES), "both nodes to be idle", procs)
        yield cluster
    finally:
        with suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["scancel", "-u", "root"], env=env, timeout=10, check=False)
        for p in reversed(procs):
            stop(p)
        for p in _stray_stepds(cluster.workdir):
            p.kill()
        log.close()


def _idle_nodes(cluster: SlurmCluster) -> int:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], env=cluster.env, capture_output=True, text=True
    ).stdout
    return sum(1 for line in out.splitlines() if line.split()[-1:] == ["idle"])


def _wait(ok: Callable[[], bool], what: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.args!r} exited with {p.returncode} waiting for {what}")
        if ok():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
