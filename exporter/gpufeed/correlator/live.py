"""The correlator inside the agent: a snapshot `Processor` exporting the contract's
correlator metrics, logging closed windows durably and keeping recent ones for the API."""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from typing import Final

from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine import NodeCorrelator, WindowParams
from gpufeed.correlator.features import JOB_READ
from gpufeed.correlator.node import USED_METRIC_SET, NodeSeries
from gpufeed.correlator.series import Series
from gpufeed.correlator.view import Timing
from gpufeed.correlator.window import Window
from gpufeed.correlator.windowlog import WindowLog, read_log
from gpufeed.model import Families, Family, LabelPairs
from gpufeed.snapshot import Snapshot

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
    ) -> None:
        cfg = config or CorrelatorConfig()
        self.params = WindowParams(
            cfg.threshold_ratio, cfg.min_window_seconds, cfg.merge_gap_seconds
        )
        # windows in the log and the API name the host (metrics do not: Prometheus adds it)
        self.node = NodeSeries(socket.gethostname() if instance is None else instance)
        self._corr = NodeCorrelator(
            self.node, Timing(interval_seconds), self.params, on_window=self._closed
        )
        self._routes: dict[tuple[str, LabelPairs], Series | None] = {}
        self._seconds: dict[Key, float] = {}
        self._count: dict[Key, int] = {}
        self._recent: deque[Window] = deque(maxlen=recent)
        self._lock = threading.Lock()
        self._next_trim = 0.0
        self._log = log
        self._log_failing = False
        self._last_t: float | None = None
        if log is None and cfg.windows_log:
            try:
                self._log = WindowLog(
                    cfg.windows_log, cfg.windows_log_max_bytes, cfg.windows_log_backups
                )
            except OSError as e:
                # the correlator still runs and exports its metrics; only the log is off
                _log.error("windows log %s cannot be opened, not logging: %s", cfg.windows_log, e)
        if self._log is not None:
            self._recent.extend(read_log(self._log.path))

    # ---- Processor -----------------------------------------------------------------------
    def process(self, snapshot: Snapshot) -> list[Family]:
        t = snapshot.timestamp_seconds
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
                self._corr.refresh_units()
            if self._last_t is None or t > self._last_t:  # a clock stepping back: skip
                self._last_t = t
                self._corr.step(t)
            if t >= self._next_trim:
                self._next_trim = t + TRIM_EVERY_SECONDS
                node.trim_before(t - KEEP_SECONDS)
                self._forget_ended_jobs(t - ENDED_JOB_SECONDS)
            return self._families()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def _forget_ended_jobs(self, horizon: float) -> None:
        """Forgets the jobs whose series all ended before `horizon`, unless a window of
        theirs is still open (the window closes first; the job goes at a later trim)."""
        node, units = self.node, self._corr.units
        busy = {seg.job_id for u in units.values() for seg in (u.seg, u.chal) if seg is not None}
        busy.update(u.cpu_job for u in units.values() if u.cpu_job and u.run_start is not None)
        ended = set()
        for job_id, j in node.jobs.items():
            if job_id in busy:
                continue
            series = [s for (jid, _), s in node.job_info.items() if jid == job_id]
            series += [*j.phases.values(), *j.tier_read.values(), *j.tier_written.values()]
            series += [s for s in (j.steps, j.checkpoint_bytes) if s is not None]
            if all(not s.ts or s.ts[-1] < horizon for s in series):
                ended.add(job_id)
        if not ended:
            return
        for job_id in ended:
            del node.jobs[job_id]
            self._corr.baselines.forget_prefix((JOB_READ, job_id))
            units.pop("job:" + job_id, None)
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
        key = (w.gpu, w.uuid, w.job_id, w.cause.value)
        self._seconds[key] = self._seconds.get(key, 0.0) + w.duration_seconds
        self._count[key] = self._count.get(key, 0) + 1
        self._recent.append(w)
        if self._log is not None:
            try:
                self._log.append(w)
                self._log_failing = False
            except OSError as e:
                if not self._log_failing:  # once per failure, not once per window
                    _log.error("cannot append to windows log %s: %s", self._log.path, e)
                self._log_failing = True

    def windows(self, limit: int = 200) -> tuple[list[Window], list[Window]]:
        """(recent closed windows, newest last; open windows)."""
        with self._lock:
            closed = list(self._recent)[-limit:] if limit > 0 else []
            return closed, self._corr.open_windows()

    def _families(self) -> list[Family]:
        fb = Families()
        fb.declare(SECONDS, "counter", "Seconds of GPU underutilization attributed to each cause.")
        fb.declare(CAUSE, "gauge", "1 while an underutilization window is open, with its cause.")
        fb.declare(WINDOWS, "counter", "Closed underutilization windows per cause.")
        seconds = dict(self._seconds)
        for u in self._corr.units.values():
            seg = u.seg
            if seg is None:
                continue
            end = u.last_low_t if u.chal is None else min(u.last_low_t, u.chal.start)
            key = (u.gpu, u.uuid, seg.job_id, seg.cause.value)
            seconds[key] = seconds.get(key, 0.0) + max(0.0, end - seg.start)
            fb.gauge(CAUSE, "", _labels(key), 1.0)
        for key, v in sorted(seconds.items()):
            fb.counter(SECONDS, "", _labels(key), v)
        for key, n in sorted(self._count.items()):
            fb.counter(WINDOWS, "", _labels(key), float(n))
        return fb.build()


def _labels(key: Key) -> dict[str, str]:
    gpu, uuid, job, cause = key
    return {"gpu": gpu, "uuid": uuid, "job_id": job, "cause": cause}
