"""A user's own training script, the kind issue 23 ran unmodified under `gpufeed run`: plain
PyTorch on the CPU (a small MLP), a DataLoader over an in-memory Dataset, and one stall of
the input pipeline from `--stall-at` to `--stall-at + --stall-seconds` (seconds after the
first step), of one kind:

  sleep   `time.sleep(--item-seconds)` in `__getitem__` (a remote fetch, a lock: a wait no
          node counter shows), in the main process (`--workers 0` by default)
  burn    the same seconds of pure-Python CPU work per item in the loader's workers (a
          single-threaded decode), `--workers` of them (2 by default)

It imports nothing of gpufeed. It measures itself, independently of gpufeed: a {"start": t}
line at its first step, then one JSON line per step in --steps-log (`t` unix end, `w` the
seconds it waited for its batch, `s` the step's seconds), and {"stall": [t0, t1]} when the
stall ends, the script's own timestamps the harness (lab/parity.py) checks against.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 128


class Items(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random items; inside the stall each costs `item_seconds` of sleep or of CPU."""

    def __init__(self, n: int, kind: str, item_seconds: float, control: dict[str, float]) -> None:
        self.n, self.kind, self.item_seconds, self.control = n, kind, item_seconds, control

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0, t1 = self.control.get("t0", 0.0), self.control.get("t1", 0.0)
        now = time.time()
        if t0 and t0 <= now < t1:
            if self.kind == "sleep":
                time.sleep(self.item_seconds)
            else:
                _burn(self.item_seconds)
        g = torch.Generator().manual_seed(i)
        return torch.randn(FEATURES, generator=g), torch.randn(1, generator=g)


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=("sleep", "burn"), required=True)
    p.add_argument("--workers", type=int)
    p.add_argument("--stall-at", type=float, required=True, help="seconds after the first step")
    p.add_argument("--stall-seconds", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True, help="total seconds of training")
    p.add_argument("--item-seconds", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=16)
    # compute per step: with 2 input workers on a loaded 2-core host, 8 passes left the
    # healthy job waiting for input 30-47% of the time (never healthy); 32 keep it under 10%
    p.add_argument("--passes", type=int, default=32, help="training passes over each batch")
    p.add_argument("--steps-log", required=True)
    a = p.parse_args(argv)
    workers = a.workers if a.workers is not None else (0 if a.kind == "sleep" else 2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 1024), nn.ReLU(), nn.Linear(1024, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # the stall's instants are fixed before the workers fork, so that they see them too
    start = time.time() + 1.0
    control = {"t0": start + a.stall_at, "t1": start + a.stall_at + a.stall_seconds}
    loader = DataLoader(
        Items(10**9, a.kind, a.item_seconds, control),
        batch_size=a.batch,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    with open(a.steps_log, "w") as log:
        _train(model, opt, loader, a.passes, (start, start + a.seconds), log)
        log.write(json.dumps({"stall": [control["t0"], control["t1"]]}) + "\n")
    return 0


def _train(
    model: nn.Module, opt: Any, loader: Any, passes: int, span: tuple[float, float], log: Any
) -> None:
    start, end = span
    while time.time() < start:
        time.sleep(0.01)
    log.write(json.dumps({"start": time.time()}) + "\n")
    loss_fn = nn.MSELoss()
    prev = time.time()
    for x, y in loader:
        got = time.time()
        for _ in range(passes):  # the step's compute: several passes over the batch
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        now = time.time()
        log.write(json.dumps({"t": now, "w": got - prev, "s": now - prev}) + "\n")
        prev = now
        if now >= end:
            break


if __name__ == "__main__":
    raise SystemExit(main())
