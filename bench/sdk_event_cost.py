"""What one SDK event costs the training loop, against a bare socket send in the same run.

The agent's real SDK server runs in a separate process (as it does in production) on a
temporary socket. Each event is timed on its own with perf_counter_ns, paced a little apart
so the agent drains its queue (a full queue makes sends fail fast, which would flatter the
SDK). Reported: the median and 90th percentile per event, and the ratio to the reference,
`socket.send(<datagram of the same size>, MSG_DONTWAIT)` on a connected Unix socket.
The issue's budget is a median of at most 10 microseconds per event; the script exits 1 if
an SDK case is over it (the bare send is the reference, not held to it).

    python -m bench.sdk_event_cost [--events 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpufeed import sdk

BUDGET_NS = 10_000

SERVER = """
import sys, time
from gpufeed.jobs.sdk_server import SdkServer
srv = SdkServer(sys.argv[1], max_jobs=64, max_messages_per_second=10_000_000, grace_seconds=60)
srv.start()
print("ready", flush=True)
sys.stdin.read()
srv.stop()
"""


def pace(gap_ns: int) -> None:
    end = time.perf_counter_ns() + gap_ns
    while time.perf_counter_ns() < end:
        pass


def measure(fn: Callable[[], object], n: int, gap_ns: int) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
        pace(gap_ns)
    return out


def summary(samples: list[int]) -> dict[str, float]:
    """Median and p90 per event, and the mean: what the loop pays on average, the SDK's
    periodic flush (one send for many events) included."""
    q = statistics.quantiles(samples, n=10)
    return {
        "median_ns": statistics.median(samples),
        "p90_ns": q[8],
        "mean_ns": statistics.fmean(samples),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--gap-us", type=float, default=100.0, help="pause between events")
    args = ap.parse_args()
    n, gap = args.events, int(args.gap_us * 1000)

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "sdk.sock")
        env = {**os.environ, "PYTHONPATH": str(Path(sdk.__file__).parents[1])}
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, path],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        try:
            job = sdk.Job("bench", socket=path)
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            raw.connect(path)
            datagram = b"\0" * (sdk.HEADER.size + len(job._suffix))

            bare_dropped = [0]

            def bare() -> None:
                try:
                    raw.send(datagram, socket.MSG_DONTWAIT)
                except BlockingIOError:  # as the SDK does: a full queue drops the event
                    bare_dropped[0] += 1

            def phase() -> None:
                with job.phase("eval"):
                    pass

            items = iter(job.track(range(10 * n)))

            results = {
                "reference_bare_send": summary(measure(bare, n, gap)),
                "job_epoch": summary(measure(job.epoch, n, gap)),
                "job_phase_block": summary(measure(phase, n, gap)),
                "job_track_step": summary(measure(lambda: next(items), n, gap)),
            }
            nobody = sdk.Job("bench", socket=str(Path(tmp) / "nobody.sock"))
            results["job_epoch_agent_absent"] = summary(measure(nobody.epoch, n, gap))
            dropped = job.events_dropped
            raw.close()
            job.close()
            if server.poll() is not None:  # the receiving end died: the figures mean nothing
                print(f"sdk_event_cost: FAILED: the SDK server exited ({server.returncode})")
                return 1
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=30)

    ref = results["reference_bare_send"]["median_ns"]
    report = {
        "events_per_case": n,
        "events_dropped_with_agent": dropped,
        "reference_dropped": bare_dropped[0],
        "budget_median_ns": BUDGET_NS,
        "cases": {k: {**v, "ratio_to_bare_send": v["median_ns"] / ref} for k, v in results.items()},
    }
    ok = all(v["median_ns"] <= BUDGET_NS for k, v in results.items() if k.startswith("job_"))
    report["within_budget"] = ok
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "sdk_event_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    for name, v in report["cases"].items():
        print(
            f"{name:24s} median {v['median_ns'] / 1000:6.2f} us  p90 {v['p90_ns'] / 1000:6.2f} us"
            f"  mean {v['mean_ns'] / 1000:6.2f} us  median x{v['ratio_to_bare_send']:.2f} bare send"
        )
    print(
        f"dropped with the agent present: SDK {dropped}, bare {bare_dropped[0]} of {n} each;"
        f" within the 10 us budget: {ok}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
