"""`python -m bench.fleet_outage`: a TSDB outage under `gpufeed fleet`, measured: the same
backfill of `--cycles` cycles over a simulated fleet (bench/fleet_cycle.py's) run twice
against one real VictoriaMetrics, once undisturbed (the reference) and once with the
VictoriaMetrics stopped for `--down-seconds` right after the `--down-after`-th cycle and
started again on the same port with the same data.

The run with the outage must exit 0 (no crash), and its windows log and ledger must be the
reference's byte for byte (no window lost or repeated), else the benchmark fails (exit 1).
Figures: how long the TSDB was down, how long after it was back the service finished its
next cycle (the retry backoff: 1 s doubling to 30 s), and how long the cycles after the
outage took against the same cycles of the reference (catching up: a cycle fetches only
its own new instants, so the missed cycles cost what they would have cost).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bench.analyze_scale import GPUFEED, _base, _job_suffix, _lines
from bench.fleet_cycle import CYCLE_LINE
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.fleet.timing import CycleTiming
from gpufeed.simulate.tracegen import DEFAULT_START_UNIX, instance_name, simulate_node
from tests.tsdb_vm import RestartableVictoria
from tests.victoria import import_lines, settle


def _stderr_lines(proc: subprocess.Popen[str], out: list[tuple[float, str]]) -> None:
    """Each line the service writes on stderr, with when it was read (monotonic seconds)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        out.append((time.monotonic(), line.rstrip("\n")))


def _backfill(argv: list[str]) -> tuple[subprocess.Popen[str], list[tuple[float, str]]]:
    proc = subprocess.Popen([*GPUFEED, *argv], stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    threading.Thread(target=_stderr_lines, args=(proc, lines), daemon=True).start()
    return proc, lines


def _cycle_times(lines: list[tuple[float, str]]) -> list[tuple[float, float]]:
    """(when read, wall s) of each completed cycle's line."""
    return [(t, float(m[4])) for t, x in lines if (m := CYCLE_LINE.search(x))]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--base-nodes", type=int, default=16, help="distinct simulated nodes")
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--down-after", type=int, default=4, help="cycles before the outage")
    ap.add_argument("--down-seconds", type=float, default=60.0)
    ap.add_argument("--step", type=float, default=15.0)
    ap.add_argument("--interval", type=float, default=60.0)
    ap.add_argument("--lookback", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = ap.parse_args(argv)
    if not 0 < args.down_after < args.cycles:
        ap.error("--down-after must be between 0 and --cycles")
    B = args.base_nodes
    timing = CycleTiming(
        args.interval, args.lookback, args.step, 0.0, WindowParams().merge_gap_seconds
    )
    first = timing.first_after(DEFAULT_START_UNIX + args.lookback)
    last = first + (args.cycles - 1) * args.interval
    duration = last - DEFAULT_START_UNIX + args.step
    bases = [
        _base(simulate_node(i, duration_s=duration, step_s=args.step, seed=args.seed), args.step)
        for i in range(B)
    ]

    def fleet_argv(url: str, log: Path) -> list[str]:
        return [
            "fleet",
            f"--prometheus.url={url}",
            f"--fleet.interval={args.interval:g}",
            f"--fleet.lookback={args.lookback:g}",
            f"--fleet.step={args.step:g}",
            "--fleet.settle=0",
            f"--fleet.start={first - timing.delay_seconds - args.interval:.0f}",
            f"--fleet.until={last:.0f}",
            f"--fleet.windows-log={log}",
            "--web.listen-address=127.0.0.1:0",
        ]

    with tempfile.TemporaryDirectory(prefix="gpufeed-fleet-outage-") as tmp:
        d = Path(tmp)
        vm = RestartableVictoria(d / "vm")
        vm.start()
        try:
            import_lines(
                vm.url,
                (
                    line
                    for i in range(args.nodes)
                    for line in _lines(bases[i % B], instance_name(i), "s0", _job_suffix(i, B))
                ),
            )
            settle(vm.url)
            ref_log, log = d / "reference.jsonl", d / "outage.jsonl"
            proc, ref_lines = _backfill(fleet_argv(vm.url, ref_log))
            ref_rc = proc.wait()
            proc, lines = _backfill(fleet_argv(vm.url, log))
            while len(_cycle_times(lines)) < args.down_after and proc.poll() is None:
                time.sleep(0.05)
            vm.stop()
            down = time.monotonic()
            time.sleep(args.down_seconds)
            vm.start()  # the same port, the same data
            up = time.monotonic()
            rc = proc.wait()
            done = time.monotonic()
        finally:
            vm.stop()
        ref = _cycle_times(ref_lines)
        got = _cycle_times(lines)
        failures = [x for _, x in lines if "failed, retrying" in x]
        after = [(t, w) for t, w in got if t > up]
        problem = ""
        if ref_rc != 0 or rc != 0:
            problem = f"exit status {ref_rc} (reference), {rc} (outage)"
        elif len(ref) != args.cycles or len(got) != args.cycles:
            problem = f"{len(ref)} and {len(got)} cycles reported, {args.cycles} asked"
        elif log.read_bytes() != ref_log.read_bytes():
            problem = "the windows log differs from the reference's"
        elif Path(f"{log}.state.json").read_bytes() != Path(f"{ref_log}.state.json").read_bytes():
            problem = "the ledger and cursor differ from the reference's"
        elif not failures or not after:
            problem = "the outage was not seen: no failed cycle, or nothing after it"
        missed = len(after)
        figures = {
            "nodes": args.nodes,
            "cycles": args.cycles,
            "down_seconds": round(up - down, 1),
            "failed_cycle_lines": failures[:3],
            "first_cycle_after_restart_seconds": round(after[0][0] - up, 1) if after else None,
            "cycles_after_restart": missed,
            "their_wall_seconds": round(sum(w for _, w in after), 2),
            "reference_wall_seconds_same_cycles": round(sum(w for _, w in ref[-missed:]), 2)
            if missed
            else None,
            "restart_to_done_seconds": round(done - up, 1),
            "windows": log.read_text().count("\n") if log.exists() else 0,
            "same_log_and_ledger_as_reference": not problem,
        }
    print(
        f"{args.nodes} nodes, {args.cycles} cycles; VictoriaMetrics down "
        f"{figures['down_seconds']} s after cycle {args.down_after}; the service's first cycle "
        f"{figures['first_cycle_after_restart_seconds']} s after it was back; the "
        f"{missed} cycles after the restart took {figures['their_wall_seconds']} s "
        f"(undisturbed: {figures['reference_wall_seconds_same_cycles']} s); done "
        f"{figures['restart_to_done_seconds']} s after the restart; exit status {rc}; "
        f"{figures['windows']} windows; log and ledger the undisturbed run's: {not problem}",
        flush=True,
    )
    for x in failures[:3]:
        print("  " + x[:300])
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    if problem:
        print("FAILED: " + problem)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
