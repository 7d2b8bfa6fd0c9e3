"""Where a node keeps state, and why a simulated node never touches it.

A real agent keeps its windows log in /var/lib/gpufeed and its SDK socket in /run/gpufeed.
A simulated node (`--simulate`, `--gpu.backend=simulated`, what `make run` starts on a
host without a GPU) must not write there: a real agent started later would read its
windows back as real ones, and it would take the socket real jobs report to. So a
simulated node that was not given a path of its own keeps its state in a directory made
for the run (under $TMPDIR) and removed when it stops.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

from gpufeed.config import DEFAULT_SDK_SOCKET, DEFAULT_WINDOWS_LOG, AgentConfig

PRODUCTION_STATE_DIRS = ("/var/lib/gpufeed", "/run/gpufeed")


def is_production_path(path: str) -> bool:
    p = os.path.abspath(path)
    return any(p == d or p.startswith(d + "/") for d in PRODUCTION_STATE_DIRS)


class RunStateDir:
    """A per-run state directory, made on first use and removed by `remove`."""

    def __init__(self) -> None:
        self.path = ""

    def file(self, name: str) -> str:
        if not self.path:
            self.path = tempfile.mkdtemp(prefix="gpufeed-sim-")
        return os.path.join(self.path, name)

    def remove(self) -> None:
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = ""


def simulated_config(config: AgentConfig, run_dir: RunStateDir) -> AgentConfig:
    """The config with every state path a simulated node would share with a real agent
    moved into the run's own directory. A path outside the production directories is
    kept: it was chosen for this run."""
    corr, sdk = config.correlator, config.sdk
    if corr.windows_log and (
        corr.windows_log == DEFAULT_WINDOWS_LOG or is_production_path(corr.windows_log)
    ):
        corr = dataclasses.replace(corr, windows_log=run_dir.file("windows.jsonl"))
    if sdk.socket_path == DEFAULT_SDK_SOCKET or is_production_path(sdk.socket_path):
        sdk = dataclasses.replace(sdk, socket_path=run_dir.file("sdk.sock"))
    return dataclasses.replace(config, correlator=corr, sdk=sdk)
