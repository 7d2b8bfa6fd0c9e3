"""systemd's readiness and watchdog protocol (sd_notify(3)) with the standard library.

The unit is `Type=notify` with `WatchdogSec=`: the agent says READY=1 once it serves, and
pings WATCHDOG=1 only while the sampler makes progress, so that a sampler stuck for good (a
processor or sink blocked in the kernel, a deadlock) gets the agent restarted instead of
/metrics serving the same snapshot for ever. The protocol is one datagram per message on
the unix socket named by $NOTIFY_SOCKET; libsystemd is not needed for that, and outside
systemd (no $NOTIFY_SOCKET) everything here does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping

from gpufeed.logonce import LogOnce

log = logging.getLogger(__name__)


def notify_address(env: Mapping[str, str]) -> str | None:
    """Where to send notifications: $NOTIFY_SOCKET as a socket address, None when unset.

    A leading '@' names a socket in the abstract namespace (systemd's own convention).
    Other forms (vsock) are for VMs, not for a node agent, and are ignored with a warning.
    """
    value = env.get("NOTIFY_SOCKET", "")
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    log.warning("NOTIFY_SOCKET=%s is not a unix socket path: not notifying systemd", value)
    return None


def watchdog_interval_seconds(env: Mapping[str, str], pid: int) -> float | None:
    """How often systemd expects WATCHDOG=1 ($WATCHDOG_USEC), None when it does not.

    $WATCHDOG_PID, when set, names the one process the watchdog is for; another process
    (a child that inherited the environment) must not ping on its behalf.
    """
    usec = env.get("WATCHDOG_USEC", "")
    owner = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and (not owner.isdigit() or int(owner) != pid):
        return None
    return int(usec) / 1e6


class Notifier:
    """Sends sd_notify messages; a failed send is logged once and never raised."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._failing = LogOnce(log)  # one line per run of failed sends

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Notifier | None:
        address = notify_address(os.environ if env is None else env)
        return cls(address) if address is not None else None

    def send(self, message: str) -> bool:
        try:
            self._sock.sendto(message.encode(), self._address)
        except OSError as exc:
            self._failing.log(
                logging.WARNING, "send", "cannot notify systemd at %r: %s", self._address, exc
            )
            return False
        self._failing.clear("send")
        return True

    def close(self) -> None:
        self._sock.close()


class Watchdog:
    """Pings WATCHDOG=1 every half interval (as sd_watchdog_enabled(3) advises) while
    `progressing()` says the agent is doing its work, and stays silent while it is not."""

    def __init__(
        self,
        notifier: Notifier,
        *,
        interval_seconds: float,
        progressing: Callable[[], bool],
    ) -> None:
        self._notifier = notifier
        self._period = interval_seconds / 2
        self._progressing = progressing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)
        self._was_progressing = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._period + 1)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                ok = self._progressing()
            except Exception:  # a broken check is no progress, not a dead watchdog thread
                log.exception("watchdog progress check failed")
                ok = False
            if ok:
                self._notifier.send("WATCHDOG=1")
            elif self._was_progressing:
                log.error("sampling makes no progress: not pinging the systemd watchdog")
            self._was_progressing = ok


class ServiceNotifier:
    """One agent run under systemd: READY=1 when serving, the watchdog while it runs,
    STOPPING=1 on the way out. Without $NOTIFY_SOCKET it does nothing."""

    def __init__(self, notifier: Notifier | None, watchdog: Watchdog | None) -> None:
        self._notifier = notifier
        self._watchdog = watchdog

    @classmethod
    def ready(
        cls,
        progressing: Callable[[], bool],
        env: Mapping[str, str] | None = None,
        pid: int | None = None,
    ) -> ServiceNotifier:
        """Says READY=1 and starts the watchdog if systemd asked for one."""
        environ = os.environ if env is None else env
        notifier = Notifier.from_environment(environ)
        if notifier is None:
            return cls(None, None)
        interval = watchdog_interval_seconds(environ, os.getpid() if pid is None else pid)
        watchdog = None
        if interval is not None:
            watchdog = Watchdog(notifier, interval_seconds=interval, progressing=progressing)
            watchdog.start()
        notifier.send("READY=1")
        return cls(notifier, watchdog)

    def stopping(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._notifier is not None:
            self._notifier.send("STOPPING=1")
            self._notifier.close()
