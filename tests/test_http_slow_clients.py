"""Slow clients must not take /metrics away (issue 11: 1,100 slowloris connections under
the systemd fd limit of 1024 left a good client 0 of 8 scrapes and flooded the log).

A real process of every service (the agent, the fleet, the scheduler: one web layer) with
RLIMIT_NOFILE 1024, a real swarm of slow clients in another process on 127.0.0.1, and a
good client that scrapes over fresh connections meanwhile.
The swarm size is a parameter: GPUFEED_TEST_SLOW_CLIENTS (default 2000).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from http_helpers import SERVICES, percentile, service_process, timed_scrapes, wait_until_serving

SLOW_CLIENTS = int(os.environ.get("GPUFEED_TEST_SLOW_CLIENTS", "2000"))
FD_LIMIT = 1024
SCRAPES = 100
SWARM = Path(__file__).parent / "helpers" / "slow_clients.py"


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_good_client_is_served_while_slow_clients_hold_more_connections_than_fds(
    tmp_path: Path, kind: str
) -> None:
    with service_process(kind, tmp_path, nofile=FD_LIMIT) as agent:
        wait_until_serving(agent)
        swarm = subprocess.Popen(
            [sys.executable, str(SWARM), "127.0.0.1", str(agent.port), str(SLOW_CLIENTS), "2"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert swarm.stdout is not None
            ready = swarm.stdout.readline()
            assert ready.startswith("ready"), ready
            latencies, errors = timed_scrapes(agent.port, SCRAPES, pause_seconds=0.03)
        finally:
            stats, _ = swarm.communicate(input="", timeout=30)
        log = agent.log()
        p50, p99 = percentile(latencies or [0], 50), percentile(latencies or [0], 99)
        figures = (
            f"{kind}: {SLOW_CLIENTS} slow clients ({ready.strip()}; {stats.strip()}): "
            f"{len(latencies)}/{SCRAPES} scrapes answered, p50 {p50 * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, agent log {len(log.splitlines())} lines"
        )
        print(figures)
        assert agent.proc.poll() is None, f"{kind} died: {log[-2000:]}"
        assert not errors, f"{figures}; errors: {errors[:5]}"
        assert p99 < 0.100, figures
        # Rate-limited: a few lines about the pressure, not thousands per second.
        assert len(log.splitlines()) < 40, f"{figures}\n{log[-3000:]}"
