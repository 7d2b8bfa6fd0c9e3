"""The agent's per-job sums of SDK events, and when a job's series go away.

Every process of a job (ranks, DataLoader workers, a relaunched rank) sends deltas, so the
job's series are plain sums over whatever arrives. A job ends when every process that spoke
for it has closed its `Job` or exited; its series stay for the grace period (so that the
last increments get scraped) and then go. Not thread-safe: the SDK server serialises calls.

The `max_jobs` slots are shared fairly between senders (see gpufeed.jobs.senders): a job
belongs to the sender that started it, and when the table is full (and no job has ended)
a sender holding less than its share (max_jobs / senders holding jobs) takes the slot of
the least recently updated job of the sender holding the most, if that one holds more than
its share. One process can thus fill the table while it is alone, but not keep it.

Object storage (issue 16): OBJECT messages (requests a process made to an object store)
are summed per job and tier, and per tier for the node, the location each names mapped to
its tier by `object_tier` (gpufeed.storage.objects.resolve_location over the config's
s3:// entries). The node's sums outlive the jobs (counters never go down) and hold at most
MAX_OBJECT_TIERS tiers; a job at most MAX_OBJECT_TIERS_PER_JOB: further ones are refused
with one log line per job (a bucket nobody configured is its own tier, `s3://BUCKET`).

Per rank (issue 13): a process that sends RANK (its rank, local rank and world size) has
its later steps and phases summed for that rank too, keyed by the sender's pid, so a node's
ranks are not summed into one. The per-job sums stay exactly what they were; the per-rank
phase `collective_wait` overlaps the other phases and goes to the rank only. A job holds at
most MAX_RANKS_PER_JOB ranks on one node: only the ranks running here report here, so more
is a broken or lying sender; its further ranks are refused with one log line per job.

A lost rank (issue 13): a rank whose every process exited without a CLOSE (killed,
crashed: the SDK closes at exit, so only a death it could not run its exit handlers in
gets here) is *lost* from the moment the agent sees its pids gone (`expire`, at the next
scrape) until a new process registers that rank. The SDK in the killed process cannot say
how it ended; `gpufeed run`, its parent, can: it sends EXIT (the child's pid and its exit
status as a shell gives it), which closes the pid at once and names the status.

Model loads (issue 17): a load's time and bytes are summed per device of the file it read,
and a load in progress is kept per process until it ends (or the process does); the
devices become storage tiers when the families are built (`devices_to_tier`, the storage
collector's map of the same tick), a device in no tier is `unattributed`.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Set
from dataclasses import dataclass, field

from gpufeed.catalogue import MetricSpec, spec
from gpufeed.jobs import wire
from gpufeed.jobs.io_accounting import DeviceBytes
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family
from gpufeed.serving.endpoints import DeclaredServing
from gpufeed.vocabulary import UNATTRIBUTED_TIER

log = logging.getLogger(__name__)

CHECKPOINT_BUCKETS_SECONDS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
EPOCH_BUCKETS_SECONDS = (1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)

# A process the agent cannot see (pid 0: another pid namespace) counts as alive this long
# after its last message; one it can see is alive while /proc/PID exists.
UNSEEN_PROCESS_TIMEOUT_SECONDS = 300.0

# Ranks of one job on one node: 8 GPUs make 8, CPU-only jobs a few dozen; the bound keeps a
# sender claiming ever new ranks from growing the exposition without end.
MAX_RANKS_PER_JOB = 256

# Object-storage tiers one job may report into, and the node's sums may hold.
MAX_OBJECT_TIERS_PER_JOB = 16
MAX_OBJECT_TIERS = 64
# A job's own demand report older than this is not read any more (the SDK reports it as
# often as the program calls Job.serving_demand, every second or so).
SERVING_DEMAND_STALE_SECONDS = 30.0


class Histogram:
    """Cumulative-bucket histogram in the shape `Families.histogram` takes."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[float, float]]:
        out: list[tuple[float, float]] = []
        running = 0
        for le, n in zip(self.bounds, self.counts, strict=True):
            running += n
            out.append((le, float(running)))
        return out


@dataclass(slots=True)
class ObjectSums:
    """Requests to one tier for one operation: counts, seconds, bytes, failures by kind."""

    requests: int = 0
    seconds: float = 0.0
    nbytes: int = 0
    errors: int = 0
    throttled: int = 0

    def add(self, msg: wire.Message) -> None:
        self.requests += msg.requests
        self.seconds += msg.seconds
        self.nbytes += msg.object_bytes
        if msg.outcome == "error":
            self.errors += msg.requests
        elif msg.outcome == "throttled":
            self.throttled += msg.requests


ObjectKey = tuple[str, str]  # (tier, operation)


@dataclass(slots=True)
class RankState:
    """One rank of a job on this node: its sums, and the processes that spoke for it."""

    local_rank: int | None
    world_size: int
    phase_seconds: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    pids: set[int] = field(default_factory=set)
    lost: bool = False  # every process of the rank exited without closing its job
    exit_status: int | None = None  # as a shell gives it (128 + N: signal N); None unknown
    # parallelism coordinates the rank reported (PARALLEL): dimension -> its index
    coords: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class JobState:
    job_id: str
    name: str
    phase_seconds: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    checkpoint: Histogram = field(default_factory=lambda: Histogram(CHECKPOINT_BUCKETS_SECONDS))
    checkpoint_bytes: int | None = None
    epoch: Histogram = field(default_factory=lambda: Histogram(EPOCH_BUCKETS_SECONDS))
    # pid -> (closed, monotonic time of its last message)
    processes: dict[int, tuple[bool, float]] = field(default_factory=dict)
    # pid -> (its parent's pid or 0, the /proc/self/io it reported at close)
    final_io: dict[int, tuple[int, DeviceBytes]] = field(default_factory=dict)
    ranks: dict[int, RankState] = field(default_factory=dict)
    objects: dict[ObjectKey, ObjectSums] = field(default_factory=dict)
    pid_ranks: dict[int, int] = field(default_factory=dict)  # pid -> the rank it said it is
    # model loads: device (-1 unknown) -> [seconds, bytes] of the ended ones; pid -> (device,
    # bytes) of the one in progress in that process
    loads: dict[int, list[float]] = field(default_factory=dict)
    loading: dict[int, tuple[int, int]] = field(default_factory=dict)
    # serving (wire kind SERVING): declared, its metrics URL ("" none), the demand it
    # reported itself and when (monotonic)
    serving: bool = False
    serving_url: str = ""
    serving_demand: tuple[float, float | None] | None = None
    serving_demand_at: float = 0.0
    ended_at: float | None = None
    owner: Hashable = None  # the sender that started the job
    updated_at: float = 0.0  # monotonic time of its last message

    def open_pids(self, pids: set[int]) -> list[int]:
        """The pids of `pids` not closed (a pid the job does not know counts as closed)."""
        return [p for p in pids if not self.processes.get(p, (True, 0.0))[0]]


class JobTable:
    """Sums SDK messages into per-job series; bounded to `max_jobs` jobs."""

    def __init__(
        self,
        max_jobs: int,
        grace_seconds: float,
        pid_alive: Callable[[int], bool],
        object_tier: Callable[[str], str] = lambda location: location,
    ) -> None:
        self.max_jobs = max_jobs
        self.grace_seconds = grace_seconds
        self._pid_alive = pid_alive
        self._object_tier = object_tier
        self._jobs: dict[str, JobState] = {}
        self._node_objects: dict[ObjectKey, ObjectSums] = {}
        self._log = LogOnce(log)

    def apply(
        self, msg: wire.Message, pid: int, now: float, ppid: int = 0, owner: Hashable = None
    ) -> str | None:
        """Adds one message from process `pid` (0 = unknown; `ppid` its parent, 0 = unknown,
        used for IO reports) of sender `owner`; returns a drop reason or None."""
        job = self._jobs.get(msg.job_id)
        if msg.kind == wire.KIND_EXIT:
            if job is not None:  # the launcher is no process of the job: not registered
                self._exited(job, msg.exit_pid, msg.exit_status)
            return None
        if job is None:
            if (
                len(self._jobs) >= self.max_jobs
                and not self._evict_one_ended()
                and not self._evict_for(owner)
            ):
                return wire.REASON_MAX_JOBS
            job = self._jobs[msg.job_id] = JobState(msg.job_id, msg.name, owner=owner)
        job.updated_at = now
        if pid > 0 and pid not in job.processes and len(job.processes) >= 4096:
            # a job of thousands of processes on one node: forget the closed ones first
            for p, (closed, _) in list(job.processes.items()):
                if closed:
                    del job.processes[p]
                    job.final_io.pop(p, None)
                    job.pid_ranks.pop(p, None)
        job.processes[pid] = (msg.kind == wire.KIND_CLOSE, now)
        if msg.kind != wire.KIND_CLOSE:
            job.ended_at = None
        if msg.kind == wire.KIND_RANK:
            self._set_rank(job, msg, pid)
            return None
        if msg.kind == wire.KIND_OBJECT:
            self._add_object(job, msg)
            return None
        rank = job.ranks.get(job.pid_ranks[pid]) if pid in job.pid_ranks else None
        if msg.kind == wire.KIND_PARALLEL:
            if rank is not None:  # a coordinate of a rank; without its RANK, of nobody
                rank.coords[msg.phase] = msg.parallel_index
            return None
        if msg.kind == wire.KIND_PHASE and msg.phase == wire.COLLECTIVE_WAIT:
            if rank is not None:  # a per-rank phase only (see the module's docstring)
                _add(rank.phase_seconds, msg.phase, msg.seconds)
            return None
        ph = job.phase_seconds
        if msg.kind == wire.KIND_STEP:
            _add(ph, "data_wait", msg.seconds)
            _add(ph, "compute", msg.compute_seconds)
            job.steps += msg.steps
            if rank is not None:
                _add(rank.phase_seconds, "data_wait", msg.seconds)
                _add(rank.phase_seconds, "compute", msg.compute_seconds)
                rank.steps += msg.steps
        elif msg.kind == wire.KIND_PHASE:
            _add(ph, msg.phase, msg.seconds)
            if rank is not None:
                _add(rank.phase_seconds, msg.phase, msg.seconds)
        elif msg.kind == wire.KIND_CHECKPOINT:
            _add(ph, "checkpoint", msg.seconds)
            if rank is not None:
                _add(rank.phase_seconds, "checkpoint", msg.seconds)
            job.checkpoint.observe(msg.seconds)
            if msg.checkpoint_bytes is not None:
                job.checkpoint_bytes = (job.checkpoint_bytes or 0) + msg.checkpoint_bytes
        elif msg.kind == wire.KIND_EPOCH:
            job.epoch.observe(msg.seconds)
        elif msg.kind == wire.KIND_IO and pid > 0:
            job.final_io[pid] = (ppid, DeviceBytes(msg.read_bytes, msg.written_bytes))
        elif msg.kind == wire.KIND_LOAD:
            _load(job, msg, pid)
        elif msg.kind == wire.KIND_SERVING:
            job.serving = True
            if msg.phase == "declare":
                job.serving_url = msg.location or job.serving_url
            elif msg.requests_waiting is not None:
                job.serving_demand = (msg.requests_waiting, msg.requests_running)
                job.serving_demand_at = now
        return None

    def _add_object(self, job: JobState, msg: wire.Message) -> None:
        tier = self._object_tier(msg.location)
        key = (tier, msg.operation)
        sums = job.objects.get(key)
        if sums is None:
            if len({t for t, _ in job.objects} | {tier}) > MAX_OBJECT_TIERS_PER_JOB:
                self._log.log(
                    logging.WARNING,
                    ("max_object_tiers", job.job_id),
                    "SDK job %r: object-storage requests to %r not counted: the job already "
                    "reports %d tiers, the most one job may",
                    job.job_id,
                    tier,
                    MAX_OBJECT_TIERS_PER_JOB,
                )
                return
            sums = job.objects[key] = ObjectSums()
        sums.add(msg)
        node = self._node_objects.get(key)
        if node is None:
            if len({t for t, _ in self._node_objects} | {tier}) > MAX_OBJECT_TIERS:
                return  # the job's own sums have it; the node's table is full
            node = self._node_objects[key] = ObjectSums()
        node.add(msg)

    def object_bytes_by_job(self) -> dict[str, dict[str, DeviceBytes]]:
        """The bytes each job read and wrote per object-storage tier (job_io exports them
        in the per-job tier families, beside the bytes read from mounts)."""
        out: dict[str, dict[str, DeviceBytes]] = {}
        for job in self._jobs.values():
            per_tier: dict[str, DeviceBytes] = {}
            for (tier, op), sums in job.objects.items():
                if op == "metadata":
                    continue
                got = per_tier.get(tier, DeviceBytes(0, 0))
                r, w = (sums.nbytes, 0) if op == "read" else (0, sums.nbytes)
                per_tier[tier] = DeviceBytes(got.read_bytes + r, got.written_bytes + w)
            if per_tier:
                out[job.job_id] = per_tier
        return out

    def _set_rank(self, job: JobState, msg: wire.Message, pid: int) -> None:
        """Process `pid` is rank `msg.rank` of the job from now on. A sender the agent cannot
        see (pid 0) cannot be told apart from others, so its rank is not kept."""
        if pid <= 0:
            return
        state = job.ranks.get(msg.rank)
        if state is None:
            if len(job.ranks) >= MAX_RANKS_PER_JOB:
                self._log.log(
                    logging.WARNING,
                    ("max_ranks", job.job_id),
                    "SDK job %r: rank %d (pid %d) not tracked: the job already has %d "
                    "ranks on this node, the most one job may have here; its further ranks "
                    "report into the job's series only",
                    job.job_id,
                    msg.rank,
                    pid,
                    MAX_RANKS_PER_JOB,
                )
                return
            state = job.ranks[msg.rank] = RankState(msg.local_rank, msg.world_size)
        state.local_rank, state.world_size = msg.local_rank, msg.world_size
        # a rank restarted many times (elastic) keeps only its live processes
        state.pids = set(job.open_pids(state.pids))
        if pid not in state.pids:
            state.lost, state.exit_status = False, None  # (re)started: not lost any more
        state.pids.add(pid)
        job.pid_ranks[pid] = msg.rank

    def _exited(self, job: JobState, pid: int, status: int | None) -> None:
        """Process `pid` of `job` is gone (`status`: its exit status where its launcher
        said it); a rank process gone without its CLOSE leaves the rank lost unless
        another of its processes lives."""
        entry = job.processes.get(pid)
        if entry is None:
            return
        closed, seen = entry
        job.processes[pid] = (True, seen)
        state = job.ranks.get(job.pid_ranks[pid]) if pid in job.pid_ranks else None
        if state is None:
            return
        if status is not None:
            state.exit_status = status
        live = job.open_pids(state.pids)
        if status == 0:
            # it finished: a rank that left without its CLOSE (os._exit(0) past the exit
            # handlers, a CLOSE datagram a full queue dropped) is not lost, also where a
            # scrape saw its pid gone before its launcher's report came
            state.lost = False
        elif not closed and not live:
            state.lost = True

    def expire(self, now: float) -> None:
        """Marks jobs with no live process as ended, and drops those past their grace.

        A process seen to have exited counts as closed from then on: its pid may be reused
        by an unrelated process, which must neither keep the job alive (its series would
        never go) nor have its I/O summed into the job's (`pids_by_job`)."""
        for job_id, job in list(self._jobs.items()):
            for pid, (closed, _seen) in list(job.processes.items()):
                if pid > 0 and not closed and not self._pid_alive(pid):
                    self._exited(job, pid, None)
            for pid in [p for p in job.loading if job.processes.get(p, (True, 0.0))[0]]:
                del job.loading[pid]  # a load its process never ended: it is over
            if self._has_live_process(job, now):
                job.ended_at = None
                continue
            if job.ended_at is None:
                job.ended_at = now
            if now - job.ended_at >= self.grace_seconds:
                del self._jobs[job_id]
                self._log.clear(("max_ranks", job_id))
                self._log.clear(("max_object_tiers", job_id))

    def job_ids(self) -> list[str]:
        return list(self._jobs)

    def job_for_pid(self, pid: int) -> tuple[str, str] | None:
        """(job id, name) of the live job process `pid` spoke for, if any."""
        for job in self._jobs.values():
            entry = job.processes.get(pid)
            if entry is not None and not entry[0]:
                return job.job_id, job.name
        return None

    def pids_by_job(self) -> dict[str, list[int]]:
        return {
            j.job_id: [p for p, (closed, _) in j.processes.items() if p > 0 and not closed]
            for j in self._jobs.values()
        }

    def serving_by_job(self, now: float) -> dict[str, DeclaredServing]:
        """The jobs that said they serve: their metrics URL, and the demand they reported
        within SERVING_DEMAND_STALE_SECONDS (an older report is unknown, not still true)."""
        out: dict[str, DeclaredServing] = {}
        for j in self._jobs.values():
            if not j.serving or not self._has_live_process(j, now):
                continue  # every process that spoke for it has closed or exited
            fresh = j.serving_demand is not None and (
                now - j.serving_demand_at <= SERVING_DEMAND_STALE_SECONDS
            )
            waiting, running = j.serving_demand if fresh and j.serving_demand else (None, None)
            out[j.job_id] = DeclaredServing(j.job_id, j.serving_url, waiting, running)
        return out

    def final_io_by_job(self) -> dict[str, dict[int, tuple[int, DeviceBytes]]]:
        """The I/O each process reported of itself at close, per job: (ppid, bytes) by pid."""
        return {j.job_id: dict(j.final_io) for j in self._jobs.values() if j.final_io}

    def families(
        self,
        gpus_of_pid: Mapping[int, Set[str]] | None = None,
        now: float | None = None,
        devices_to_tier: Mapping[str, str] | None = None,
    ) -> list[Family]:
        """The per-job and per-rank families; `gpus_of_pid` (pid -> the UUIDs of the GPUs
        NVML lists it on) names the GPU of a rank whose processes are on exactly one GPU;
        `now` (the clock of `apply`) tells which processes still count as alive;
        `devices_to_tier` ("MAJ:MIN" -> tier) names the tier of each model load's file."""
        f = Families()
        phases = spec("gpufeed_job_phase_seconds_total")
        steps = spec("gpufeed_job_steps_total")
        processes = spec("gpufeed_job_processes")
        checkpoints = spec("gpufeed_job_checkpoint_seconds")
        checkpoint_bytes = spec("gpufeed_job_checkpoint_written_bytes_total")
        epochs = spec("gpufeed_job_epoch_seconds")
        f.declare_spec(phases)
        for job in self._jobs.values():
            # `name` is what people call the job; `job_id` (a scheduler's id, or one per
            # `gpufeed run`) is what tells two runs of one program apart.
            labels = {"job_id": job.job_id, "name": job.name}
            for phase, seconds in sorted(job.phase_seconds.items()):
                f.put(phases, {**labels, "phase": phase}, seconds)
            f.put(steps, labels, job.steps)
            if now is not None:
                f.put(processes, labels, self._live_processes(job, now))
            f.put_histogram(
                checkpoints,
                labels,
                job.checkpoint.cumulative(),
                job.checkpoint.total,
                job.checkpoint.count,
            )
            f.put(checkpoint_bytes, labels, job.checkpoint_bytes)
            f.put_histogram(
                epochs,
                labels,
                job.epoch.cumulative(),
                job.epoch.total,
                job.epoch.count,
            )
        self._rank_families(f, gpus_of_pid or {})
        self._object_families(f)
        self._load_families(f, devices_to_tier or {}, now)
        return f.build()

    def _object_families(self, f: Families) -> None:
        """Per tier for the node, and per job: requests, their seconds, bytes, failures."""
        requests = spec("gpufeed_object_storage_requests_total")
        seconds = spec("gpufeed_object_storage_request_seconds_total")
        read = spec("gpufeed_object_storage_read_bytes_total")
        written = spec("gpufeed_object_storage_written_bytes_total")
        errors = spec("gpufeed_object_storage_errors_total")
        job_requests = spec("gpufeed_job_object_storage_requests_total")
        job_seconds = spec("gpufeed_job_object_storage_request_seconds_total")
        job_errors = spec("gpufeed_job_object_storage_errors_total")
        for s in (requests, seconds, read, written, errors, job_requests, job_seconds):
            f.declare_spec(s)
        f.declare_spec(job_errors)
        for (tier, op), sums in sorted(self._node_objects.items()):
            labels = {"tier": tier, "operation": op}
            _put_object_sums(f, (requests, seconds, errors), labels, sums)
            if op in ("read", "write"):
                f.put(read if op == "read" else written, {"tier": tier}, sums.nbytes)
        for job in self._jobs.values():
            for (tier, op), sums in sorted(job.objects.items()):
                labels = {"job_id": job.job_id, "tier": tier, "operation": op}
                _put_object_sums(f, (job_requests, job_seconds, job_errors), labels, sums)

    def _load_families(self, f: Families, tiers: Mapping[str, str], now: float | None) -> None:
        seconds = spec("gpufeed_job_model_load_seconds_total")
        loaded = spec("gpufeed_job_model_load_bytes_total")
        loading = spec("gpufeed_job_model_loading_bytes")
        for s in (seconds, loaded, loading):
            f.declare_spec(s)
        for job in self._jobs.values():
            done: dict[str, list[float]] = {}
            for device, (secs, nbytes) in job.loads.items():
                acc = done.setdefault(_tier_of(device, tiers), [0.0, 0.0])
                acc[0] += secs
                acc[1] += nbytes
            now_loading: dict[str, float] = {}
            for pid, (device, nbytes) in job.loading.items():
                entry = job.processes.get(pid)
                if entry is not None and (now is None or self._alive(pid, entry, now)):
                    tier = _tier_of(device, tiers)
                    now_loading[tier] = now_loading.get(tier, 0.0) + nbytes
            labels = {"job_id": job.job_id, "name": job.name}
            for tier, (secs, nbytes) in sorted(done.items()):
                f.put(seconds, {**labels, "tier": tier}, secs)
                f.put(loaded, {**labels, "tier": tier}, nbytes)
            for tier, nbytes in sorted(now_loading.items()):
                f.put(loading, {**labels, "tier": tier}, nbytes)

    def _rank_families(self, f: Families, gpus_of_pid: Mapping[int, Set[str]]) -> None:
        phases = spec("gpufeed_job_rank_phase_seconds_total")
        steps = spec("gpufeed_job_rank_steps_total")
        info = spec("gpufeed_job_rank_info")
        lost = spec("gpufeed_job_rank_lost")
        status = spec("gpufeed_job_rank_exit_status")
        for s in (phases, steps, info, lost, status):
            f.declare_spec(s)
        for job in self._jobs.values():
            for rank, state in sorted(job.ranks.items()):
                labels = {"job_id": job.job_id, "rank": str(rank)}
                for phase, seconds in sorted(state.phase_seconds.items()):
                    f.put(phases, {**labels, "phase": phase}, seconds)
                f.put(steps, labels, state.steps)
                extra = {"world_size": str(state.world_size)}
                if state.local_rank is not None:
                    extra["local_rank"] = str(state.local_rank)
                extra.update((f"{d}_rank", str(i)) for d, i in sorted(state.coords.items()))
                live = job.open_pids(state.pids)
                gpus = set().union(*(gpus_of_pid.get(p, ()) for p in live))
                if len(gpus) == 1:  # on several GPUs (a stray context): which is not known
                    extra["uuid"] = gpus.pop()
                f.put(info, {**labels, **extra}, 1.0)
                f.put(lost, labels, 1.0 if state.lost else 0.0)
                f.put(status, labels, state.exit_status)

    def _has_live_process(self, job: JobState, now: float) -> bool:
        """Whether a process still speaks for the job (exited ones are closed by expire)."""
        return any(self._alive(pid, entry, now) for pid, entry in job.processes.items())

    def _live_processes(self, job: JobState, now: float) -> int:
        return sum(1 for pid, entry in job.processes.items() if self._alive(pid, entry, now))

    @staticmethod
    def _alive(pid: int, entry: tuple[bool, float], now: float) -> bool:
        closed, last_seen = entry
        return not closed and (pid > 0 or now - last_seen < UNSEEN_PROCESS_TIMEOUT_SECONDS)

    def _evict_for(self, owner: Hashable) -> bool:
        """Frees a slot for `owner` from the sender holding the most, when that is fair."""
        held = Counter(j.owner for j in self._jobs.values())
        if not held:
            return False
        holders = len(held) + (owner not in held)
        share = max(1, self.max_jobs // holders)
        hog, most = held.most_common(1)[0]
        if hog == owner or held[owner] >= share or most <= share:
            return False
        oldest = min((j.updated_at, k) for k, j in self._jobs.items() if j.owner == hog)
        del self._jobs[oldest[1]]
        return True

    def _evict_one_ended(self) -> bool:
        ended = [(j.ended_at, k) for k, j in self._jobs.items() if j.ended_at is not None]
        if not ended:
            return False
        del self._jobs[min(ended)[1]]
        return True


def _put_object_sums(
    f: Families,
    specs: tuple[MetricSpec, MetricSpec, MetricSpec],
    labels: dict[str, str],
    sums: ObjectSums,
) -> None:
    requests, seconds, errors = specs
    f.put(requests, labels, sums.requests)
    f.put(seconds, labels, sums.seconds)
    f.put(errors, {**labels, "reason": "failed"}, sums.errors)
    f.put(errors, {**labels, "reason": "throttled"}, sums.throttled)


def _load(job: JobState, msg: wire.Message, pid: int) -> None:
    """A model load's begin (kept per process until its end) or end (summed per device)."""
    device = -1 if msg.device is None else msg.device
    nbytes = msg.load_bytes or 0
    if msg.phase == "begin":
        if len(job.loading) < 4096 or pid in job.loading:
            job.loading[pid] = (device, nbytes)
        return
    job.loading.pop(pid, None)
    if device not in job.loads and len(job.loads) >= 64:
        device = -1  # a sender naming ever new devices: the rest go to "not known"
    acc = job.loads.setdefault(device, [0.0, 0.0])
    acc[0] += msg.seconds
    acc[1] += nbytes


def _tier_of(device: int, tiers: Mapping[str, str]) -> str:
    if device < 0:
        return UNATTRIBUTED_TIER
    return tiers.get(f"{os.major(device)}:{os.minor(device)}", UNATTRIBUTED_TIER)


def _add(sums: dict[str, float], phase: str, seconds: float) -> None:
    sums[phase] = sums.get(phase, 0.0) + seconds
