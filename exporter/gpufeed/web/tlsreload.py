"""Rotated certificates without a restart: the TLS context is rebuilt when the web config
file, or a certificate, key or CA file it names, changes. The exporter toolkit reads them
on every connection; here a new connection looks at most once a second (a stat of each
file), and a file that does not load keeps the previous certificate, with one log line.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable

from gpufeed.logonce import LogOnce
from gpufeed.web.webconfig import (
    TlsSettings,
    WebConfig,
    WebConfigError,
    load_web_config,
    server_ssl_context,
)

log = logging.getLogger("gpufeed.web")

CHECK_EVERY_SECONDS = 1.0

_Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(paths: tuple[str, ...]) -> _Stamp:
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows symlinks: a Kubernetes secret swaps one
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class ReloadingTls:
    def __init__(
        self,
        config: WebConfig,
        tls: TlsSettings,
        errors: LogOnce,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = config.path
        self._errors = errors
        self._clock = clock
        self._context = server_ssl_context(tls)
        self._files = (self._path, *tls.files) if self._path else tls.files
        self._stamp = _stamp(self._files)
        self._next_check = clock() + CHECK_EVERY_SECONDS

    def context(self) -> ssl.SSLContext:
        """The context for a new connection."""
        now = self._clock()
        if now < self._next_check or not self._path:
            return self._context
        self._next_check = now + CHECK_EVERY_SECONDS
        stamp = _stamp(self._files)
        if stamp == self._stamp:
            return self._context
        self._stamp = stamp  # a broken file is reported once per change, not per connection
        try:
            tls = load_web_config(self._path).tls
            if tls is None:
                raise WebConfigError(f"{self._path}: tls_server_config is gone")
            context = server_ssl_context(tls)
        except (WebConfigError, ssl.SSLError, OSError, ValueError) as exc:
            self._errors.log(
                logging.ERROR,
                "tls reload",
                "keeping the previous certificate: %s",
                exc,
            )
            return self._context
        self._files = (self._path, *tls.files)
        self._stamp = _stamp(self._files)
        self._context = context
        log.info("TLS certificate reloaded from %s", self._path)
        return context
