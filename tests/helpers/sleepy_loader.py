"""An unmodified PyTorch training script (it imports nothing of gpufeed) whose Dataset
sleeps in __getitem__ for a while: issue 23's first stall, a slow input pipeline that no
node counter shows. Its samples are in memory (it reads no storage once imported).

It trains `--healthy` seconds, then each item sleeps `--item-sleep` seconds for `--stall`
seconds, then trains `--after` seconds more and exits. It writes `stall-begin` and
`stall-end` files into `--marks` when it enters and leaves the stall (the test starts and
stops another tenant's disk reader by them). The DataLoader's workers are forked after the
start time is fixed, so they and the main process share one clock (time.time).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sleepy(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, begin: float, end: float, item_sleep: float) -> None:
        self.x = torch.randn(4096, 64)
        self.begin, self.end, self.item_sleep = begin, end, item_sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.begin <= time.time() < self.end:
            time.sleep(self.item_sleep)  # a remote fetch, a lock: nothing a node counter sees
        return self.x[i], i % 4


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", type=float, required=True)
    ap.add_argument("--stall", type=float, required=True)
    ap.add_argument("--after", type=float, required=True)
    ap.add_argument("--item-sleep", type=float, default=0.05)
    ap.add_argument("--marks", required=True)
    a = ap.parse_args()
    marks = Path(a.marks)
    torch.set_num_threads(1)
    start = time.time()
    begin, end = start + a.healthy, start + a.healthy + a.stall
    data = Sleepy(begin, end, a.item_sleep)
    loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while time.time() < end + a.after:
        for x, y in loader:
            now = time.time()
            if now >= begin and not (marks / "stall-begin").exists():
                (marks / "stall-begin").touch()
            if now >= end and not (marks / "stall-end").exists():
                (marks / "stall-end").touch()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.05)  # the device's share of the step (a CPU-only stand-in)
            if now >= end + a.after:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
