"""What the agent does on SIGHUP and SIGUSR1 (before 0.2.0 either killed it silently and
left its SDK socket and recording spool behind).

SIGHUP does not reload: the config decides which collectors run, the SDK socket, the
windows log and the correlator's parameters, all wired once at start, and swapping them
under a running sampler would lose or mix state. So SIGHUP checks the config file the way a
start would and says, in one log line, whether a restart would apply a change or fail on
an invalid file (`systemctl reload` as a dry run before `systemctl restart`).
SIGUSR1 logs one line of state: the last sample's age, collectors failing, the windows log.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from gpufeed.config import AgentConfig, ConfigError, load_config

if TYPE_CHECKING:
    from gpufeed.agent.sampler import Sampler

log = logging.getLogger("gpufeed.agent.command")


def early_handlers() -> None:
    """Until the serve loop installs its own: log and ignore, never die."""
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        signal.signal(
            sig, lambda s, _f: log.info("%s ignored while starting", signal.Signals(s).name)
        )


def on_hup(config_path: str | None, running: AgentConfig) -> None:
    if config_path is None:
        log.info("SIGHUP: no config file (defaults); nothing to check")
        return
    try:
        fresh = load_config(config_path)
    except ConfigError as exc:
        log.error("SIGHUP: the config file is invalid; the agent keeps running as it is: %s", exc)
        return
    if fresh == running:
        log.info("SIGHUP: %s is unchanged", config_path)
    else:
        log.warning(
            "SIGHUP: %s changed and is valid; the config is read only at start: restart the "
            "agent to apply it",
            config_path,
        )


def on_usr1(sampler: Sampler, started_monotonic: float) -> None:
    latest = sampler.latest
    if latest is None:
        age = "no sample yet"
    else:
        age = f"last sample {time.time() - latest.snapshot.timestamp_seconds:.1f}s ago"
    failing = sorted(s.name for s in latest.snapshot.statuses if not s.success) if latest else []
    health = ""
    for fam in latest.snapshot.families if latest else ():
        if fam.name.startswith("gpufeed_windows_log_") and fam.samples:
            total = sum(s.value for s in fam.samples)
            health += f", {fam.name.removeprefix('gpufeed_windows_log_')}={total:g}"
    log.info(
        "SIGUSR1: up %.0fs, %s, collectors failing: %s%s",
        time.monotonic() - started_monotonic,
        age,
        ", ".join(failing) or "none",
        health,
    )
