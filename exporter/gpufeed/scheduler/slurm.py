"""Slurm: pending GPU jobs (`squeue --json`), the GPUs of each node (`sinfo --json`) and the
scheduler's cycle times (`sdiag`), parsed into the scheduler-neutral reading.

The JSON shapes differ between Slurm releases: 21.08-23.02 (openapi v0.0.3x) give plain
numbers and a state string; 23.11 and later give `{"set": true, "number": N}` and a list of
states. Both are read. GPU requests are TRES strings: `gres:gpu:2`, `gres:gpu:a100:2`
(22.05) or `gres/gpu:2`, `gres/gpu=2` (newer releases).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufeed.scheduler.backlog import CycleTime, NodeGpus, PendingJob, SchedulerReading

_TRES_GPU = re.compile(r"^(?:gres[:/])?gpu(?::[^:=,()]+)?[:=](\d+)")
_GRES_GPU = re.compile(r"^gpu(?::[^:=,()]+)?:(\d+)")
# Node states or flags under which a node's free GPUs cannot take a job.
UNSCHEDULABLE = frozenset(
    {
        "DOWN",
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "FUTURE",
        "MAINTENANCE",
        "RESERVED",
        "NOT_RESPONDING",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "INVALID",
        "UNKNOWN",
    }
)


class SlurmError(RuntimeError):
    """A Slurm command failed or answered something that is not its documented output."""


def _num(x: Any) -> float | None:
    """A number from either JSON generation: 5, or {"set": true, "number": 5}."""
    if isinstance(x, dict):
        if not x.get("set", True) or x.get("infinite"):
            return None
        x = x.get("number")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _states(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x.upper()]
    if isinstance(x, list):
        return [str(s).upper() for s in x]
    return []


def gpus_in_tres(text: str) -> int:
    """The GPU count in a TRES string ("cpu=1,gres:gpu:3" or "gres/gpu=2"); 0 when none."""
    n = 0
    for part in text.split(","):
        m = _TRES_GPU.match(part.strip())
        if m:
            n += int(m.group(1))
    return n


def gpus_in_gres(text: str) -> int:
    """The GPU count in a node's GRES string ("gpu:4", "gpu:a100:3(IDX:0-2)"); 0 when none."""
    n = 0
    # "gpu:a100:2(S:0),gpu:h100:2(S:1)": split on commas outside parentheses
    for part in re.split(r",(?![^(]*\))", text):
        m = _GRES_GPU.match(part.strip())
        if m:
            n += int(m.group(1))
    return n


def parse_squeue_json(text: str, now_seconds: float) -> tuple[PendingJob, ...]:
    """Pending jobs that ask for GPUs, from `squeue --json`. Raises SlurmError on output
    that is not squeue's JSON."""
    doc = _load(text, "squeue --json")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmError("squeue --json: no 'jobs' list in the answer")
    out: list[PendingJob] = []
    for j in jobs:
        if not isinstance(j, dict) or "PENDING" not in _states(j.get("job_state")):
            continue
        nodes = int(_num(j.get("node_count")) or 1)
        per_node = gpus_in_tres(str(j.get("tres_per_node") or ""))
        per_job = gpus_in_tres(str(j.get("tres_per_job") or ""))
        per_task = gpus_in_tres(str(j.get("tres_per_task") or ""))
        tasks = int(_num(j.get("tasks")) or 1)
        total = per_node * nodes or per_job or per_task * tasks
        if total <= 0:
            continue
        eligible = _num(j.get("eligible_time")) or 0.0
        since = eligible if eligible > 0 else (_num(j.get("submit_time")) or now_seconds)
        out.append(
            PendingJob(
                job_id=str(j.get("job_id", "")),
                queue=str(j.get("partition") or ""),
                reason=str(j.get("state_reason") or ""),
                wait_seconds=max(now_seconds - since, 0.0),
                nodes=nodes,
                gpus_per_node=per_node,
                gpus_total=total,
            )
        )
    return tuple(out)


# The format-string fallback for a Slurm without JSON output (before 21.08, or built
# without the openapi plugins): `|`-terminated fields, in this order.
SQUEUE_FORMAT = (
    "JobID:|,Partition:|,Reason:|,EligibleTime:|,SubmitTime:|,NumNodes:|,"
    "tres-per-node:|,tres-per-job:|,tres-per-task:|,NumTasks:|"
)
SINFO_FORMAT = "NodeList:|,Gres:|,GresUsed:|,StateLong:|"


def _slurm_time(text: str) -> float | None:
    """Slurm's text timestamps are the controller's local time ("2026-12-01T01:15:57")."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None  # "N/A", "Unknown"


def parse_squeue_text(text: str, now_seconds: float) -> tuple[PendingJob, ...]:
    """Pending jobs that ask for GPUs, from `squeue -h -t PD -O SQUEUE_FORMAT`."""
    out: list[PendingJob] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 10:
            raise SlurmError(f"squeue -O: line {n} has {len(f)} fields, not 10: {line!r}")
        job_id, queue, reason, eligible, submit, nodes_, per_node, per_job, per_task, tasks = f[:10]
        nodes = int(nodes_) if nodes_.isdigit() else 1
        pn, pj, pt = gpus_in_tres(per_node), gpus_in_tres(per_job), gpus_in_tres(per_task)
        total = pn * nodes or pj or pt * (int(tasks) if tasks.isdigit() else 1)
        if total <= 0:
            continue
        since = _slurm_time(eligible) or _slurm_time(submit) or now_seconds
        out.append(
            PendingJob(job_id, queue, reason, max(now_seconds - since, 0.0), nodes, pn, total)
        )
    return tuple(out)


def parse_sinfo_text(text: str) -> tuple[NodeGpus, ...]:
    """Every node with GPUs, from `sinfo -h -N -O SINFO_FORMAT`."""
    seen: dict[str, NodeGpus] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 4:
            raise SlurmError(f"sinfo -O: line {n} has {len(f)} fields, not 4: {line!r}")
        name, gres, used, state = f[:4]
        total = gpus_in_gres(gres)
        if total > 0:
            # "mixed", "idle+drain", "down*": the words, without Slurm's markers
            states = {s.upper() for s in re.split(r"[+*~#!%$@^-]+", state) if s}
            unusable = bool(states & UNSCHEDULABLE) or state.endswith("*")
            seen[name] = NodeGpus(name, total, gpus_in_gres(used), not unusable)
    return tuple(seen[k] for k in sorted(seen))


def parse_sinfo_json(text: str) -> tuple[NodeGpus, ...]:
    """Every node with GPUs, from `sinfo --json` (a node listed once per partition is kept
    once). Raises SlurmError on output that is not sinfo's JSON."""
    doc = _load(text, "sinfo --json")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        raise SlurmError("sinfo --json: no 'nodes' list in the answer")
    seen: dict[str, NodeGpus] = {}
    for n in nodes:
        if not isinstance(n, dict):
            continue
        total = gpus_in_gres(str(n.get("gres") or ""))
        if total <= 0:
            continue
        name = str(n.get("name") or n.get("hostname") or "")
        states = {*_states(n.get("state")), *_states(n.get("state_flags"))}
        seen[name] = NodeGpus(
            name=name,
            total=total,
            allocated=gpus_in_gres(str(n.get("gres_used") or "")),
            schedulable=not (states & UNSCHEDULABLE),
        )
    return tuple(seen[k] for k in sorted(seen))


@dataclass(frozen=True, slots=True)
class _Section:
    cycle: str
    heading: str


_SECTIONS = (
    _Section("main", "Main schedule statistics"),
    _Section("backfill", "Backfilling stats"),
)


def parse_sdiag(text: str) -> tuple[CycleTime, ...]:
    """The main and backfill scheduler's last and mean cycle times from `sdiag` (reported
    in microseconds); a backfill scheduler that has not run a cycle yet is left out."""
    values: dict[str, dict[str, str]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        for s in _SECTIONS:
            if line.startswith(s.heading):
                current = s.cycle
                values[current] = {}
        if current and ":" in line:
            key, _, value = line.partition(":")
            values[current].setdefault(key.strip().lower(), value.strip())
    out: list[CycleTime] = []
    for s in _SECTIONS:
        v = values.get(s.cycle)
        if not v:
            continue
        if s.cycle == "backfill" and v.get("total cycles", "0") == "0":
            continue
        last = _micros(v.get("last cycle"))
        if last is None:
            continue
        out.append(CycleTime(s.cycle, last, _micros(v.get("mean cycle"))))
    if not out and "Main schedule statistics" not in text:
        raise SlurmError("sdiag: no 'Main schedule statistics' section in the answer")
    return tuple(out)


def _no_json(message: str) -> bool:
    """Whether a failed `--json` call means this Slurm has no JSON output (an option it
    does not know, or the openapi/serializer plugins missing), not a controller problem."""
    m = message.lower()
    return "unrecognized option" in m or "data_parser" in m or "serializer" in m


def _micros(text: str | None) -> float | None:
    if text is None or not text.isdigit():
        return None
    return int(text) / 1e6


def _load(text: str, what: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SlurmError(f"{what}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise SlurmError(f"{what}: the answer is not a JSON object")
    errors = doc.get("errors")
    if isinstance(errors, list) and errors:
        first = errors[0]
        if isinstance(first, dict):
            words = [str(first.get(k)) for k in ("description", "error") if first.get(k)]
        else:
            words = [str(first)]
        raise SlurmError(f"{what}: Slurm reported: {': '.join(words) or first}")
    return doc


@dataclass(frozen=True, slots=True)
class SlurmReader:
    """Runs the Slurm commands (a thin reader: everything it gets goes to the parsers).
    `env` carries SLURM_CONF where the cluster's configuration is not the default one."""

    timeout_seconds: float = 10.0
    bin_dir: str = ""
    env: Mapping[str, str] | None = None

    def read(self, now_seconds: float) -> SchedulerReading:
        try:
            pending = parse_squeue_json(self._run(["squeue", "--json"]), now_seconds)
            nodes = parse_sinfo_json(self._run(["sinfo", "--json"]))
        except SlurmError as e:
            if not _no_json(str(e)):
                raise
            fmt = self._run(["squeue", "-h", "-t", "PD", "-O", SQUEUE_FORMAT])
            pending = parse_squeue_text(fmt, now_seconds)
            nodes = parse_sinfo_text(self._run(["sinfo", "-h", "-N", "-O", SINFO_FORMAT]))
        cycles = parse_sdiag(self._run(["sdiag"]))
        return SchedulerReading("slurm", pending, nodes, cycles)

    def _run(self, argv: Sequence[str]) -> str:
        exe = f"{self.bin_dir.rstrip('/')}/{argv[0]}" if self.bin_dir else argv[0]
        try:
            done = subprocess.run(
                [exe, *argv[1:]],
                capture_output=True,
                text=True,
                timeout=self.timeout_seconds,
                env=dict(self.env) if self.env is not None else None,
                check=False,
            )
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]}: not found (is this a Slurm client host?)") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(argv)}: no answer in {self.timeout_seconds:g} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise SlurmError(f"{' '.join(argv)}: exit {done.returncode}: {last}")
        return done.stdout
