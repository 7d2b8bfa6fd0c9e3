"""Correlator speed: offline samples per second end to end, live milliseconds per sample.

Offline: a generated multi-node trace file is analysed by `gpufeed analyze`'s code path
(read, parse, analyse, write JSON lines to a file), with one and with two worker
processes. The reference measured in the same run is the time Python needs merely to
read the file line by line, so the ratio shows how close to "reading it" the analysis is.
Live: an 8-GPU node's samples are replayed as snapshots through `CorrelatorProcessor`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from bench import correlator_scenarios as cs
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator import analyze_cmd
from gpufeed.trace.replay import snapshots_from_trace


def offline(path: str, jobs: int, out: str) -> float:
    import argparse as ap

    p = ap.ArgumentParser()
    sp = p.add_subparsers()
    analyze_cmd.register(sp)
    args = p.parse_args(["analyze", path, "--jobs", str(jobs), "--output", out])
    t0 = time.perf_counter()
    rc = args.func(args)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"analyze failed with {rc}")
    return dt


def read_lines(path: str) -> float:
    t0 = time.perf_counter()
    n = 0
    with open(path, encoding="utf-8") as f:
        for _ in f:
            n += 1
    return time.perf_counter() - t0


def live(text: str) -> tuple[float, float, int]:
    from gpufeed.correlator.feeds.live import CorrelatorProcessor

    snaps = snapshots_from_trace(text)
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), interval_seconds=5.0)
    times = []
    for s in snaps:
        t0 = time.perf_counter()
        proc.process(s)
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.mean(times) * 1e3, times[int(len(times) * 0.99)] * 1e3, len(snaps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    text, _ = cs.build(a.seed, nodes=a.nodes, hours=a.hours, interval=5.0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.om")
        with open(path, "w") as f:
            f.write(text)
        samples = sum(1 for line in text.splitlines() if line and line[0] != "#")
        size_mb = os.path.getsize(path) / 1e6
        ref = read_lines(path)
        print(f"offline: {samples} samples, {size_mb:.0f} MB, {a.nodes} nodes x {a.hours} h")
        print(f"  reference (read the file line by line): {ref:.2f} s")
        for jobs in (1, 2):
            dt = offline(path, jobs, os.path.join(d, f"out{jobs}.jsonl"))
            print(
                f"  gpufeed analyze --jobs {jobs}: {dt:.2f} s = {samples / dt / 1e6:.2f} M samples/s"
                f" ({dt / ref:.1f}x the reference)"
            )
    one_node, _ = cs.single("data_loading", "saturated", seed=a.seed, minutes=60)
    mean_ms, p99_ms, n = live(one_node)
    print(f"live: 8 GPUs, {n} snapshots: {mean_ms:.3f} ms mean, {p99_ms:.3f} ms p99 per sample")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (the machine is shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
