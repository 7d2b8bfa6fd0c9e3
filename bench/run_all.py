"""`make bench`: every benchmark in bench/, one after the other, each printing its figures.

Each benchmark measures a reference in the same run and reports ratios against it; the
figures land in docs/benchmarks.md by hand, with the command that produced them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    ("agent vs node_exporter", ["agent_overhead", "--seconds", "60"]),
    ("GPU sampling cost", ["gpu_sampling"]),
    ("simulated node sampling cost", ["simulated_node"]),
    ("SDK event cost", ["sdk_event_cost"]),
    ("correlator speed", ["correlator_speed"]),
    ("fleet cycle", ["fleet_cycle"]),
    ("fleet cycle, split in two by --match", ["fleet_cycle", "--sizes", "256", "--split", "2"]),
    ("fleet service through a TSDB outage", ["fleet_outage"]),
    ("discovery above the TSDB's series limit", ["tsdb_limits"]),
    ("culprit accuracy (job level)", ["culprit_accuracy"]),
    # streamed analyze over 16/64/256 simulated nodes x 24 h in VictoriaMetrics: about an
    # hour on 2 shared cores (`python -m bench.analyze_scale --sizes 16,64` is shorter)
    ("analyze --prometheus at scale", ["analyze_scale"]),
]


def main() -> int:
    failed = []
    for title, argv in BENCHES:
        if not (HERE / f"{argv[0]}.py").exists():  # a benchmark that cannot run has failed
            print(f"== {title}: bench/{argv[0]}.py not found")
            failed.append(title)
            continue
        print(f"== {title}: python -m bench.{' '.join(argv)}", flush=True)
        cmd = [sys.executable, "-m", f"bench.{argv[0]}", *argv[1:]]
        if subprocess.run(cmd, cwd=HERE.parent).returncode != 0:
            failed.append(title)
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
