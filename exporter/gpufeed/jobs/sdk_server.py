"""The agent's end of the SDK socket: a Unix datagram socket read by one thread.

A thread blocked in recvmsg() (with a short timeout so that stop() is prompt) suits a
datagram socket better than the event loop: it drains the kernel queue whatever the HTTP
server is doing, and the work per datagram is a struct unpack and a few dict updates under
a lock. That work has a budget, though: at most BUDGET_SECONDS of every SLICE_SECONDS (a
quarter of a core); past it the thread sleeps out the slice, so that a flood of packed
datagrams cannot take the GIL from the scrape path and the sampler (it took 97% of a core
and pushed /metrics p99 to 203 ms). Datagrams wait in the kernel queue meanwhile; once it
is full the senders' SDK counts what it could not send (`Job.events_dropped`).

The kernel attaches the sender's pid and uid to each datagram (SO_PASSCRED), which tells
the agent which processes speak for a job (to notice when they exit), lets it take the job
id from the sender's cgroup (Slurm, Kubernetes) rather than trusting what the process
claims, and makes the rate and the job slots fair per sender (gpufeed.jobs.senders): a
datagram from a sender with no token left is dropped before it is decoded.

The socket file is created 0660: bound under a temporary name, chmod-ed, then renamed into
place, so it is never reachable with looser permissions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Set
from pathlib import Path

from gpufeed.catalogue import spec
from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import JobTable
from gpufeed.jobs.identity import (
    SCHEDULER_PROCESS,
    JobIdentity,
    read_job_identity,
    read_proc_stat,
)
from gpufeed.jobs.io_accounting import DeviceBytes
from gpufeed.jobs.senders import SenderKey, Senders
from gpufeed.model import Families, Family
from gpufeed.serving.endpoints import DeclaredServing

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660
RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024
MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes with its terminating NUL
_CREDS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_POLL_SECONDS = 0.2
_IDENTITY_CACHE_SIZE = 4096
SLICE_SECONDS = 0.02
BUDGET_SECONDS = 0.005


class SdkServer:
    """Receives SDK datagrams into a `JobTable`; start() binds and starts the thread."""

    def __init__(
        self,
        socket_path: str,
        *,
        max_jobs: int,
        max_messages_per_second: int,
        grace_seconds: float,
        procfs: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
        object_tier: Callable[[str], str] = lambda location: location,
    ) -> None:
        self.socket_path = socket_path
        self._procfs = procfs
        self._clock = clock
        self._lock = threading.Lock()
        self._table = JobTable(max_jobs, grace_seconds, self._pid_alive, object_tier)
        self._senders = Senders(float(max_messages_per_second), clock())
        self._dropped: Counter[str] = Counter()
        self._received = 0
        self._identities: OrderedDict[int, JobIdentity | None] = OrderedDict()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._inode: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Binds the socket (replacing a stale one) and starts the receiving thread.

        Raises OSError with the path in the message if the socket cannot be created.
        """
        if self._thread is not None:
            return
        path = Path(self.socket_path)
        if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
            raise OSError(
                errno.ENAMETOOLONG,
                f"SDK socket {path}: the path is {len(os.fsencode(path))} bytes, "
                f"Unix sockets allow {MAX_SOCKET_PATH_BYTES}",
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale(path)
        # Bound under a short name through the directory's descriptor, then renamed: the
        # temporary name must not be longer than the path (a legal 107-byte path).
        tmp = f".sdk-{os.getpid()}.tmp"
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            sock.bind(f"/proc/self/fd/{dfd}/{tmp}")
            os.chmod(tmp, SOCKET_MODE, dir_fd=dfd)
            os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise OSError(exc.errno, f"SDK socket {path}: {exc.strerror or exc}") from exc
        finally:
            os.close(dfd)
        self._inode = os.stat(path).st_ino
        self._sock = sock
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufeed-sdk", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread, closes the socket and removes its file (if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        try:
            if self._inode is not None and os.stat(self.socket_path).st_ino == self._inode:
                os.unlink(self.socket_path)
        except OSError:
            pass
        self._inode = None

    # -- what the collectors read ------------------------------------------------------------

    def families(
        self,
        gpus_of_pid: Mapping[int, Set[str]] | None = None,
        devices_to_tier: Mapping[str, str] | None = None,
    ) -> list[Family]:
        """The SDK's families; `gpus_of_pid` (pid -> GPU UUIDs, from NVML's process lists)
        names the GPU of each rank where it is known; `devices_to_tier` ("MAJ:MIN" -> tier,
        from the storage collector) the tier of each model load."""
        now = self._clock()
        with self._lock:
            self._table.expire(now)
            fams = self._table.families(gpus_of_pid, now, devices_to_tier)
            dropped = dict(self._dropped)
            received = self._received
        f = Families()
        f.extend(fams)
        for reason in wire.DROP_REASONS:
            f.put(
                spec("gpufeed_sdk_messages_dropped_total"),
                {"reason": reason},
                dropped.get(reason, 0),
            )
        f.put(spec("gpufeed_sdk_messages_received_total"), {}, received)
        return f.build()

    def job_for_pid(self, pid: int) -> tuple[str, str] | None:
        """(job id, job name) of the SDK job process `pid` speaks for, if any."""
        with self._lock:
            return self._table.job_for_pid(pid)

    def pids_by_job(self) -> dict[str, list[int]]:
        """The live processes of each SDK job that the agent can see."""
        with self._lock:
            return self._table.pids_by_job()

    def final_io_by_job(self) -> dict[str, dict[int, tuple[int, DeviceBytes]]]:
        """What each SDK job's processes reported of their own I/O at close."""
        with self._lock:
            return self._table.final_io_by_job()

    def serving_by_job(self) -> dict[str, DeclaredServing]:
        """The SDK jobs that serve requests: their metrics URL and own demand reports."""
        now = self._clock()
        with self._lock:
            return self._table.serving_by_job(now)

    def object_bytes_by_job(self) -> dict[str, dict[str, DeviceBytes]]:
        """The bytes each SDK job moved per object-storage tier."""
        with self._lock:
            return self._table.object_bytes_by_job()

    # -- receiving ---------------------------------------------------------------------------

    def handle(self, data: bytes, pid: int, truncated: bool = False, uid: int = 0) -> str | None:
        """Validates and applies one datagram from process `pid` (0 = unknown) of user
        `uid`; returns the first drop reason or None. The receiving thread calls this;
        tests may too.

        Counting is per message; a datagram refused whole (bad framing, bad field, or a
        sender over its rate, refused before decoding) counts as one message, since how
        many it claimed to hold cannot be trusted."""
        now = self._clock()
        with self._lock:
            ident = self._identity(pid)
            sender = _sender_key(uid, ident)
            if not self._senders.has_token(sender, now):
                decoded: list[wire.Message] | str = wire.REASON_RATE
            else:
                decoded = wire.REASON_SIZE if truncated else wire.decode_datagram(data)
            if isinstance(decoded, str):
                self._received += 1
                self._dropped[decoded] += 1
                return decoded
            self._received += len(decoded)
            first: str | None = None
            for msg in decoded:
                reason = self._admit(msg, pid, ident, sender, now)
                if reason is not None:
                    self._dropped[reason] += 1
                    first = first or reason
            return first

    def _admit(
        self,
        msg: wire.Message,
        pid: int,
        ident: JobIdentity | None,
        sender: SenderKey,
        now: float,
    ) -> str | None:
        if not self._senders.take(sender, now):
            return wire.REASON_RATE
        if ident is not None and ident.scheduler != SCHEDULER_PROCESS:
            # The scheduler's id from the kernel beats the one the process sent: it joins
            # gpufeed_job_info and cannot be forged by a process inside the job.
            msg = dataclasses.replace(msg, job_id=ident.job_id)
        ppid = 0
        if msg.kind == wire.KIND_IO and pid > 0:
            # Read now, while the sender is most likely still there (it is closing): the
            # job_io collector must know whether its parent's /proc/PID/io will hold it.
            stat = read_proc_stat(self._procfs, pid)
            ppid = stat.ppid if stat is not None else 0
        return self._table.apply(msg, pid, now, ppid, owner=sender)

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        anc = socket.CMSG_SPACE(_CREDS.size)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        slice_start = time.perf_counter()
        while not self._stop.is_set():
            busy = time.perf_counter() - slice_start
            if busy >= BUDGET_SECONDS:
                # over budget: leave the GIL to the scrape path until the slice is over
                time.sleep(max(0.0, SLICE_SECONDS - busy))
                slice_start = time.perf_counter()
            try:
                data, ancdata, flags, _ = sock.recvmsg(wire.MAX_DATAGRAM_BYTES + 1, anc)
            except BlockingIOError:
                # the queue is empty: wait for the next datagram; waiting costs nothing
                poller.poll(_POLL_SECONDS * 1000)
                slice_start = time.perf_counter()
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("SDK socket %s: receive failed: %s", self.socket_path, exc)
                time.sleep(_POLL_SECONDS)
                continue
            pid = uid = 0
            for level, kind, payload in ancdata:
                if (
                    level == socket.SOL_SOCKET
                    and kind == socket.SCM_CREDENTIALS
                    and len(payload) >= _CREDS.size
                ):
                    pid, uid, _ = _CREDS.unpack_from(payload)
            self.handle(data, pid, truncated=bool(flags & socket.MSG_TRUNC), uid=uid)

    def _identity(self, pid: int) -> JobIdentity | None:
        if pid <= 0:
            return None
        if pid in self._identities:
            self._identities.move_to_end(pid)
            return self._identities[pid]
        ident = read_job_identity(self._procfs, pid)
        self._identities[pid] = ident
        if len(self._identities) > _IDENTITY_CACHE_SIZE:
            self._identities.popitem(last=False)
        return ident

    def senders_active(self) -> int:
        with self._lock:
            return self._senders.active()

    def _pid_alive(self, pid: int) -> bool:
        alive = (self._procfs / str(pid)).exists()
        if not alive:
            self._identities.pop(pid, None)  # the pid may be reused by another job
        return alive

    def _remove_stale(self, path: Path) -> None:
        """A socket left by a previous agent is removed; anything else there is an error."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"SDK socket {path}: exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens: stale
            return
        finally:
            probe.close()
        raise OSError(f"SDK socket {path}: another agent is listening on it")


def _sender_key(uid: int, ident: JobIdentity | None) -> SenderKey:
    """Who shares a rate and the job slots: a uid in one scheduler job or process group."""
    if ident is None:  # another pid namespace, or the process is gone already
        return (uid, "", "")
    return (uid, ident.scheduler, ident.job_id)
