"""Training-loop SDK: tells the gpufeed agent how a job spends its time.

    import gpufeed
    job = gpufeed.Job("resnet50")
    for batch in job.track(loader):      # time in next() -> data_wait, loop body -> compute
        ...
    with job.phase("eval"): ...
    with job.checkpoint(path): torch.save(state, path)
    with job.load(path): model = torch.load(path)  # model-load time, bytes, their tier
    job.epoch()
    with job.collective(): dist.all_reduce(t)   # time waiting for peers -> collective_wait
    job.close()

    # an inference server: its GPUs idle for lack of requests are `low_demand`, not a stall
    job = gpufeed.Job("chat", serving=True, metrics_url="http://127.0.0.1:8000/metrics")
    job.serving_demand(waiting=3, running=16)    # or report the queue itself, every second

Events go as datagrams on a Unix socket (the agent's `--sdk.socket`), sent with
MSG_DONTWAIT: when the agent is absent they are dropped and counted in
`Job.events_dropped`; when its queue is full, the sums wait for the next flush; the training
loop never waits for the agent. Steps and phase
times are summed in the process and sent every FLUSH_SECONDS (see `Job`).

This file is deliberately self-contained (standard library only, no gpufeed imports, Python
3.8 syntax, annotations never evaluated): `gpufeed run` loads it by path into programs that
run in another Python environment, where gpufeed is not installed. The agent's decoder (gpufeed.jobs.wire) holds
the same format; a test checks that the two agree.

Wire format v1, little-endian; a datagram holds one or more messages back to back, at most
MAX_DATAGRAM_BYTES in all, each:
    magic "gf" | version u8 | kind u8 | phase u8 | reserved u8 (0) | id_len u8 | name_len u8
    | a f64 | b f64 | n i64 | job id (utf-8, id_len bytes) | name (utf-8, name_len bytes)
    STEP:       a = data_wait seconds, b = compute seconds, n = steps (sums since the last)
    PHASE:      phase = index in PHASES, a = seconds (a sum since the last)
    CHECKPOINT: a = seconds, n = bytes written (-1: unknown)
    EPOCH:      a = seconds
    CLOSE:      the process is done with the job
    IO:         a = read_bytes, b = write_bytes of the process's own /proc/self/io (sent
                at close, just before CLOSE, in a datagram of its own; added in 0.2.0)
    RANK:       n = rank, a = local rank (-1: not known), b = world size: this process is
                that rank of the job (added in 0.3.0)
    OBJECT:     requests to storage the agent cannot see (an object store; added in 0.3.0):
                phase = operation index * 3 + outcome index (OBJECT_OPERATIONS,
                OBJECT_OUTCOMES), a = seconds, b = bytes, n = requests; reserved = the
                length of the location (a tier name, or `s3://BUCKET/FOLDER/ ENDPOINT`)
                that follows the name. Sent in datagrams of their own.
    LOAD:       phase 0 = a model load begins, 1 = it ended; a = seconds (0 at the begin),
                b = the file's device (st_dev; -1: not known), n = bytes (-1: not known):
                the agent maps the device to its storage tier (added in 0.3.0; sent at
                once, in a datagram of its own)
    SERVING:    phase 0 = the job serves requests; reserved = the length of its metrics URL
                (http on loopback; 0: none) after the name; phase 1 = its demand: a =
                requests waiting, b = requests running (-1: not known), whole numbers
                (added in 0.3.0; sent at once, in a datagram of its own)
    EXIT:       n = a pid, a = its exit status as a shell gives it (0-255; 128 + N for
                signal N): sent by a launcher (`gpufeed run`, `report_exit`) once its
                command ended; the sender is no process of the job (added in 0.3.0)
    PARALLEL:   phase = index in PARALLEL_DIMENSIONS (dp, pp, tp, cp, ep), a = this rank's
                index in that dimension, b = the dimension's size (whole numbers, 0 <= a <
                b <= MAX_PARALLEL_SIZE): the rank's parallelism coordinates, one message
                per dimension known, in a datagram of their own right after RANK's (added
                in 0.3.0; an agent that predates it refuses that datagram only)
A PHASE with phase = len(PHASES) is collective_wait (added in 0.3.0). RANK and
collective_wait go in a datagram of their own, sent before the rest of a flush: an agent
that predates them refuses that datagram only (as it refuses IO), and everything else
arrives as before.

Rank: from the launcher's environment (torchrun's RANK/LOCAL_RANK/WORLD_SIZE, Open MPI's
OMPI_COMM_WORLD_*, Slurm's SLURM_PROCID/SLURM_LOCALID/SLURM_STEP_NUM_TASKS), else from
torch.distributed once the program has initialised it, else `Job.set_rank`; a process with
no rank reports to its job only.

Parallelism coordinates (data-parallel rank, pipeline stage, tensor/context/expert-parallel
ranks): `Job.set_parallel` (or `set_parallel_from_mesh` with a torch DeviceMesh, as
torchtitan builds one), else Megatron's `megatron.core.parallel_state` where the program has
imported and initialised it (never imported here), else $GPUFEED_PARALLEL_SIZES
(`gpufeed run --parallel-sizes tp=4,pp=4`: the sizes; each rank's coordinates follow from
its global rank in Megatron's default order, tensor-parallel fastest, then context, then
data-parallel, then the pipeline stage).
"""

from __future__ import annotations

import atexit
import os
import socket as _socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TypeVar

WIRE_VERSION = 1
MAGIC = b"gf"
KIND_STEP = 1
KIND_PHASE = 2
KIND_CHECKPOINT = 3
KIND_EPOCH = 4
KIND_CLOSE = 5
KIND_IO = 6
KIND_RANK = 7
KIND_OBJECT = 8
OBJECT_OPERATIONS = ("read", "write", "metadata")
OBJECT_OUTCOMES = ("ok", "error", "throttled")
MAX_LOCATION_BYTES = 255
# Distinct (location, operation, outcome) sums held between flushes; more flush at once.
_MAX_OBJECT_KEYS = 64
_TIER_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
KIND_LOAD = 9
LOAD_BEGIN = 0
LOAD_END = 1
KIND_SERVING = 10
SERVING_DECLARE = 0
SERVING_DEMAND = 1
_MAX_SERVING_REQUESTS = 1 << 32  # gpufeed.jobs.wire.MAX_SERVING_REQUESTS
KIND_EXIT = 11  # sent by a launcher (`gpufeed run`) for its command: see report_exit
KIND_PARALLEL = 12
# gpufeed.vocabulary.PARALLEL_DIMENSIONS (a test checks they agree): data, pipeline (the
# stage), tensor, context, expert parallel
PARALLEL_DIMENSIONS = ("dp", "pp", "tp", "cp", "ep")
MAX_PARALLEL_SIZE = 1 << 16  # gpufeed.jobs.wire.MAX_PARALLEL_SIZE
PARALLEL_SIZES_ENV = "GPUFEED_PARALLEL_SIZES"
# Megatron's default order of the dimensions in the global rank, fastest first (its
# "tp-cp-ep-dp-pp" without ep, which shares the data-parallel ranks)
_RANK_ORDER = ("tp", "cp", "dp", "pp")
# torch DeviceMesh dimension names (torchtitan's among them) -> the dimension; the
# data-parallel rank of a replicate x shard mesh is replicate * shard size + shard
_MESH_NAMES = {"pp": "pp", "tp": "tp", "cp": "cp", "ep": "ep", "dp": "dp"}
_MESH_DP = ("dp_replicate", "dp_shard")
PHASES = ("compute", "data_wait", "checkpoint", "communication", "startup", "eval", "other")
COLLECTIVE_WAIT = "collective_wait"  # a per-rank phase: PHASE index len(PHASES)
RANK_PHASES = (*PHASES, COLLECTIVE_WAIT)
MAX_WORLD_SIZE = 1 << 24  # gpufeed.jobs.wire.MAX_WORLD_SIZE
HEADER = struct.Struct("<2sBBBBBBddq")
MAX_JOB_ID_BYTES = 128
MAX_NAME_BYTES = 64
MAX_DATAGRAM_BYTES = 8192
# Unicode categories the agent refuses in a job id or name (gpufeed.jobs.wire has the same).
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Same value as gpufeed.config.DEFAULT_SDK_SOCKET (not imported: this file stands alone).
DEFAULT_SOCKET = "/run/gpufeed/sdk.sock"
SOCKET_ENV = "GPUFEED_SOCKET"
# The job id where no scheduler names one, the same on every node of a job: the user's (or
# `gpufeed run --job-id`), else the launcher's (torchrun --rdzv-id; "none" is its default,
# shared by unrelated jobs), else `gpufeed run`'s own, new for every run (one node only).
JOB_ID_ENV = "GPUFEED_JOB_ID"
TORCHELASTIC_RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
RUN_ID_ENV = "GPUFEED_RUN_ID"
_RECONNECT_SECONDS = 1.0
# The agent refuses a duration over 30 days (gpufeed.jobs.wire.MAX_EVENT_SECONDS), and with
# it the whole datagram: a process that ran that long before its first loop (a notebook
# kernel) reports that much start-up, not a datagram the agent drops.
_MAX_EVENT_SECONDS = 30 * 86400.0
_MAX_IO_BYTES = 1 << 50  # gpufeed.jobs.wire.MAX_IO_BYTES
_MAX_DEVICE = 1 << 52  # gpufeed.jobs.wire.MAX_DEVICE: a dev_t carried exactly in f64
FLUSH_SECONDS = 0.1
# RANK is sent again this often (and after every reconnect), so that an agent that lost it
# (restarted, or forgot the job after its grace period) learns it back.
RANK_RESEND_SECONDS = 10.0
COLLECTIVE_SEND_SECONDS = 1.0  # how often collective waits go (see Job._flush)
_SENT, _FULL, _GONE = 0, 1, 2  # what became of a datagram (Job._send_status)
_FINAL_PATIENCE_SECONDS = 0.5  # how long close() tries a full queue again
# (rank, world size, local rank) variables of each launcher, the first one set wins: torchrun
# (also under srun, where SLURM_PROCID is torchrun's own task), Open MPI's mpirun, srun.
RANK_ENVIRONMENTS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)
_PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
_DATA_WAIT = _PHASE_INDEX["data_wait"]
_STARTUP = _PHASE_INDEX["startup"]
_COLLECTIVE_INDEX = len(PHASES)

T = TypeVar("T")

_startup_reported = False


class Job:
    """One job as seen from one process. Several processes of a job (ranks, workers) each
    make their own `Job` with the same name; the agent adds them up.

    Steps and phase times are added up in the process and sent as sums at most every
    FLUSH_SECONDS (checked at each event), at close() and at exit: a socket send wakes the
    agent and can cost more than the whole 10 microsecond budget on a busy host, while
    adding to a float costs well under one. Checkpoints and epochs, each a histogram
    observation, are queued and go out whole with the same flush. `events_sent` /
    `events_dropped` count events (a step, a phase block, a checkpoint ...), not datagrams.

    A Job belongs to the thread that runs the loop (the one that made it); another thread
    that reports phases makes its own Job with the same name (the agent adds them up).
    Collective waits are the exception: `collective()` / `add_collective_wait()` may be
    called from any thread.
    """

    def __init__(
        self,
        name: str,
        socket: str | None = None,
        *,
        serving: bool = False,
        metrics_url: str | None = None,
        job_id: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("gpufeed.Job needs a non-empty name")
        url = (metrics_url or "").encode("ascii", errors="replace")
        if len(url) > MAX_LOCATION_BYTES:
            raise ValueError(f"gpufeed.Job: metrics_url longer than {MAX_LOCATION_BYTES} bytes")
        self.name = name
        self.socket_path = socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        self.job_id = job_id or resolve_job_id(name)
        self.events_sent = 0
        self.events_dropped = 0
        job_bytes = _truncate_utf8(self.job_id, MAX_JOB_ID_BYTES)
        name_bytes = _truncate_utf8(name, MAX_NAME_BYTES)
        self._lens = (len(job_bytes), len(name_bytes))
        self._suffix = job_bytes + name_bytes
        self._sock: _socket.socket | None = None
        self._retry_at = 0.0
        self._closed = False
        # Seconds spent in explicit phases (phase(), checkpoint()) so far: what a loop body
        # or an enclosing phase subtracts, so that phases never count the same second twice.
        self._inner_seconds = 0.0
        self._epoch_started = time.perf_counter()
        # sums not yet sent: data_wait and compute of steps, steps, seconds per phase index
        self._acc_wait = 0.0
        self._acc_compute = 0.0
        self._acc_steps = 0
        self._acc_phase = [0.0] * len(PHASES)
        self._acc_observations: list[tuple[int, float, int]] = []  # checkpoints, epochs
        self._acc_events = 0
        self._flush_at = time.perf_counter() + FLUSH_SECONDS
        self._pid = os.getpid()
        self._owner = threading.get_ident()
        # collective waits may come from any thread: summed under a lock of their own
        self._collective_lock = threading.Lock()
        self._acc_collective = 0.0
        self._acc_collective_events = 0
        # collectives in flight: token -> when their wait was last counted (perf_counter);
        # a reporter thread counts and sends a long one's wait as it accrues (see
        # collective_begin), started with the first collective of the process
        self._in_flight: dict[object, float] = {}
        self._reporter: threading.Thread | None = None
        self._reporter_pid = 0
        self._reporter_stop = threading.Event()
        # (rank, world size, local rank or -1) once known; when RANK was last sent
        self._rank = launcher_rank(os.environ)
        self._rank_sent_at = float("-inf")
        # dimension -> (index, size) once known (set_parallel, Megatron, the environment)
        self._parallel: dict[str, tuple[int, int]] | None = None
        self._parallel_declared = False  # by set_parallel: nothing learnt overrides it
        self._collective_sent_at = float("-inf")
        # object-storage requests may come from any thread (boto3's transfer threads, s3fs's
        # event loop): (location, phase) -> [requests, seconds, bytes], under a lock
        self._object_lock = threading.Lock()
        self._acc_object: dict[tuple[bytes, int], list[float]] = {}
        self._object_flush_at = time.perf_counter() + FLUSH_SECONDS
        # model loads in progress, outermost first: [bytes or -1, device or -1] each
        self._loads: list[list[int]] = []
        # a serving job (an inference server): its metrics URL, declared again with its
        # demand reports and every RANK_RESEND_SECONDS of them, for an agent that restarted
        self._serving_url = url if (serving or metrics_url) else None
        self._serving_sent_at = float("-inf")
        atexit.register(self._at_exit)
        self._register()
        if self._serving_url is not None:
            self.declare_serving()

    # -- the API ---------------------------------------------------------------------------

    def track(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yields the items of `iterable`; time blocked in next() is data_wait, the loop body
        until the following next() is compute, and every item is one step."""
        clock = time.perf_counter
        started = clock()
        it = iter(iterable)  # DataLoader starts its workers here: part of the first wait
        wait = 0.0
        body_start: float | None = None
        inner_at_yield = 0.0
        try:
            while True:
                t0 = clock()
                if body_start is not None:
                    compute = t0 - body_start - (self._inner_seconds - inner_at_yield)
                    self._add_step(wait, compute, t0)
                    body_start = None
                else:
                    t0 = started  # the first item: iter() is part of its wait
                try:
                    item = next(it)
                except StopIteration:
                    now = clock()
                    if not self._report_startup():  # an empty first loop: no first step
                        self._add_phase(_DATA_WAIT, now - t0, now)
                    return
                body_start = clock()
                # the process's first item ends its start-up, whose time includes this wait
                wait = 0.0 if self._report_startup() else body_start - t0
                inner_at_yield = self._inner_seconds
                yield item
        finally:
            if body_start is not None:  # left the loop with break or an exception
                now = clock()
                compute = now - body_start - (self._inner_seconds - inner_at_yield)
                self._add_step(wait, compute, now)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time spent in the block counts as phase `name` (one of PHASES, or
        "collective_wait": then as `collective()`)."""
        if name == COLLECTIVE_WAIT:
            with self.collective():
                yield
            return
        index = _PHASE_INDEX.get(name)
        if index is None:
            raise ValueError(f"unknown phase {name!r}; phases are: {', '.join(PHASES)}")
        inner0 = self._inner_seconds
        t0 = time.perf_counter()
        try:
            yield
        finally:
            now = time.perf_counter()
            own = max(now - t0 - (self._inner_seconds - inner0), 0.0)
            self._inner_seconds += own
            self._add_phase(index, own, now)

    @contextmanager
    def checkpoint(self, path: str | None = None) -> Iterator[None]:
        """The block's duration is a checkpoint; with a path, the bytes it holds afterwards
        (a file's size, or the sum over a directory's files) are checkpoint bytes written."""
        inner0 = self._inner_seconds
        t0 = time.perf_counter()
        try:
            yield
        finally:
            own = max(time.perf_counter() - t0 - (self._inner_seconds - inner0), 0.0)
            self._inner_seconds += own
            size = path_bytes(path) if path is not None else -1
            self._emit(KIND_CHECKPOINT, own, size)

    @contextmanager
    def load(self, path: str | None = None) -> Iterator[None]:
        """The block loads a model's weights (torch.load, safetensors, from_pretrained): its
        duration is model-load time; with `path` (a file, or a directory of shards) the
        agent learns the bytes and, from the file's device, the storage tier they came
        from. The agent hears when the load begins, so a slow one is seen while it runs.
        A load inside another adds its bytes to the outer one and is not counted itself."""
        stack = self._loads
        size, device = _file_bytes_and_device(path)
        if stack:  # inside another load: its bytes are part of the outer one
            outer = stack[-1]
            outer[0] = (max(outer[0], 0) + size) if size >= 0 else outer[0]
            outer[1] = outer[1] if outer[1] >= 0 else device
            yield
            return
        record = [size, device]
        stack.append(record)
        self._send_load(LOAD_BEGIN, 0.0, device, size)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            stack.pop()
            seconds = min(time.perf_counter() - t0, _MAX_EVENT_SECONDS)
            self._send_load(LOAD_END, seconds, record[1], record[0])

    @contextmanager
    def collective(self) -> Iterator[None]:
        """Time spent in the block is this rank's collective_wait: wrap a collective or a
        barrier (the host-side wait: see docs/jobs.md for what that means per backend).
        It overlaps the enclosing phase (it is not subtracted from compute), and is
        reported only once the rank is known (launcher environment, torch.distributed or
        set_rank())."""
        token = self.collective_begin()
        try:
            yield
        finally:
            self.collective_end(token)

    def collective_begin(self) -> object:
        """Marks a collective as entered (any thread); pass the token to collective_end.

        While it is in flight its wait is counted and sent each COLLECTIVE_SEND_SECONDS by
        a reporter thread, not only once it returns: a rank whose peer has stopped (SIGSTOP,
        a hang) blocks in its collective and its loop sends nothing, so without this the
        agent would see every rank of the job fall silent alike; with it, the ranks that
        wait in a collective show a wait that grows while the one that does not arrive shows
        none (issue 13: the job-level join names the rank that waits least)."""
        token = object()
        with self._collective_lock:
            self._in_flight[token] = time.perf_counter()
        self._start_reporter()
        return token

    def collective_end(self, token: object) -> None:
        """The collective returned: what of its wait the reporter has not counted yet."""
        with self._collective_lock:
            since = self._in_flight.pop(token, None)
        if since is not None:
            self.add_collective_wait(time.perf_counter() - since)

    def _start_reporter(self) -> None:
        if self._reporter_pid == os.getpid() or self._closed:
            return  # running (a forked child has no thread of its parent's: it starts one)
        with self._collective_lock:
            if self._reporter_pid == os.getpid():
                return
            self._reporter_pid = os.getpid()
            self._reporter = threading.Thread(
                target=self._report_in_flight, name="gpufeed-collectives", daemon=True
            )
        self._reporter.start()

    def _report_in_flight(self) -> None:
        """Every COLLECTIVE_SEND_SECONDS: the wait of each collective in flight for longer,
        counted up to now and sent at once (the thread that waits cannot flush)."""
        while not self._reporter_stop.wait(COLLECTIVE_SEND_SECONDS):
            now = time.perf_counter()
            collective = 0.0
            with self._collective_lock:
                # only a long collective makes it send: short ones go with the loop's flush,
                # so that a healthy rank sends no datagram more (the agent's queue is short)
                for token, since in self._in_flight.items():
                    if now - since >= COLLECTIVE_SEND_SECONDS:
                        self._acc_collective += now - since
                        self._in_flight[token] = now
                        collective = 1.0
                if collective:
                    collective, self._acc_collective = self._acc_collective, 0.0
            if not collective:
                continue
            # only on the socket the loop's thread opened (two threads must not both open
            # one); what does not go (no socket, the agent's queue full) stays counted for
            # the next try, so that a busy agent costs the wait's timeliness, not the wait
            sent = not self._closed and self._sock is not None
            if not (sent and self._send_rank_datagram(collective, now)):
                with self._collective_lock:
                    self._acc_collective += collective

    def add_collective_wait(self, seconds: float) -> None:
        """Adds `seconds` of collective_wait (any thread may call this)."""
        if not seconds > 0.0:
            return
        with self._collective_lock:
            self._acc_collective += min(seconds, _MAX_EVENT_SECONDS)
            self._acc_collective_events += 1
        if threading.get_ident() == self._owner and time.perf_counter() >= self._flush_at:
            self._flush()

    def add_io(
        self,
        tier: str,
        operation: str = "read",
        nbytes: int = 0,
        seconds: float = 0.0,
        requests: int = 1,
        errors: int = 0,
        throttled: int = 0,
    ) -> None:
        """Reports I/O gpufeed cannot see on a device: reads from an object store, a
        database, a remote cache. `tier` is a tier name from the agent's config, or an
        object's URL `s3://BUCKET/KEY` (the agent maps it to its tier); `operation` is
        "read", "write" or "metadata"; `nbytes` the bytes moved, `seconds` the time the
        requests took, `requests` how many there were, of which `errors` failed and
        `throttled` were refused as too many (HTTP 503 SlowDown, 429). Any thread may call
        this; ValueError for a tier or operation the agent would refuse."""
        if operation not in OBJECT_OPERATIONS:
            raise ValueError(f"operation must be one of {', '.join(OBJECT_OPERATIONS)}")
        location = tier
        if tier.startswith("s3://"):
            bucket, _, key = tier[5:].partition("/")
            location = object_location(bucket, key, "")
            good = len(location) <= MAX_LOCATION_BYTES and location.isascii()
        else:
            good = 0 < len(tier) <= MAX_NAME_BYTES and set(tier) <= _TIER_NAME_CHARS
        if not good:
            raise ValueError(
                f"gpufeed: {tier!r} is neither a tier name (a-z, 0-9, '_') nor an s3:// URL"
            )
        if min(errors, throttled) < 0 or errors + throttled > requests:
            raise ValueError("gpufeed: errors + throttled must be within 0..requests")
        # the time is split between the outcomes by request count; bytes go with the ok ones
        counts = (requests - errors - throttled, errors, throttled)
        for outcome, n in enumerate(counts):
            if n > 0 or (outcome == 0 and not requests and (nbytes or seconds)):
                share = n / requests if requests else 1.0
                moved = int(nbytes) if outcome == 0 else 0
                self.add_object_request(location, operation, outcome, n, seconds * share, moved)

    def add_object_request(
        self,
        location: str,
        operation: str,
        outcome: int,
        requests: int,
        seconds: float,
        nbytes: int,
    ) -> None:
        """Adds `requests` requests to `location` (a tier name, or `object_location`) that
        ended as OBJECT_OUTCOMES[outcome]; what `gpufeed run`'s botocore patch calls for
        each request. Any thread may call this."""
        if operation not in OBJECT_OPERATIONS or not 0 <= outcome < len(OBJECT_OUTCOMES):
            return
        phase = OBJECT_OPERATIONS.index(operation) * len(OBJECT_OUTCOMES) + outcome
        key = (location.encode("ascii", errors="replace")[:MAX_LOCATION_BYTES], phase)
        now = time.perf_counter()
        with self._object_lock:
            acc = self._acc_object.get(key)
            if acc is None:
                acc = self._acc_object[key] = [0.0, 0.0, 0.0]
            acc[0] += requests
            acc[1] += min(max(seconds, 0.0), _MAX_EVENT_SECONDS)
            acc[2] += max(nbytes, 0)
            due = now >= self._object_flush_at or len(self._acc_object) >= _MAX_OBJECT_KEYS
        if due:
            self._flush_objects(now)

    def _flush_objects(self, now: float) -> None:
        """Sends the object-storage sums, in datagrams of their own (an agent that predates
        the kind refuses those only)."""
        with self._object_lock:
            pending, self._acc_object = self._acc_object, {}
            self._object_flush_at = now + FLUSH_SECONDS
        if not pending:
            return
        msgs = []
        for (loc, phase), (n, seconds, nbytes) in pending.items():
            head = HEADER.pack(
                MAGIC,
                WIRE_VERSION,
                KIND_OBJECT,
                phase,
                len(loc),
                *self._lens,
                seconds,
                float(min(nbytes, _MAX_IO_BYTES)),
                int(n),
            )
            msgs.append(head + self._suffix + loc)
        ok = True
        batch: list[bytes] = []
        size = 0
        for m in msgs:
            if batch and size + len(m) > MAX_DATAGRAM_BYTES:
                ok = self._send(b"".join(batch)) and ok
                batch, size = [], 0
            batch.append(m)
            size += len(m)
        ok = self._send(b"".join(batch)) and ok
        if ok:
            self.events_sent += len(msgs)
        else:
            self.events_dropped += len(msgs)

    def declare_serving(self, metrics_url: str | None = None) -> None:
        """Tells the agent (again) that this job serves requests, and where its serving
        stack's Prometheus metrics are (http on this host's loopback; vLLM, Triton, TGI).
        The agent scrapes them; a GPU of the job underused while no request waits is then
        `low_demand`, not a stall. Sent at once, in a datagram of its own."""
        if metrics_url is not None:
            url = metrics_url.encode("ascii", errors="replace")
            if len(url) > MAX_LOCATION_BYTES:
                raise ValueError(f"gpufeed: metrics_url longer than {MAX_LOCATION_BYTES} bytes")
            self._serving_url = url
        elif self._serving_url is None:
            self._serving_url = b""
        url = self._serving_url
        head = HEADER.pack(
            MAGIC, WIRE_VERSION, KIND_SERVING, SERVING_DECLARE, len(url), *self._lens, 0.0, 0.0, 0
        )
        self._serving_sent_at = time.perf_counter()
        if self._send(head + self._suffix + url):
            self.events_sent += 1
        else:
            self.events_dropped += 1

    def serving_demand(self, waiting: int, running: int | None = None) -> None:
        """Reports this serving job's queue: requests waiting to be scheduled and, where
        known, requests running; for servers whose metrics gpufeed cannot read. Call it
        every second or so: the agent forgets a report after 30 s."""
        if self._serving_url is None or time.perf_counter() - self._serving_sent_at >= (
            RANK_RESEND_SECONDS
        ):
            self.declare_serving()
        w = float(min(max(int(waiting), 0), _MAX_SERVING_REQUESTS))
        r = -1.0 if running is None else float(min(max(int(running), 0), _MAX_SERVING_REQUESTS))
        head = HEADER.pack(
            MAGIC, WIRE_VERSION, KIND_SERVING, SERVING_DEMAND, 0, *self._lens, w, r, 0
        )
        if self._send(head + self._suffix):
            self.events_sent += 1
        else:
            self.events_dropped += 1

    def set_rank(self, rank: int, world_size: int, local_rank: int | None = None) -> None:
        """Declares this process's rank where neither the launcher's environment nor
        torch.distributed tells it; ValueError unless 0 <= rank < world_size."""
        got = _valid_rank(rank, world_size, local_rank)
        if got is None:
            raise ValueError(
                f"gpufeed: rank {rank!r} of world size {world_size!r} is not a rank: "
                f"need 0 <= rank < world_size <= {MAX_WORLD_SIZE}"
            )
        if got != self._rank:
            self._rank = got
            self._rank_sent_at = float("-inf")

    def set_parallel(self, **dims: tuple[int, int]) -> None:
        """Declares this rank's parallelism coordinates, each dimension of
        PARALLEL_DIMENSIONS as (index, size): `job.set_parallel(dp=(1, 4), pp=(3, 4),
        tp=(0, 4))`; ValueError for an unknown dimension or unless 0 <= index < size <=
        MAX_PARALLEL_SIZE. They go with the rank (a process with no rank sends neither)."""
        got = _valid_parallel(dims)
        if isinstance(got, str):
            raise ValueError(f"gpufeed: set_parallel: {got}")
        self._parallel_declared = True
        if got != self._parallel:
            self._parallel = got
            self._rank_sent_at = float("-inf")

    def set_parallel_from_mesh(self, mesh: object) -> None:
        """Declares the coordinates from a torch DeviceMesh with named dimensions (pp, dp
        or dp_replicate / dp_shard, cp, tp, ep: torchtitan's names); the others are left
        out. ValueError where the mesh tells none."""
        got = mesh_parallel(mesh)
        if not got:
            raise ValueError("gpufeed: set_parallel_from_mesh: no named dimension it knows")
        self.set_parallel(**got)

    @property
    def parallel(self) -> dict[str, tuple[int, int]]:
        """This rank's parallelism coordinates where known: dimension -> (index, size)."""
        return dict(self._parallel or {})

    @property
    def rank(self) -> int | None:
        """This process's global rank, where known."""
        return None if self._rank is None else self._rank[0]

    def epoch(self) -> None:
        """An epoch boundary: the time since the previous one (or since the Job was made)."""
        now = time.perf_counter()
        self._emit(KIND_EPOCH, now - self._epoch_started, 0)
        self._epoch_started = now

    def close(self) -> None:
        """Sends what is pending and tells the agent this process is done; the job's series
        go after the agent's grace period once every process of the job has closed or
        exited. Called at exit too.

        Before the CLOSE goes this process's own /proc/self/io, read now: the agent samples
        /proc/PID/io only every interval, so the checkpoint a short job writes just before
        it exits would otherwise be lost with the process."""
        if self._closed:
            return
        self._reporter_stop.set()
        self._flush(final=True)
        self._flush_objects(time.perf_counter())
        if os.getpid() == self._pid:  # not a forked child's copy of the parent's Job
            report = self._io_report()
            if report is not None:
                # alone: an older agent refuses the kind, and only it
                self._send_patiently(report, final=True)
        close = HEADER.pack(MAGIC, WIRE_VERSION, KIND_CLOSE, 0, 0, *self._lens, 0.0, 0.0, 0)
        if self._send_patiently(close + self._suffix, final=True) == _SENT:
            self.events_sent += 1
        else:
            self.events_dropped += 1
        self._closed = True
        atexit.unregister(self._at_exit)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _at_exit(self) -> None:
        if os.getpid() == self._pid:  # a forked child exits with its parent's Job unsent
            self.close()

    def _io_report(self) -> bytes | None:
        counters = own_io_bytes()
        if counters is None:
            return None
        read, written = (float(min(c, _MAX_IO_BYTES)) for c in counters)
        head = HEADER.pack(MAGIC, WIRE_VERSION, KIND_IO, 0, 0, *self._lens, read, written, 0)
        return head + self._suffix

    def _register(self) -> None:
        """Tells the agent about the job as soon as the process makes its Job: a start-up
        phase of 0 seconds. A job that loads its model for minutes before its first step is
        then a registered job that has not stepped yet (0% busy, `startup`), not an absent
        one. Not counted as an event: nothing the program did."""
        head = HEADER.pack(MAGIC, WIRE_VERSION, KIND_PHASE, _STARTUP, 0, *self._lens, 0.0, 0.0, 0)
        self._send(head + self._suffix)

    def _send_load(self, stage: int, seconds: float, device: int, size: int) -> None:
        """A load's begin or end, at once and alone: an older agent refuses the kind, and
        only this datagram with it."""
        head = HEADER.pack(
            MAGIC, WIRE_VERSION, KIND_LOAD, stage, 0, *self._lens, seconds, float(device), size
        )
        if self._send(head + self._suffix):
            self.events_sent += 1
        else:
            self.events_dropped += 1

    # -- batching ----------------------------------------------------------------------------

    def _report_startup(self) -> bool:
        """Once per process: the time from process start to its first item (the first batch
        in hand: imports, model load, DataLoader workers started, first batch read) is
        start-up. True if this call reported it: the caller's wait for that item is in it."""
        global _startup_reported
        if _startup_reported:
            return False
        _startup_reported = True
        age = process_age_seconds()
        if age is None:
            return False
        self._add_phase(_STARTUP, min(age, _MAX_EVENT_SECONDS), time.perf_counter())
        return True

    def _add_step(self, wait: float, compute: float, now: float) -> None:
        self._acc_wait += wait
        self._acc_compute += compute if compute > 0.0 else 0.0
        self._acc_steps += 1
        self._acc_events += 1
        if now >= self._flush_at:
            self._flush()

    def _add_phase(self, index: int, seconds: float, now: float) -> None:
        self._acc_phase[index] += seconds
        self._acc_events += 1
        if now >= self._flush_at:
            self._flush()

    def _flush(self, final: bool = False) -> None:
        """Sends the pending sums and observations, packed into as few datagrams as fit.
        A datagram the agent's full queue refused is kept for the next flush (its sums
        added back, its observations queued again), so a burst of ranks delays a step
        rather than losing it; the final flush, or an agent that is gone, drops them, and
        all the flush's events count as dropped.

        Collective waits go at most every COLLECTIVE_SEND_SECONDS (and in the final flush):
        their datagram is one more in the agent's short kernel queue (10 by default, shared
        by every rank of the node), and at 10 flushes a second it would double what the
        ranks send. The rank goes before the rest where the agent may not know it yet, after
        it otherwise, so that steps are what a full queue drops last."""
        now = time.perf_counter()
        self._flush_at = now + FLUSH_SECONDS
        collective, events = 0.0, self._acc_events
        if final or now - self._collective_sent_at >= COLLECTIVE_SEND_SECONDS:
            with self._collective_lock:
                collective, self._acc_collective = self._acc_collective, 0.0
                events += self._acc_collective_events
                self._acc_collective_events = 0
        if not events:
            return
        rank_first = self._rank_sent_at == float("-inf")
        refused: list[int] = []  # the statuses of the datagrams that did not go
        if rank_first:
            refused += self._send_rank_or_keep(collective, now, final)
        pack, head = HEADER.pack, (MAGIC, WIRE_VERSION)
        lens, suffix = self._lens, self._suffix
        # (message, what it carries): what a datagram refused by a full queue gives back
        msgs: list[tuple[bytes, tuple[int, float, float, int]]] = []
        if self._acc_steps or self._acc_wait or self._acc_compute:
            step = (KIND_STEP, self._acc_wait, self._acc_compute, self._acc_steps)
            msgs.append((pack(*head, KIND_STEP, 0, 0, *lens, *step[1:]) + suffix, step))
        for index, seconds in enumerate(self._acc_phase):
            if seconds > 0.0:
                m = pack(*head, KIND_PHASE, index, 0, *lens, seconds, 0.0, 0) + suffix
                msgs.append((m, (KIND_PHASE, float(index), seconds, 0)))
        for kind, a, n in self._acc_observations:
            msgs.append((pack(*head, kind, 0, 0, *lens, a, 0.0, n) + suffix, (kind, a, 0.0, n)))
        self._acc_observations = []
        self._acc_wait = self._acc_compute = 0.0
        self._acc_steps = self._acc_events = 0
        self._acc_phase = [0.0] * len(PHASES)
        per_datagram = max(MAX_DATAGRAM_BYTES // len(msgs[0][0]), 1) if msgs else 1
        for i in range(0, len(msgs), per_datagram):
            group = msgs[i : i + per_datagram]
            got = self._send_patiently(b"".join(m for m, _ in group), final)
            if got == _FULL and not final:
                for _, carried in group:
                    self._keep(carried)
            if got != _SENT:
                refused.append(_GONE if final else got)
        if not rank_first:
            refused += self._send_rank_or_keep(collective, now, final)
        if _GONE in refused:  # something lost for good: the flush's events, as before
            self.events_dropped += events
        elif refused:  # all kept: counted when they go
            self._acc_events += events
        else:
            self.events_sent += events

    def _keep(self, carried: tuple[int, float, float, int]) -> None:
        """Gives a refused message's content back to the sums of the next flush."""
        kind, a, b, n = carried
        if kind == KIND_STEP:
            self._acc_wait += a
            self._acc_compute += b
            self._acc_steps += n
        elif kind == KIND_PHASE:
            self._acc_phase[int(a)] += b
        else:
            self._acc_observations.append((kind, a, n))

    def _send_rank_or_keep(self, collective: float, now: float, final: bool) -> list[int]:
        """The rank datagram (see _send_rank_datagram): [] when it went or had nothing to
        say; a collective wait a full queue refused goes back to the sum for the next flush,
        as the in-flight reporter does ([_FULL]); [_GONE] when it is lost."""
        got = self._send_rank_status(collective, now, final)
        if got == _SENT:
            return []
        if got == _FULL and not final:
            if collective > 0.0:
                with self._collective_lock:
                    self._acc_collective += collective
            return [_FULL]
        return [_GONE]

    def _send_rank_datagram(self, collective: float, now: float) -> bool:
        return self._send_rank_status(collective, now) == _SENT

    def _send_rank_status(self, collective: float, now: float, final: bool = False) -> int:
        """RANK (when due) and collective_wait, in a datagram of their own before the rest
        of the flush, so that the agent knows the rank before the steps arrive. Without a
        known rank the collective wait has nowhere to go and is left out."""
        if self._rank is None:
            self._rank = torch_rank()
            if self._rank is None:
                return _SENT
        due = now - self._rank_sent_at >= RANK_RESEND_SECONDS
        if not due and collective <= 0.0:
            return _SENT
        head, lens = (MAGIC, WIRE_VERSION), self._lens
        rank, world, local = self._rank
        msgs = [HEADER.pack(*head, KIND_RANK, 0, 0, *lens, float(local), float(world), rank)]
        if collective > 0.0:
            msgs.append(
                HEADER.pack(*head, KIND_PHASE, _COLLECTIVE_INDEX, 0, *lens, collective, 0.0, 0)
            )
            self._collective_sent_at = now
        got = self._send_patiently(b"".join(m + self._suffix for m in msgs), final)
        if got == _SENT:
            if due:
                self._send_parallel(final)
            self._rank_sent_at = now
        return got

    def _send_parallel(self, final: bool) -> None:
        """PARALLEL, one message per dimension known, in a datagram of its own after the
        rank's (an older agent refuses this one only). Unless declared, Megatron's state is
        read each time (the program may initialise it after its first steps), and wins over
        the environment's sizes."""
        if not self._parallel_declared and self._rank is not None:
            rank, world, _local = self._rank
            learnt = megatron_parallel() or self._parallel
            self._parallel = learnt or environ_parallel(os.environ, rank, world)
        if not self._parallel:
            return
        head, lens = (MAGIC, WIRE_VERSION), self._lens
        msgs = [
            HEADER.pack(*head, KIND_PARALLEL, PARALLEL_DIMENSIONS.index(dim), 0, *lens,
                        float(i), float(n), 0) + self._suffix
            for dim, (i, n) in sorted(self._parallel.items())
        ]  # fmt: skip
        self._send_patiently(b"".join(msgs), final)

    def _emit(self, kind: int, a: float, n: int) -> None:
        """A checkpoint or an epoch: an observation of its own, sent with the next flush."""
        self._acc_observations.append((kind, a, n))
        self._acc_events += 1
        if time.perf_counter() >= self._flush_at:
            self._flush()

    # -- transport ---------------------------------------------------------------------------

    def _send(self, datagram: bytes) -> bool:
        return self._send_status(datagram) == _SENT

    def _send_patiently(self, datagram: bytes, final: bool) -> int:
        """_send_status; at close (final), a full queue is tried again for up to
        _FINAL_PATIENCE_SECONDS: nothing comes after it, and the loop is over."""
        got = self._send_status(datagram)
        if final:
            give_up = time.monotonic() + _FINAL_PATIENCE_SECONDS
            while got == _FULL and time.monotonic() < give_up:
                time.sleep(0.005)
                got = self._send_status(datagram)
        return got

    def _send_status(self, datagram: bytes) -> int:
        """_SENT, _FULL (the agent's queue is full: never wait) or _GONE (no agent)."""
        if self._closed:
            return _GONE
        sock = self._sock
        if sock is None:
            sock = self._connect()
            if sock is None:
                return _GONE
        try:
            sock.send(datagram, _socket.MSG_DONTWAIT)
            return _SENT
        except BlockingIOError:
            return _FULL
        except OSError:  # the agent went away (restart): reconnect later
            sock.close()
            self._sock = None
            self._retry_at = time.monotonic() + _RECONNECT_SECONDS
            return _GONE

    def _connect(self) -> _socket.socket | None:
        now = time.monotonic()
        if now < self._retry_at:
            return None
        try:  # socket() too: out of file descriptors is the agent being unreachable
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        except OSError:
            self._retry_at = now + _RECONNECT_SECONDS
            return None
        try:
            sock.connect(self.socket_path)
        except (OSError, ValueError):  # ValueError: a NUL byte in the path
            sock.close()
            self._retry_at = now + _RECONNECT_SECONDS
            return None
        self._sock = sock
        self._rank_sent_at = float("-inf")  # maybe a new agent: tell it the rank again
        return sock


def report_exit(name: str, job_id: str, pid: int, status: int, socket: str | None = None) -> bool:
    """Tells the agent that process `pid` of job `job_id` ended with exit `status` (as a
    shell gives it: 128 + N when killed by signal N). For a launcher (`gpufeed run`), the
    parent that saw its command end: a killed process cannot say it was killed, and without
    this the agent only sees its pid gone. Sends one datagram, registers nothing (the
    launcher is not a process of the job); False when it could not be sent."""
    if not 0 <= status <= 255 or pid <= 0:
        raise ValueError(f"gpufeed: exit status {status} of pid {pid} out of range")
    job_bytes = _truncate_utf8(job_id, MAX_JOB_ID_BYTES)
    name_bytes = _truncate_utf8(name, MAX_NAME_BYTES)
    head = HEADER.pack(
        MAGIC,
        WIRE_VERSION,
        KIND_EXIT,
        0,
        0,
        len(job_bytes),
        len(name_bytes),
        float(status),
        0.0,
        pid,
    )
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    try:
        sock.connect(socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)
        sock.send(head + job_bytes + name_bytes, _socket.MSG_DONTWAIT)
    except (OSError, ValueError):
        return False
    finally:
        sock.close()
    return True


def resolve_job_id(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The scheduler's job id when there is one (Slurm, the Kubernetes pod), else
    `launcher_job_id` (GPUFEED_JOB_ID, torchrun's rendezvous id, `gpufeed run`'s per-run
    id), else `name`. All but the last are the same on every node of a multi-node job.

    The agent prefers the id it reads from the sending process's cgroup, so this matters
    mostly where the agent cannot see the process (another pid namespace).
    """
    env = os.environ if environ is None else environ
    slurm = env.get("SLURM_JOB_ID", "").strip()
    if slurm:
        return slurm
    pod = env.get("POD_UID", "").strip()  # set by the downward API, by convention
    if pod:
        return pod
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return launcher_job_id(env) or name
    import re  # only here: most processes never need it

    m = re.search(
        r"kubepods.*?pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_]"
        r"[0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}|[0-9a-fA-F]{32})(?:\.slice)?(?:/|$)",
        text,
        re.MULTILINE,
    )
    if m:
        return m.group(1).replace("_", "-").lower()
    return launcher_job_id(env) or name


def launcher_job_id(environ: Mapping[str, str]) -> str | None:
    """$GPUFEED_JOB_ID, else $TORCHELASTIC_RUN_ID (torchrun --rdzv-id, the same in every
    rank on every node; not its default "none"), else $GPUFEED_RUN_ID (`gpufeed run`'s, one
    per run and node); None where none is set."""
    for var in (JOB_ID_ENV, TORCHELASTIC_RUN_ID_ENV, RUN_ID_ENV):
        value = environ.get(var, "").strip()
        if value and not (var == TORCHELASTIC_RUN_ID_ENV and value == "none"):
            return value
    return None


def launcher_rank(environ: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(rank, world size, local rank or -1) from the first launcher whose variables are set
    (RANK_ENVIRONMENTS), None where none is (or its values are not a rank)."""
    for rank_var, size_var, local_var in RANK_ENVIRONMENTS:
        rank, size = environ.get(rank_var, "").strip(), environ.get(size_var, "").strip()
        if not (rank and size):
            continue
        try:
            local = environ.get(local_var, "").strip()
            return _valid_rank(int(rank), int(size), int(local) if local else None)
        except ValueError:
            return None
    return None


def torch_rank() -> tuple[int, int, int] | None:
    """(rank, world size, local rank or -1) of an initialised torch.distributed default
    group; None where the program has not imported or initialised it. Never imports torch."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        local = os.environ.get("LOCAL_RANK", "").strip()
        return _valid_rank(
            int(dist.get_rank()), int(dist.get_world_size()), int(local) if local else None
        )
    except Exception:  # a half-initialised group, a LOCAL_RANK that is no number
        return None


def _valid_parallel(dims: Mapping[str, object]) -> dict[str, tuple[int, int]] | str:
    """The coordinates (dimension -> (index, size)), or what is wrong with them."""
    out: dict[str, tuple[int, int]] = {}
    for dim, v in dims.items():
        if dim not in PARALLEL_DIMENSIONS:
            return f"unknown dimension {dim!r} (known: {', '.join(PARALLEL_DIMENSIONS)})"
        if not (isinstance(v, tuple) and len(v) == 2 and all(type(x) is int for x in v)):
            return f"{dim}={v!r} is not (index, size)"
        i, n = v
        if not 0 <= i < n <= MAX_PARALLEL_SIZE:
            return f"{dim}={v!r}: need 0 <= index < size <= {MAX_PARALLEL_SIZE}"
        out[dim] = (i, n)
    return out


def parse_parallel_sizes(text: str) -> dict[str, int] | str:
    """The sizes of "tp=4,pp=4" (dimensions of _RANK_ORDER, whole numbers >= 1, each at
    most once), or what is wrong with them."""
    sizes: dict[str, int] = {}
    for part in text.split(","):
        dim, eq, size = (x.strip() for x in part.partition("="))
        if dim not in _RANK_ORDER or not eq:
            return f"{part.strip()!r} is not DIM=SIZE with DIM one of {', '.join(_RANK_ORDER)}"
        if dim in sizes:
            return f"{dim} given twice"
        if not size.isdigit() or not 1 <= int(size) <= MAX_PARALLEL_SIZE:
            return f"{dim}={size!r}: need a whole number from 1 to {MAX_PARALLEL_SIZE}"
        sizes[dim] = int(size)
    return sizes


def environ_parallel(
    environ: Mapping[str, str], rank: int, world: int
) -> dict[str, tuple[int, int]] | None:
    """The coordinates of global rank `rank` of `world` from $GPUFEED_PARALLEL_SIZES
    ("tp=4,pp=4": the sizes; dp is what the world leaves, unless given), in Megatron's
    default order (_RANK_ORDER); None where it is unset, malformed or does not make the
    world."""
    text = environ.get(PARALLEL_SIZES_ENV, "").strip()
    sizes = parse_parallel_sizes(text) if text else "unset"
    if isinstance(sizes, str):
        return None
    rest = 1
    for dim, n in sizes.items():
        rest *= n if dim != "dp" else 1
    if "dp" not in sizes:
        if world % rest:
            return None
        sizes["dp"] = world // rest
    if rest * sizes["dp"] != world:
        return None
    out: dict[str, tuple[int, int]] = {}
    left = rank
    for dim in _RANK_ORDER:
        n = sizes.get(dim, 1)
        if dim in sizes:
            out[dim] = (left % n, n)
        left //= n
    got = _valid_parallel(out)
    return got if isinstance(got, dict) else None


def megatron_parallel() -> dict[str, tuple[int, int]] | None:
    """The coordinates Megatron's parallel state holds, where the program imported and
    initialised it (never imported here); None otherwise."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None:
        return None
    try:
        if not ps.model_parallel_is_initialized():
            return None
    except Exception:
        return None
    out: dict[str, tuple[int, int]] = {}
    for dim, name in (("dp", "data_parallel"), ("pp", "pipeline_model_parallel"),
                      ("tp", "tensor_model_parallel"), ("cp", "context_parallel"),
                      ("ep", "expert_model_parallel")):  # fmt: skip
        try:
            i = int(getattr(ps, f"get_{name}_rank")())
            n = int(getattr(ps, f"get_{name}_world_size")())
        except Exception:  # an older Megatron without the dimension, a group not made
            continue
        if 0 <= i < n <= MAX_PARALLEL_SIZE:
            out[dim] = (i, n)
    return out or None


def mesh_parallel(mesh: object) -> dict[str, tuple[int, int]]:
    """The coordinates a torch DeviceMesh with named dimensions gives (duck-typed:
    `mesh_dim_names`, `get_local_rank(name)`, `size(dim index)`)."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    out: dict[str, tuple[int, int]] = {}
    try:
        at = {
            n: (int(mesh.get_local_rank(n)), int(mesh.size(i)))  # type: ignore[attr-defined]
            for i, n in enumerate(names)
        }
    except Exception:
        return {}
    for n, v in at.items():
        if n in _MESH_NAMES:
            out[_MESH_NAMES[n]] = v
    if "dp" not in out and any(n in at for n in _MESH_DP):
        (ri, rn), (si, sn) = (at.get(n, (0, 1)) for n in _MESH_DP)
        out["dp"] = (ri * sn + si, rn * sn)
    got = _valid_parallel(out)
    return got if isinstance(got, dict) else {}


def _valid_rank(rank: int, world: int, local: int | None) -> tuple[int, int, int] | None:
    if not (isinstance(rank, int) and isinstance(world, int)):
        return None
    if not 0 <= rank < world <= MAX_WORLD_SIZE:
        return None
    if local is not None and not (isinstance(local, int) and 0 <= local < world):
        local = None
    return rank, world, -1 if local is None else local


def object_location(bucket: str, key: str, endpoint_url: str) -> str:
    """`s3://BUCKET/FOLDER/ ENDPOINT_URL`: where a request to `key` went, by its folder
    (gpufeed.storage.objects.object_location has the same; a test checks they agree)."""
    folder = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    return f"s3://{bucket}/{folder} {endpoint_url}".rstrip()


def own_io_bytes() -> tuple[int, int] | None:
    """(read_bytes, write_bytes) of this process and its reaped children, from
    /proc/self/io; None where the kernel does not account I/O or /proc is not there."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    kv = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        return int(kv["read_bytes"]), int(kv["write_bytes"])
    except (KeyError, ValueError):
        return None


def process_age_seconds() -> float | None:
    """Seconds since this process started, from /proc; None where /proc is not there."""
    try:
        with open("/proc/self/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        start_ticks = int(stat[stat.rfind(")") + 1 :].split()[19])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def _file_bytes_and_device(path: object) -> tuple[int, int]:
    """(bytes, st_dev) of a model file or directory; -1 for what cannot be told."""
    if path is None:
        return -1, -1
    try:
        where = os.fspath(path)  # type: ignore[call-overload]
        device = int(os.stat(where).st_dev)
    except (TypeError, OSError, ValueError):
        return -1, -1
    if isinstance(where, bytes):
        where = os.fsdecode(where)
    size = path_bytes(where)
    if device >= _MAX_DEVICE:
        device = -1
    return size if size <= _MAX_IO_BYTES else -1, device


def path_bytes(path: str) -> int:
    """Bytes a checkpoint holds: a file's size, or the sum over a directory tree; -1 if gone."""
    try:
        if not os.path.isdir(path):
            return os.stat(path).st_size
        total = 0
        for root, _dirs, files in os.walk(path):
            for f in files:
                with suppress(OSError):
                    total += os.stat(os.path.join(root, f)).st_size
        return total
    except OSError:
        return -1


def _truncate_utf8(text: str, limit: int) -> bytes:
    """UTF-8 of at most `limit` bytes; control, invisible and bidirectional characters and
    line separators replaced by "_" (the agent refuses them: REFUSED_CATEGORIES)."""
    import unicodedata  # only here: called once per Job

    text = "".join("_" if unicodedata.category(c) in REFUSED_CATEGORIES else c for c in text)
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return data
    return data[:limit].decode("utf-8", errors="ignore").encode("utf-8")
