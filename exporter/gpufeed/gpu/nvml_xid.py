"""XID errors from NVML's event API, watched on a daemon thread that never blocks sampling.

`nvmlEventSetWait_v2` blocks in C (ctypes releases the GIL) for at most `timeout_ms`, so the
thread wakes a few times a second to notice a stop request. Counts live in `XidCounts`, which
outlives a watcher: the backend replaces the watcher when it re-initialises NVML, and the
counters must keep counting (they are Prometheus counters).

This module does not import pynvml: the backend hands it the module object, so that
`gpu/nvml.py` stays the only importer.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

from gpufeed.logonce import LogOnce

log = logging.getLogger("gpufeed.gpu.nvml")

# XID 79: "GPU has fallen off the bus". After it the GPU answers nothing until a reset.
XID_FALLEN_OFF_BUS = 79


def handle_key(handle: Any) -> int:
    """A device handle's address, so the handle in an event can be matched to a GPU index."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return int(value or 0)


class XidCounts:
    """XID counts per (GPU index, XID code), and GPUs that XID 79 has marked lost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, dict[int, int]] = {}
        self._lost: set[int] = set()

    def record(self, index: int, xid: int) -> None:
        with self._lock:
            per_gpu = self._counts.setdefault(index, {})
            per_gpu[xid] = per_gpu.get(xid, 0) + 1
            if xid == XID_FALLEN_OFF_BUS:
                self._lost.add(index)

    def of(self, index: int) -> tuple[tuple[int, int], ...]:
        with self._lock:
            return tuple(sorted(self._counts.get(index, {}).items()))

    def take_lost(self) -> set[int]:
        """GPUs marked lost by XID 79 since the last call (each is reported once)."""
        with self._lock:
            lost, self._lost = self._lost, set()
            return lost


class XidWatcher:
    """Registers every GPU for XID events and counts them on a daemon thread."""

    def __init__(
        self,
        nv: Any,
        handles: Sequence[tuple[int, Any]],
        counts: XidCounts,
        *,
        timeout_ms: int = 250,
    ) -> None:
        self._nv = nv
        self._counts = counts
        self._timeout_ms = timeout_ms
        self._stop = threading.Event()
        self._by_key: dict[int, int] = {}
        self._event_set: Any = None
        self._thread: threading.Thread | None = None
        self._warned = LogOnce(log)
        self._handles = tuple(handles)
        self.rebuilds = 0
        self._register(handles)

    @property
    def watching(self) -> tuple[int, ...]:
        """GPU indices registered for XID events."""
        return tuple(sorted(self._by_key.values()))

    def _register(self, handles: Sequence[tuple[int, Any]]) -> None:
        nv = self._nv
        self._by_key = {}
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError) as exc:
            log.warning("XID errors will not be counted: nvmlEventSetCreate failed: %s", exc)
            return
        for index, handle in handles:
            try:
                nv.nvmlDeviceRegisterEvents(
                    handle, nv.nvmlEventTypeXidCriticalError, self._event_set
                )
            except nv.NVMLError as exc:
                # NOT_SUPPORTED on some boards and under some virtualisation: that GPU's XID
                # counter stays absent, the others are still watched.
                log.info(
                    "GPU %d: XID events not available (%s); its XID counter is left out", index, exc
                )
                continue
            self._by_key[handle_key(handle)] = index

    def start(self) -> None:
        if not self._by_key:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="nvml-xid-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self._timeout_ms / 1000.0 + 1.0)
            if thread.is_alive():
                # Still inside nvmlEventSetWait: freeing the set under it would be unsafe, so
                # leave it to the daemon thread's death at exit.
                return
        self._free()

    def _rebuild(self) -> None:
        self._free()
        self._register(self._handles)
        self.rebuilds += 1
        if not self._by_key:
            log.warning("XID watcher: no GPU registers for events any more; XID counters freeze")
            self._free()

    def _free(self) -> None:
        if self._event_set is None:
            return
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlEventSetFree(self._event_set)
        self._event_set = None

    def _run(self) -> None:
        nv = self._nv
        timeout_code = nv.NVML_ERROR_TIMEOUT
        xid_bit = nv.nvmlEventTypeXidCriticalError
        pause = self._timeout_ms / 1000.0
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, self._timeout_ms)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == timeout_code:
                    continue
                if code == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                    log.warning(
                        "XID errors will not be counted: this driver has no %s",
                        "nvmlEventSetWait_v2",
                    )
                    return
                # GPU_IS_LOST, UNKNOWN, ...: the event set may be dead (NVML gives no way to
                # tell), and waiting on it again would fail for ever. Rebuild it after a
                # pause (no spinning), with every GPU that still registers.
                self._warned.log(
                    logging.WARNING,
                    f"wait-{code}",
                    "XID watcher: %s; rebuilding its event set",
                    exc,
                )
                if self._stop.wait(pause):
                    break
                self._rebuild()
                if self._event_set is None:
                    return
                continue
            except Exception:
                log.exception("XID watcher stopped; XID counters freeze from here")
                return
            if not int(data.eventType) & xid_bit:
                continue
            index = self._by_key.get(handle_key(data.device))
            if index is None:
                continue
            xid = int(data.eventData)
            self._counts.record(index, xid)
            log.warning("GPU %d: XID %d", index, xid)
