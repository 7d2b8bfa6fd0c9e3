"""The real gpufeed agent for one lab run: its own config (the run's tiers, SDK socket and
windows log in the run directory), listening on port 0, the port read back from the
kernel's socket table for the agent's own pid (never a fixed port: eight people run labs
and tests on one host)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

from lab.host import LoopTier, dies_with_runner


def listening_port(pid: int) -> int | None:
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except psutil.NoSuchProcess:
        return None
    ports = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}
    return ports.pop() if len(ports) == 1 else None


class Agent:
    def __init__(
        self,
        run_dir: Path,
        tiers: dict[str, LoopTier],
        instance: str,
        objects: dict[str, list[str]] | None = None,
        gpu_job: str = "",
    ) -> None:
        """`objects`: object-storage tiers (name -> s3:// entries), beside the mounts.
        `gpu_job`: the job given GPU 0, written to a mapping directory as a Slurm prolog
        does (on a GPU host the job holds its GPU from its start, even where NVML cannot
        list a container's processes; without a GPU it is never read)."""
        self.run_dir = run_dir
        self.socket = run_dir / "sdk.sock"
        self.windows_log = run_dir / "windows.jsonl"
        self.config = run_dir / "agent.yaml"
        self.instance = instance
        config: dict[str, Any] = {
            "interval_seconds": 1,
            "tiers": {
                **{name: str(t.mnt) for name, t in tiers.items()},
                **(objects or {}),
            },
            "sdk": {"socket_path": str(self.socket)},
            "correlator": {"windows_log": str(self.windows_log)},
        }
        if gpu_job:
            mapping = run_dir / "gpu-jobs"
            mapping.mkdir(exist_ok=True)
            (mapping / "0").write_text(gpu_job + "\n")
            config["jobs"] = {"mapping_dir": str(mapping)}
        self.config.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, prefix: list[str], record: Path | None = None, timeout_s: float = 60.0) -> None:
        """Starts the agent; `record`: also write every sample to this trace (what
        `gpufeed analyze` replays, to see why a run came out as it did)."""
        argv = [*prefix, sys.executable, "-m", "gpufeed", "agent", "--config", str(self.config)]
        if record is not None:
            argv += ["--record", str(record)]
        argv += ["--web.listen-address", "127.0.0.1:0", "--instance", self.instance]
        log = open(self.run_dir / "agent.log", "wb")  # noqa: SIM115 - the child holds it
        try:
            self.proc = subprocess.Popen(
                dies_with_runner(argv), stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.run_dir / "agent.log").read_text(errors="replace")[-400:]
                raise RuntimeError(f"the agent exited with {self.proc.returncode}: {tail}")
            port = listening_port(self.proc.pid)
            if port is not None and self.socket.exists():
                self.url = f"http://127.0.0.1:{port}"
                return
            time.sleep(0.1)
        raise RuntimeError(f"the agent did not listen within {timeout_s:g} s")

    def under_run(self, argv: list[str]) -> list[str]:
        """`argv` unmodified under `gpufeed run`, reporting to this agent's SDK socket."""
        return [sys.executable, "-m", "gpufeed", "run", "--socket", str(self.socket), "--", *argv]

    def windows(self) -> dict[str, Any]:
        """/api/windows: {"windows": [closed...], "open": [...]}."""
        with urllib.request.urlopen(self.url + "/api/windows?limit=1000", timeout=5) as r:
            data: dict[str, Any] = json.loads(r.read())
        return data

    def stop(self) -> None:
        """SIGTERM: the agent logs the windows still open, closed at its last sample."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def logged_windows(self) -> list[dict[str, Any]]:
        out = []
        if self.windows_log.exists():
            for line in self.windows_log.read_text().splitlines():
                if line.strip():
                    out.append(json.loads(line))
        return out
