"""The job of the busy-is-not-working check (bench/gpu_busy_waiting.py): plain PyTorch on a
GPU, run unmodified under `gpufeed run`.

Two phases of training-shaped steps (forward, backward, optimizer step, then the device work
the host waits for):
- healthy: dense bf16 matrix products, every SM busy;
- waiting: one spin kernel per step (`torch.cuda._sleep`, a <<<1,1>>> kernel), the shape of
  a collective kernel that spins while it waits for a slow peer: NVML utilization stays 1.0
  (a kernel is running the whole time) while SM activity falls to about 1/132.

Writes --phases: {"healthy": [start, end], "waiting": [start, end]} in unix seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn


def spin_cycles_for(seconds: float) -> int:
    """Clock cycles of `torch.cuda._sleep` that last about `seconds` on this GPU."""
    probe = 20_000_000
    torch.cuda._sleep(probe)  # the first launch loads the module
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    per_cycle = (time.perf_counter() - t0) / probe
    return max(1, round(seconds / per_cycle))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy-s", type=float, required=True)
    ap.add_argument("--waiting-s", type=float, required=True)
    ap.add_argument("--phases", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 16)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=dev)
    y = torch.randint(0, 16, (256,), device=dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    cycles = spin_cycles_for(0.05)
    phases: dict[str, list[float]] = {}
    for name, seconds in (("healthy", args.healthy_s), ("waiting", args.waiting_s)):
        start = time.time()
        while time.time() - start < seconds:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if name == "healthy":
                for _ in range(40):
                    a @ a
            else:
                torch.cuda._sleep(cycles)
            torch.cuda.synchronize()
        phases[name] = [start, time.time()]
    with open(args.phases, "w") as f:
        json.dump(phases, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
