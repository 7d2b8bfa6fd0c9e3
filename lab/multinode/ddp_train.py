"""One rank of a real data-parallel training job: torch.distributed (gloo) DDP on the CPU.

Run unmodified under `gpufeed run` on each "node" of the multi-node lab (lab/multinode/), one
rank per node, rendezvous through the env:// variables the launcher sets (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE). It imports nothing from gpufeed: what the agent learns, it
learns from `gpufeed run`'s instrumentation of torch.

Per step: the input workers (a DataLoader with worker processes) read one file per sample
from the node's data tier with O_DIRECT, so the page cache never hides a throttled tier;
forward and backward of a small MLP whose gradients DDP all-reduces over the veth link (the
gradient size decides how much a rate-limited link slows a step); then a wait of
`--device-seconds` that stands in for the device (the host waiting for the GPU).

Each step's own timing goes to `--steps-out` as JSON lines (unix time at the step's end,
data wait, the rest of the step), flushed per step: the lab's ground truth for what the
fault did to this rank, independent of gpufeed. Runs until `--duration-s` has passed
(all ranks agree on when to stop through the first step's all-reduce of the start time).
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

FEATURES = 256
ALIGN = 4096  # O_DIRECT wants the buffer, the offset and the length aligned to the block


def read_direct(path: str, nbytes: int) -> bytes:
    """The file's first `nbytes` read with O_DIRECT into a page-aligned buffer."""
    buf = mmap.mmap(-1, nbytes)  # anonymous mappings are page-aligned
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        got = os.readv(fd, [buf])
    finally:
        os.close(fd)
    data = bytes(buf[:got])
    buf.close()
    return data


class TierFiles(Dataset[tuple[torch.Tensor, int]]):
    """One sample per file on the data tier."""

    def __init__(self, files: list[str], sample_bytes: int, preprocess_s: float) -> None:
        self.files = files
        self.sample_bytes = sample_bytes
        self.preprocess_s = preprocess_s

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        raw = read_direct(self.files[i], self.sample_bytes)
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float()[:FEATURES] / 255.0
        # decode/augment stand-in: this much of the worker's own CPU time, so that a CPU
        # quota on the rank stretches it (a sleep would not)
        spent = time.process_time() + self.preprocess_s
        while time.process_time() < spent:
            x = (x * 1.0001).clamp(0, 1)
        return x, i % 4


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="directory of sample files on the data tier")
    ap.add_argument("--sample-bytes", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--preprocess-ms", type=float, default=0.0, help="CPU per sample")
    ap.add_argument("--hidden", type=int, default=512, help="MLP width: sets the gradient size")
    ap.add_argument("--device-seconds", type=float, default=0.05)
    ap.add_argument("--duration-s", type=float, required=True)
    ap.add_argument("--timeout-s", type=float, default=120.0, help="gloo collective timeout")
    ap.add_argument("--steps-out", required=True)
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=args.timeout_s)
    )  # env:// rendezvous
    rank = dist.get_rank()
    files = sorted(os.path.join(args.data, f) for f in os.listdir(args.data))
    loader = DataLoader(
        TierFiles(files, args.sample_bytes, args.preprocess_ms / 1000),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    model = DistributedDataParallel(
        nn.Sequential(
            nn.Linear(FEATURES, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, 4),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    # Every rank stops after the same number of steps' worth of time: rank 0's start time.
    start = torch.tensor([time.time()], dtype=torch.float64)
    dist.broadcast(start, src=0)
    stop_at = float(start.item()) + args.duration_s
    steps = 0
    with open(args.steps_out, "a", buffering=1) as out:
        while True:
            it = iter(loader)
            t0 = time.perf_counter()
            for x, y in it:
                t1 = time.perf_counter()
                opt.zero_grad()
                loss: Any = loss_fn(model(x), y)
                loss.backward()  # DDP all-reduces the gradients here, over the link
                opt.step()
                time.sleep(args.device_seconds)  # the device stand-in
                t2 = time.perf_counter()
                steps += 1
                out.write(
                    json.dumps(
                        {
                            "t": time.time(),
                            "rank": rank,
                            "step": steps,
                            "data_wait_s": t1 - t0,
                            "rest_s": t2 - t1,
                        }
                    )
                    + "\n"
                )
                if _all_done(time.time() >= stop_at):
                    dist.destroy_process_group()
                    return 0
                t0 = time.perf_counter()  # the stop vote is not data wait


def _all_done(mine: bool) -> bool:
    """Whether any rank has reached the end time (so that all leave on the same step)."""
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
