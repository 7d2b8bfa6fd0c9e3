"""The correlator inside the agent: a snapshot `Processor` exporting the contract's
correlator metrics, logging closed windows durably and keeping recent ones for the API."""

from __future__ import annotations

import logging
import math
import socket
import threading
from collections import deque
from dataclasses import replace
from typing import Final

from gpufeed.catalogue import spec
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine.engine import NodeCorrelator, WindowParams
from gpufeed.correlator.engine.node import USED_METRIC_SET, NodeSeries
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.view import Timing
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.pacing import ScenarioClock
from gpufeed.correlator.job.culprit import correlate_job, is_waiting, multi_rank
from gpufeed.correlator.outputs import openwindows
from gpufeed.correlator.outputs.loghealth import add_log_health
from gpufeed.correlator.outputs.windowlog import MAX_PENDING, LogHealth, WindowLog, WindowLogInUse
from gpufeed.correlator.outputs.windowlog_read import OPEN_RECORD, scan_log
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family, LabelPairs
from gpufeed.snapshot import Snapshot
from gpufeed.trace.format import om_timestamp
from gpufeed.vocabulary import Cause, DataSource

SECONDS: Final = "gpufeed_gpu_underutilized_seconds_total"
CAUSE: Final = "gpufeed_gpu_underutilization_cause"
WINDOWS: Final = "gpufeed_gpu_underutilization_windows_total"
_log = logging.getLogger(__name__)
KEEP_SECONDS = 900.0  # history kept in the columns: rates, XID lookback, start-up checks
TRIM_EVERY_SECONDS = 120.0
# A job none of whose series has had a sample for this long has ended: its correlator
# series, columns and baselines go, so that neither the exported series nor the agent's
# memory and per-sample work grow with every job the node has ever run.
ENDED_JOB_SECONDS = KEEP_SECONDS
# And however fast jobs come and go (a process sending a new job id per message), the
# correlator keeps at most this many: past it, those whose series stopped longest ago go
# at once. Four times the SDK's default sdk.max_jobs, plus room for scheduler jobs.
MAX_JOBS = 256
# A log that could not be opened (disk full at start, a directory not there yet) is tried
# again this often, in sample time: it is never off for the agent's lifetime.
REOPEN_EVERY_SECONDS = 30.0
# Windows a full disk held back are tried again this often.
RETRY_EVERY_SECONDS = 5.0

Key = tuple[str, str, str, str]  # gpu, uuid, job_id, cause


class CorrelatorProcessor:
    """Feed every snapshot to `process`; it returns the correlator's families."""

    name = "correlator"

    def __init__(
        self,
        config: CorrelatorConfig | None = None,
        interval_seconds: float = 1.0,
        instance: str | None = None,
        log: WindowLog | None = None,
        recent: int = 1000,
        simulated: bool = False,
        pace: float = 1.0,
    ) -> None:
        """`simulated`: a simulated node; its log lines say so, and only its own kind of
        line is read back (a real agent never serves a simulated node's windows).
        `pace`: a simulated node's `--simulate.pace`; the correlator then runs on the
        scenario's clock (see `pacing`), and everything it reports is on the wall clock.

        Raises WindowLogInUse when another agent holds the windows log."""
        cfg = config or CorrelatorConfig()
        self.params = WindowParams(
            cfg.threshold_ratio, cfg.min_window_seconds, cfg.merge_gap_seconds
        )
        # windows in the log and the API name the host (metrics do not: Prometheus adds it)
        self.node = NodeSeries(socket.gethostname() if instance is None else instance)
        # On the scenario clock, samples lie `pace` intervals apart.
        self._corr = NodeCorrelator(
            self.node, Timing(interval_seconds * pace), self.params, on_window=self._closed
        )
        self._pace = pace
        self._clock: ScenarioClock | None = None  # set by the first snapshot when paced
        self._routes: dict[tuple[str, LabelPairs], Series | None] = {}
        self._seconds: dict[Key, float] = {}
        self._count: dict[Key, int] = {}
        self._recent: deque[Window] = deque(maxlen=recent)
        self._lock = threading.Lock()
        self._next_trim = 0.0
        self._cfg = cfg
        self._simulated = simulated
        self._log = log
        self._log_failing = LogOnce(_log)
        self._open_errors = 0  # failed attempts to open the log
        # windows closed while the log could not be opened yet, written once it is
        self._unopened: deque[Window] = deque(maxlen=MAX_PENDING)
        self._skipped: dict[str, int] = {}
        self._next_open = 0.0
        self._next_retry = 0.0
        self._saved_keys: frozenset[openwindows.WindowKey] = frozenset()
        self._next_save = 0.0
        self._last_t: float | None = None
        # Counts processed snapshots: the windows change only when it does, so /api/windows
        # renders its JSON once per value instead of once per request.
        self.generation = 0
        if log is None and cfg.windows_log:
            self._open_log()
        elif log is not None:
            self._load(log)

    def _open_log(self) -> None:
        """Opens the log; at start another agent holding it is the caller's error
        (WindowLogInUse), later it is one more failed attempt."""
        cfg = self._cfg
        at_start = self._log is None and self._open_errors == 0
        try:
            log = WindowLog(
                cfg.windows_log,
                cfg.windows_log_max_bytes,
                cfg.windows_log_backups,
                simulated=self._simulated,
            )
        except (OSError, WindowLogInUse) as e:
            if at_start and isinstance(e, WindowLogInUse):
                raise
            # the correlator still runs and exports its metrics; the log is tried again
            self._open_errors += 1
            if self._open_errors == 1:
                _log.error(
                    "windows log %s cannot be opened, trying again every %gs: %s",
                    cfg.windows_log,
                    REOPEN_EVERY_SECONDS,
                    e,
                )
            return
        if self._open_errors:
            _log.info("windows log %s is open", cfg.windows_log)
        self._log = log
        self._load(log)

    def _load(self, log: WindowLog) -> None:
        """Reads the log back, then logs the windows a stop left open (see openwindows)."""
        try:
            scan = scan_log(log.path, simulated=self._simulated, keep=self._recent.maxlen)
        except OSError as e:
            _log.error("windows log %s cannot be read: %s", log.path, e)
            return
        self._skipped = dict(scan.skipped)
        bad = sum(scan.skipped.values())
        if bad:
            _log.warning(
                "windows log %s: skipped %d lines (%s)",
                log.path,
                bad,
                ", ".join(f"{r}: {n}" for r, n in sorted(scan.skipped.items())),
            )
        # the windows of earlier runs come before those closed while the log was not open
        self._recent = deque([*scan.windows, *self._recent], maxlen=self._recent.maxlen)
        while self._unopened:
            self._log_error(log.append(self._unopened.popleft()))
        record = openwindows.record_path(log.path)
        left, skipped = openwindows.load(record, self._simulated)
        if skipped:
            self._skipped[OPEN_RECORD] = self._skipped.get(OPEN_RECORD, 0) + skipped
        logged = {openwindows.window_key(w) for w in scan.windows}
        self._log_interrupted(openwindows.interrupted(left, logged), record)

    def _log_interrupted(self, windows: list[Window], record: str) -> None:
        assert self._log is not None
        error = None
        for w in windows:
            self._recent.append(w)
            error = self._log.append(w)
        if error is None:
            openwindows.remove(record)
        else:
            self._log_error(error)

    # ---- Processor -----------------------------------------------------------------------
    def process(self, snapshot: Snapshot) -> list[Family]:
        if self._pace != 1.0:
            if self._clock is None:
                self._clock = ScenarioClock(snapshot.timestamp_seconds, self._pace)
            snapshot = self._clock.snapshot(snapshot)
        # the instant as `--record` writes it (milliseconds): the engine's decisions turn
        # on differences of instants (a decision is reused for under 5 s; edges weigh
        # interval lengths), and at full precision the agent decided a sample differently
        # from the analysis of its own trace where two instants were 5 s apart to within
        # a millisecond (issue 23: a window's end 1 s apart, confidence 0.725 for 0.742)
        t = float(om_timestamp(snapshot.timestamp_seconds))
        routes = self._routes
        node = self.node
        new = False
        with self._lock:
            for fam in snapshot.families:
                if fam.name not in USED_METRIC_SET:
                    continue
                for s in fam.samples:
                    key = (s.name, s.labels)
                    if key in routes:
                        ser = routes[key]
                    else:
                        labels = dict(s.labels)
                        ser = routes[key] = node.route(s.name, labels)
                        new = True
                        if s.name == "gpufeed_job_info":
                            k = (labels.get("job_id", ""), labels.get("gpu", ""))
                            node.first_seen.setdefault(k, t)
                        elif s.name == "gpufeed_job_phase_seconds_total":
                            node.first_seen.setdefault((labels.get("job_id", ""), ""), t)
                    if ser is not None:
                        ser.append(t, s.value)
            if new:
                if len(node.jobs) > MAX_JOBS:
                    self._forget_ended_jobs(t - ENDED_JOB_SECONDS, t)
                self._corr.refresh_units()
            if self._last_t is None or t > self._last_t:  # a clock stepping back: skip
                self._last_t = t
                if self._corr.on_timeline(t):
                    self._corr.step(t)
            if t >= self._next_trim:
                self._next_trim = t + TRIM_EVERY_SECONDS
                node.trim_before(t - KEEP_SECONDS)
                self._forget_ended_jobs(t - ENDED_JOB_SECONDS, t)
            self._keep_log(t)
            self.generation += 1
            return self._families()

    def close(self) -> None:
        """Logs the windows open now as cut short (a clean stop must not lose them)."""
        with self._lock:
            log, self._log = self._log, None
            if log is None:
                return
            try:
                record = openwindows.record_path(log.path)
                open_now = self._open_windows()
                if open_now:
                    self._save_record(log, open_now)
                    logged = {openwindows.window_key(w) for w in self._recent}
                    self._log = log
                    self._log_interrupted(openwindows.interrupted(open_now, logged), record)
                    self._log = None
                else:
                    openwindows.remove(record)
            finally:
                log.close()

    # ---- the log's upkeep, once per sample -------------------------------------------------
    def _keep_log(self, t: float) -> None:
        log = self._log
        if log is None:
            if self._cfg.windows_log and t >= self._next_open:
                self._next_open = t + REOPEN_EVERY_SECONDS
                self._open_log()
            return
        if t >= self._next_retry and log.health().pending_windows:
            self._next_retry = t + RETRY_EVERY_SECONDS
            self._log_error(log.retry())
        keys = self._corr.open_window_keys()
        if keys != self._saved_keys or (keys and t >= self._next_save):
            self._next_save = t + openwindows.SAVE_EVERY_SECONDS
            if self._save_record(log, self._open_windows()):
                self._saved_keys = keys

    def _save_record(self, log: WindowLog, windows: list[Window]) -> bool:
        record = openwindows.record_path(log.path)
        try:
            if windows:
                openwindows.save(record, windows, self._simulated)
            else:
                openwindows.remove(record)
        except OSError as e:
            log.count_error()
            self._log_error(e)
            return False
        return True

    def _forget_ended_jobs(self, horizon: float, now: float) -> None:
        """Forgets the jobs whose series all ended before `horizon`, and past MAX_JOBS the
        ones whose series stopped longest ago (down to 3/4 of it, so that churn does not
        make every sample pay for this), unless a window of theirs is still open (the
        window closes first; the job goes later) or they have a sample at `now`."""
        node = self.node
        busy = self._corr.jobs_in_runs()
        last_seen: dict[str, float] = {}
        for (job_id, _), s in node.job_info.items():
            if s.ts:
                last_seen[job_id] = max(last_seen.get(job_id, -math.inf), s.ts[-1])
        for job_id, j in node.jobs.items():
            series = [*j.phases.values(), *j.tier_read.values(), *j.tier_written.values()]
            series += [s for s in (j.steps, j.processes, j.checkpoint_bytes) if s is not None]
            last = max((s.ts[-1] for s in series if s.ts), default=-math.inf)
            last_seen[job_id] = max(last_seen.get(job_id, -math.inf), last)
        idle = sorted((last_seen.get(j, -math.inf), j) for j in node.jobs if j not in busy)
        over = len(node.jobs) - MAX_JOBS * 3 // 4
        ended = {
            j for i, (last, j) in enumerate(idle) if last < horizon or (i < over and last < now)
        }
        if not ended:
            return
        for job_id in ended:
            del node.jobs[job_id]
        self._corr.forget_jobs(ended)
        for m in (node.job_info, node.job_uuid, node.first_seen):
            for jk in [jk for jk in m if jk[0] in ended]:
                del m[jk]
        for rk in [rk for rk in self._routes if dict(rk[1]).get("job_id") in ended]:
            del self._routes[rk]
        for key in [key for key in self._seconds if key[2] in ended]:
            del self._seconds[key]
        for key in [key for key in self._count if key[2] in ended]:
            del self._count[key]

    # ---- windows -------------------------------------------------------------------------
    def _closed(self, w: Window) -> None:
        w = self._joined(w)
        if self._clock is not None:
            w = self._clock.window(w)
        key = (w.gpu, w.uuid, w.job_id, w.cause.value)
        self._seconds[key] = self._seconds.get(key, 0.0) + w.duration_seconds
        self._count[key] = self._count.get(key, 0) + 1
        self._recent.append(w)
        if self._log is not None:
            self._log_error(self._log.append(w))
        elif self._cfg.windows_log:
            self._unopened.append(w)  # written once the log can be opened

    def _joined(self, w: Window) -> Window:
        """A closed window through the job-level join with its job's windows open now
        (`_whole_jobs`)."""
        if not is_waiting(w):
            return w
        stall = [o for o in self._corr.open_windows() if o.job_id == w.job_id]
        return self._whole_jobs([w, *stall])[0]

    def _whole_jobs(self, windows: list[Window]) -> list[Window]:
        """`windows` (same order), those of a job whose every rank runs here (its ranks
        report the world size, and all of them are on this node) through the job-level
        join over this node's columns: the agent sees the whole job, so it names the rank
        that gates the steps as `gpufeed analyze` does. Any other window as the node
        engine found it: the agent sees only some of the job's ranks, and the job-level
        view (`gpufeed analyze`, `gpufeed fleet`) decides."""
        out = list(windows)
        of_job: dict[str, list[int]] = {}
        for i, w in enumerate(out):
            if multi_rank(self.node, w.job_id, known=True):
                of_job.setdefault(w.job_id, []).append(i)
        nodes = {self.node.instance: self.node}
        for job, idx in of_job.items():
            joined = correlate_job(job, nodes, [out[i] for i in idx], self.params.threshold_ratio)
            for i, w in zip(idx, joined, strict=True):
                out[i] = w
        return out

    def _log_error(self, error: OSError | None) -> None:
        """Logs a write failure once per run of failures, and the recovery."""
        if self._log is None:
            return
        if error is None:
            self._log_failing.clear("write", "windows log %s is written again", self._log.path)
            return
        self._log_failing.log(
            logging.ERROR,
            "write",
            "cannot write windows log %s (windows are kept in memory until it can): %s",
            self._log.path,
            error,
        )

    def windows(self, limit: int = 200) -> tuple[list[Window], list[Window]]:
        """(recent closed windows, newest last; open windows)."""
        with self._lock:
            closed = list(self._recent)[-limit:] if limit > 0 else []
            return closed, self._open_windows()

    def _open_windows(self) -> list[Window]:
        clock = self._clock
        windows = self._whole_jobs(self._corr.open_windows())
        return windows if clock is None else [clock.window(w) for w in windows]

    def _families(self) -> list[Family]:
        fb = Families()
        for name in (SECONDS, CAUSE, WINDOWS):
            fb.declare_spec(spec(name))  # name, type and HELP: the catalogue
        seconds = dict(self._seconds)
        own = self._corr.open_input_pipeline_windows()
        for key, so_far in self._corr.open_window_seconds():
            # scenario seconds / pace: wall seconds, as closed windows count them
            seconds[key] = seconds.get(key, 0.0) + so_far / self._pace
            # where a data stall's wait is: its alert's route (the job's owner or storage)
            source = DataSource.INPUT_PIPELINE if key in own else DataSource.STORAGE
            where = {"data_source": source.value} if key[3] == Cause.DATA_LOADING.value else {}
            fb.put(spec(CAUSE), {**_labels(key), **where}, 1.0)
        for key, v in sorted(seconds.items()):
            fb.put(spec(SECONDS), _labels(key), v)
        for key, n in sorted(self._count.items()):
            fb.put(spec(WINDOWS), _labels(key), float(n))
        if self._cfg.windows_log or self._log is not None:
            health = self._log.health() if self._log is not None else LogHealth(0, 0, 0)
            pending = health.pending_windows + len(self._unopened)
            health = replace(
                health,
                write_errors_total=health.write_errors_total + self._open_errors,
                pending_windows=pending,
            )
            add_log_health(fb, health, self._skipped)
        return fb.build()


def _labels(key: Key) -> dict[str, str]:
    gpu, uuid, job, cause = key
    return {"gpu": gpu, "uuid": uuid, "job_id": job, "cause": cause}
