"""A tiny but real PyTorch training run, used by tests/test_jobs_real.py.

It reads its samples from files (one file per sample) through a DataLoader with a worker
process, trains a two-layer MLP on the CPU, saves checkpoints with torch.save every few
steps, and measures its own loop the plain way: time blocked in next() (data wait), time in
torch.save (checkpoint), the rest of the loop body (compute). It writes those figures as
JSON, then waits for its stdin to close, so that the test can look at the live process.

--mode sdk uses gpufeed's SDK (job.track, job.checkpoint, job.epoch); --mode plain does not
import gpufeed at all (it runs under `gpufeed run`, possibly where gpufeed is not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 512


class FileDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with open(self.files[i], "rb", buffering=0) as f:
            raw = f.read()
        x = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(-1, FEATURES)
        return torch.nan_to_num(x).clamp(-10, 10).mean(0), i % 4


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("sdk", "plain"), required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ckpt-every", type=int, default=6)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    files = sorted(os.path.join(args.data, f) for f in os.listdir(args.data))
    loader = DataLoader(FileDataset(files), batch_size=4, shuffle=True, num_workers=1)
    model = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    job: Any = None
    if args.mode == "sdk":
        import gpufeed

        job = gpufeed.Job("tiny-mlp")

    wait = compute = ckpt = 0.0
    steps = 0
    saved: list[str] = []
    clock = time.perf_counter
    for _epoch in range(args.epochs):
        t0 = clock()
        it = iter(job.track(loader) if job is not None else loader)
        while True:
            try:
                x, y = next(it)
            except StopIteration:
                wait += clock() - t0
                break
            t1 = clock()
            # gpufeed counts the process's wait for its first batch (DataLoader workers
            # starting) as start-up, not data_wait: measure the same thing
            wait += (t1 - t0) if steps else 0.0
            for _ in range(16):  # enough arithmetic that compute is not lost in the noise
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
            steps += 1
            c = 0.0
            if steps % args.ckpt_every == 0:
                path = os.path.join(args.ckpt, f"ckpt-{steps:05d}.pt")
                c0 = clock()
                with job.checkpoint(path) if job is not None else nullcontext():
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
                c = clock() - c0
                ckpt += c
                saved.append(path)
            t0 = clock()
            compute += t0 - t1 - c
        if job is not None:
            job.epoch()

    try:
        import gpufeed

        gpufeed_importable = True
    except ImportError:
        gpufeed_importable = False
    result = {
        "pid": os.getpid(),
        "steps": steps,
        "data_wait": wait,
        "compute": compute,
        "checkpoint": ckpt,
        "checkpoints": len(saved),
        "checkpoint_bytes": sum(os.path.getsize(p) for p in saved),
        "dropped": job.events_dropped if job is not None else None,
        "gpufeed_importable": gpufeed_importable,
        "instrumented": "_gpufeed_torch" in sys.modules,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, args.out)
    sys.stdin.read()  # stay alive until the test has looked at this process
    if job is not None:
        job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
