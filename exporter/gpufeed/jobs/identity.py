"""Which scheduler job a process belongs to, read from its cgroup membership.

`/proc/PID/cgroup` names the cgroup of each hierarchy the process is in. The schedulers put
every job in a directory of their own, so the path alone says which job it is:

- Slurm, cgroup v1: `/slurm/uid_1000/job_4242/step_0/task_0` (or `/slurm_NODE/...`),
- Slurm, cgroup v2: `/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0`
  (or `NODE_slurmstepd.scope` when several slurmd run on one host); newer Slurm names the
  directory by the job's SLUID (`job_s...`), which is taken verbatim as the job id,
- Kubernetes, systemd driver: `/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with '_' for '-'>.slice/cri-containerd-<id>.scope`,
- Kubernetes, cgroupfs driver: `/kubepods/burstable/pod<uid>/<container id>`.

A process in none of these is a plain process; `process_job_id` gives it a stable id from its
process group (see there). The parsers here are pure; `read_*` functions take the procfs root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SCHEDULER_SLURM = "slurm"
SCHEDULER_KUBERNETES = "kubernetes"
SCHEDULER_PROCESS = "process"

# The key of the unified (v2) hierarchy in `cgroup_dirs`; v1 hierarchies are keyed by their
# controller list as /proc/PID/cgroup writes it ("blkio", "cpu,cpuacct").
UNIFIED = ""

_SLURM_JOB = re.compile(r"job_([0-9A-Za-z]{1,64})")
_SLURM_V1_ROOT = re.compile(r"slurm(_[A-Za-z0-9._-]+)?")
_SLURM_V2_ROOT = re.compile(r"([A-Za-z0-9._-]+_)?slurmstepd\.scope")
_UID_DIR = re.compile(r"uid_[0-9]+")
_HEX = "[0-9a-fA-F]"
_POD_UID = (
    rf"{_HEX}{{8}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{12}}"
    rf"|{_HEX}{{32}}"  # static pods: the UID is the manifest hash, without dashes
)
# `pod<uid>` (cgroupfs) or `kubepods[-qos]-pod<uid>.slice` (systemd)
_POD_DIR = re.compile(rf"(?:kubepods(?:-[a-z]+)?-)?pod({_POD_UID})(?:\.slice)?")
# A container's directory inside its pod's: the runtime's 64-hex id, bare (cgroupfs driver)
# or in a systemd scope (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`);
# CRI-O's `crio-conmon-<id>.scope` holds its monitor, not the container, and is no match.
_CONTAINER_DIR = re.compile(r"(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?")


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """A job as its scheduler names it, and where its cgroup directories are.

    `cgroup_dirs` pairs a hierarchy key (`UNIFIED` or a v1 controller list) with the path of
    the job-level directory in it (the directory of the whole job, above steps and tasks), so
    that per-job accounting (io.stat, blkio) covers every process of the job.
    """

    scheduler: str
    job_id: str
    cgroup_dirs: tuple[tuple[str, str], ...] = ()
    container_id: str = ""  # Kubernetes: the runtime's id of the process's container, if known

    def cgroup_dir(self, hierarchy: str) -> str | None:
        for key, path in self.cgroup_dirs:
            if key == hierarchy or hierarchy in key.split(","):
                return path
        return None


def parse_cgroup(text: str) -> JobIdentity | None:
    """The Slurm or Kubernetes job of a `/proc/PID/cgroup` text; None for a plain process."""
    found: tuple[str, str] | None = None
    dirs: list[tuple[str, str]] = []
    container = ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        hit = job_in_cgroup_path(path)
        if hit is None:
            continue
        scheduler, job_id, job_dir = hit
        if found is None:
            found = (scheduler, job_id)
        elif found != (scheduler, job_id):
            # Hierarchies disagree (a process moved by hand): trust the first, as the
            # kernel lists the unified hierarchy last and v1 controllers first.
            continue
        dirs.append((UNIFIED if controllers == "" else controllers, job_dir))
        if scheduler == SCHEDULER_KUBERNETES and not container:
            below = [p for p in path.split("/") if p][job_dir.count("/") :]
            m = _CONTAINER_DIR.fullmatch(below[0]) if below else None
            container = m.group(1) if m is not None else ""
    if found is None:
        return None
    return JobIdentity(found[0], found[1], tuple(dirs), container)


def job_in_cgroup_path(path: str) -> tuple[str, str, str] | None:
    """(scheduler, job id, job-level directory) if the cgroup path is inside a job."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        m = _POD_DIR.fullmatch(part)
        if m is not None and any(p.startswith("kubepods") for p in parts[:i]):
            uid = m.group(1).replace("_", "-").lower()
            return SCHEDULER_KUBERNETES, uid, "/" + "/".join(parts[: i + 1])
        m = _SLURM_JOB.fullmatch(part)
        if m is not None and i >= 1 and _is_slurm_parent(parts, i):
            return SCHEDULER_SLURM, m.group(1), "/" + "/".join(parts[: i + 1])
    return None


def _is_slurm_parent(parts: list[str], i: int) -> bool:
    parent = parts[i - 1]
    if _SLURM_V2_ROOT.fullmatch(parent):
        return True
    return bool(_UID_DIR.fullmatch(parent) and i >= 2 and _SLURM_V1_ROOT.fullmatch(parts[i - 2]))


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/PID/stat that identify a process and its family."""

    pid: int
    comm: str
    ppid: int
    pgid: int
    sid: int
    start_ticks: int  # clock ticks after boot at which the process started


def parse_proc_stat(text: str) -> ProcStat | None:
    """/proc/PID/stat; the command name sits in parentheses and may hold spaces and ')'."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < lpar:
        return None
    rest = text[rpar + 1 :].split()
    try:
        # rest[0] is the state (field 3); ppid, pgrp, session are fields 4-6, starttime 22
        return ProcStat(
            pid=int(text[:lpar]),
            comm=text[lpar + 1 : rpar],
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            sid=int(rest[3]),
            start_ticks=int(rest[19]),
        )
    except (IndexError, ValueError):
        return None


def process_job_id(pgid: int, leader_start_ticks: int | None) -> str:
    """The job id of a process that no scheduler runs: its process group.

    A shell puts each command line in a process group of its own, and launchers (torchrun,
    mpirun from one shell, DataLoader workers) keep their children in it, so the group is
    what a user calls a job. Group ids are recycled, so the start time of the group leader
    makes the id unique across a boot; the id is short and there is one per running group.
    """
    if leader_start_ticks is None:
        return f"pg{pgid}"
    return f"pg{pgid}-{leader_start_ticks}"


def run_job_id(stat: ProcStat | None, pid: int) -> str:
    """The job id of one `gpufeed run`, unique per run, from the run's own process.

    Where `gpufeed run` leads its process group (a shell started it as a command line), the
    id is that group's `process_job_id`, so the GPU processes of the run that never talk to
    the SDK get the same id in gpufeed_job_info. Where it does not (several runs started in
    the background of one script share the script's group), the id is the run's own pid and
    start time: `run<pid>-<start>`, unique across a boot all the same.
    """
    if stat is None:
        return f"run{pid}"
    if stat.pgid == stat.pid:
        return process_job_id(stat.pgid, stat.start_ticks)
    return f"run{stat.pid}-{stat.start_ticks}"


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def read_proc_stat(procfs: Path, pid: int) -> ProcStat | None:
    text = read_text(procfs / str(pid) / "stat")
    return None if text is None else parse_proc_stat(text)


def read_job_identity(procfs: Path, pid: int) -> JobIdentity | None:
    """The identity of the job that process `pid` belongs to; None if the process is gone.

    Plain processes get scheduler "process" and their process group's id.
    """
    text = read_text(procfs / str(pid) / "cgroup")
    if text is None:
        return None
    ident = parse_cgroup(text)
    if ident is not None:
        return ident
    stat = read_proc_stat(procfs, pid)
    if stat is None:
        return None
    leader = read_proc_stat(procfs, stat.pgid) if stat.pgid > 0 else None
    return JobIdentity(
        SCHEDULER_PROCESS,
        process_job_id(stat.pgid, leader.start_ticks if leader is not None else None),
    )
