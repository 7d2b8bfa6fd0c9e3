"""Real-GPU check, driven by bench/gpu-smoke.sh (which starts the agent on NVML).

Runs a PyTorch matmul load on one GPU, then a phase where that GPU mostly waits (sleeps
between small launches), scrapes the agent's /metrics every second throughout, and prints
per phase:
- the mean gpufeed_gpu_utilization_ratio (and sm_active where the GPU has GPM), per GPU;
- the agent's own GPU collector duration (gpufeed_collector_duration_seconds{collector="gpu"});
- the per-sample NVML cost: NvmlBackend.sample() timed directly, once a second, in a separate
  process (so the load's Python thread does not skew it through the GIL).

The first --settle seconds of each phase are left out of the means: NVML's utilization is
an average over the driver's last sample period, so it lags a phase change.

Exit status: 0 when the load phase reads busier than the waiting phase by the margins below,
1 when it does not, 2 when this machine cannot run the check (no CUDA, agent not answering).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOAD_MIN_UTILIZATION = 0.8
WAIT_MAX_UTILIZATION = 0.5


@dataclass
class Scrape:
    t: float
    utilization: dict[str, float] = field(default_factory=dict)  # uuid -> ratio
    sm_active: dict[str, float] = field(default_factory=dict)
    collector_seconds: float | None = None


def parse(text: str, t: float) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    s = Scrape(t)
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            uuid = sample.labels.get("uuid", sample.labels.get("gpu", ""))
            if sample.name == "gpufeed_gpu_utilization_ratio":
                s.utilization[uuid] = sample.value
            elif sample.name == "gpufeed_gpu_sm_active_ratio":
                s.sm_active[uuid] = sample.value
            elif (
                sample.name == "gpufeed_collector_duration_seconds"
                and sample.labels.get("collector") == "gpu"
            ):
                s.collector_seconds = sample.value
    return s


def scraper(url: str, stop: threading.Event, out: list[Scrape], errors: list[str]) -> None:
    while not stop.is_set():
        t = time.time()
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                out.append(parse(resp.read().decode(), t))
        except OSError as exc:
            errors.append(f"{time.strftime('%H:%M:%S')} scrape failed: {exc}")
        stop.wait(max(0.0, 1.0 - (time.time() - t)))


def nvml_cost_main(seconds: float) -> int:
    """Child process: time NvmlBackend.sample() once a second; one JSON line per sample."""
    sys.path.insert(0, str(ROOT / "exporter"))
    from gpufeed.gpu.nvml import NvmlBackend

    backend = NvmlBackend(watch_xid=False)
    try:
        backend.sample()  # first call probes what each GPU supports
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            backend.sample()
            ms = (time.perf_counter() - t0) * 1000.0
            print(
                json.dumps({"t": time.time(), "ms": ms, "gpus": len(backend.devices())}), flush=True
            )
            time.sleep(max(0.0, 1.0 - ms / 1000.0))
    finally:
        backend.close()
    return 0


def read_costs(proc: subprocess.Popen[str], out: list[tuple[float, float]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            d = json.loads(line)
            out.append((float(d["t"]), float(d["ms"])))
        except (ValueError, KeyError):
            continue


def run_load(seconds: float, phase: list[tuple[str, float, float]]) -> None:
    import torch

    dev = torch.device("cuda:0")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
    torch.cuda.synchronize()
    start = time.time()
    while time.time() - start < seconds:
        for _ in range(16):
            c = a @ b
        torch.cuda.synchronize()
    del c
    phase.append(("load", start, time.time()))


def run_wait(seconds: float, phase: list[tuple[str, float, float]]) -> None:
    import torch

    dev = torch.device("cuda:0")
    x = torch.randn(256, 256, device=dev)
    start = time.time()
    while time.time() - start < seconds:
        y = x @ x  # a small launch, then the GPU waits (as for data)
        torch.cuda.synchronize()
        time.sleep(0.1)
    del y
    phase.append(("wait", start, time.time()))


def load_gpu_uuid(nvml_uuids: list[str]) -> str | None:
    """The NVML UUID of torch's cuda:0 (CUDA_VISIBLE_DEVICES may reorder indices)."""
    import torch

    try:
        torch_uuid = str(torch.cuda.get_device_properties(0).uuid)
    except (AttributeError, RuntimeError):
        return None
    for u in nvml_uuids:
        if u.removeprefix("GPU-") == torch_uuid.removeprefix("GPU-"):
            return u
    return None


def mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f}" if values else "absent"


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}" if values else "absent"


def report(
    phases: list[tuple[str, float, float]],
    scrapes: list[Scrape],
    costs: list[tuple[float, float]],
    errors: list[str],
    settle: float,
    find_load_gpu: Callable[[list[str]], str | None],
) -> int:
    """Prints the per-phase table and the verdict; returns the exit status."""
    for line in errors[:5]:
        print(line, file=sys.stderr)
    if not scrapes:
        print("gpu-smoke: no scrape of the agent succeeded", file=sys.stderr)
        return 2
    uuids = sorted({u for s in scrapes for u in s.utilization})
    print(f"scrapes: {len(scrapes)} (failed: {len(errors)}), NVML cost samples: {len(costs)}")
    header = f"{'phase':6} {'seconds':>7} {'scrapes':>7}  " + "  ".join(
        f"util[{u[:12]}]" for u in uuids
    )
    print(header + "  sm_active(load GPU)  agent_gpu_collector_ms(median)  nvml_sample_ms(median)")

    def within(name: str, start: float, end: float) -> list[Scrape]:
        return [s for s in scrapes if start + settle <= s.t < end]

    rows: dict[str, dict[str, float]] = {}
    for name, start, end in phases:
        inside = within(name, start, end)
        rows[name] = {
            u: statistics.fmean(vals)
            for u in uuids
            if (vals := [s.utilization[u] for s in inside if u in s.utilization])
        }
    load_row = rows.get("load", {})
    target = find_load_gpu(uuids) or max(load_row, key=lambda u: load_row[u], default="")
    for name, start, end in phases:
        inside = within(name, start, end)
        per_gpu = rows[name]
        sm = [s.sm_active[target] for s in inside if target in s.sm_active]
        coll = [s.collector_seconds * 1000 for s in inside if s.collector_seconds is not None]
        cost = [ms for t, ms in costs if start + settle <= t < end]
        print(
            f"{name:6} {end - start:7.1f} {len(inside):7d}  "
            + "  ".join(
                f"{per_gpu[u]:>18.3f}" if u in per_gpu else f"{'absent':>18}" for u in uuids
            )
            + f"  {mean(sm):>19}  {median(coll):>30}  {median(cost):>22}"
        )
    load = rows.get("load", {}).get(target, float("nan"))
    wait = rows.get("wait", {}).get(target, float("nan"))
    ok = load >= LOAD_MIN_UTILIZATION and wait <= WAIT_MAX_UTILIZATION
    print(
        f"verdict: {'PASS' if ok else 'FAIL'}: GPU {target}: load phase {load:.3f} "
        f"(want >= {LOAD_MIN_UTILIZATION}), waiting phase {wait:.3f} (want <= {WAIT_MAX_UTILIZATION})"
    )
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="the agent's /metrics URL")
    ap.add_argument("--load-seconds", type=float, default=30.0)
    ap.add_argument("--wait-seconds", type=float, default=30.0)
    ap.add_argument(
        "--settle", type=float, default=3.0, help="seconds left out after a phase change"
    )
    ap.add_argument("--nvml-cost", type=float, metavar="SECONDS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.nvml_cost is not None:
        return nvml_cost_main(args.nvml_cost)
    if not args.url:
        ap.error("--url is required")

    try:
        import torch
    except ImportError:
        print(
            "gpu-smoke: PyTorch is not installed; the load needs torch with CUDA", file=sys.stderr
        )
        return 2
    if not torch.cuda.is_available():
        print(
            "gpu-smoke: torch.cuda.is_available() is False (CPU-only torch build, or no GPU)",
            file=sys.stderr,
        )
        return 2
    print(f"gpu-smoke: load on cuda:0 = {torch.cuda.get_device_name(0)}", flush=True)

    total = args.load_seconds + args.wait_seconds + 5.0
    cost_proc = subprocess.Popen(
        [sys.executable, __file__, "--nvml-cost", str(total)], stdout=subprocess.PIPE, text=True
    )
    costs: list[tuple[float, float]] = []
    threading.Thread(target=read_costs, args=(cost_proc, costs), daemon=True).start()
    scrapes: list[Scrape] = []
    errors: list[str] = []
    stop = threading.Event()
    scrape_thread = threading.Thread(
        target=scraper, args=(args.url, stop, scrapes, errors), daemon=True
    )
    scrape_thread.start()
    phases: list[tuple[str, float, float]] = []
    try:
        run_load(args.load_seconds, phases)
        run_wait(args.wait_seconds, phases)
        time.sleep(1.5)
    finally:
        stop.set()
        scrape_thread.join(timeout=10)
        cost_proc.wait(timeout=total + 30)

    return report(phases, scrapes, costs, errors, args.settle, load_gpu_uuid)


if __name__ == "__main__":
    raise SystemExit(main())
