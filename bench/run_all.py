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
    ("agent vs node_exporter", ["agent_overhead.py", "--seconds", "60"]),
    ("GPU sampling cost", ["gpu_sampling.py"]),
    ("simulated node sampling cost", ["simulated_node.py"]),
    ("SDK event cost", ["sdk_event_cost.py"]),
    ("correlator speed", ["correlator_speed.py"]),
]


def main() -> int:
    failed = []
    for title, argv in BENCHES:
        script = HERE / argv[0]
        if not script.exists():  # a benchmark that cannot run has failed, not passed
            print(f"== {title}: {argv[0]} not found")
            failed.append(title)
            continue
        print(f"== {title}: python bench/{' '.join(argv)}", flush=True)
        if subprocess.run([sys.executable, str(script), *argv[1:]]).returncode != 0:
            failed.append(title)
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
