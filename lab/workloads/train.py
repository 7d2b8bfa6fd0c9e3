"""The lab's training program: plain PyTorch, the way people write it.

Input workers (DataLoader num_workers) read one file per sample with O_DIRECT (so that the
page cache cannot hide a slow tier), or one object per sample from an S3 bucket with boto3
(`--data s3://BUCKET/PREFIX --s3-endpoint URL`), and do some CPU work on it (the decode/augment
stand-in); the loop trains a small MLP and then waits `--device-seconds` per step: without
a GPU that wait stands in for the device (the host waiting on the device's kernels), so the
input pipeline, storage and CPUs are real and the device is the only stand-in. With
`--device cuda` (a GPU host) the model and batches live on the GPU and the same seconds per
step are real kernels (bf16 matrix products, calibrated at start, then synchronised), so NVML
sees the GPU busy while it steps and idle while it waits. Checkpoints are torch.save to a
file on a tier.

Start-up: with `--weights` (a torch.save'd file), the program first makes its CUDA context
(on a GPU: NVML lists the process, so the job holds the GPU from then on), starts its input
workers, and then torch.load's the weights as the last thing before its first step: the
scenario's clock starts there (a {"start": t} line in the step log), so a slow tier is the
only thing between that and the first step. `--hold-seconds`: after its loop the process
stays alive that long holding its devices (the model, the weights, the CUDA context), the
way a finished job whose allocation is not released does (`idle`).

--mode plain imports nothing of gpufeed: it is run unmodified under `gpufeed run`.
--mode sdk reports through gpufeed's SDK (Job.track, Job.checkpoint, Job.load; Job.add_io
for the reads of an s3:// dataset), the other variant.

It measures itself, independently of gpufeed: one JSON line per step in --steps-log
(`t` unix end, `s` the step's seconds, `c` compute: loop body and device wait, `w` data
wait, `k` checkpoint seconds), which the lab uses to check that a fault really slowed it.
A control file (--control, JSON, re-read when it changes) lets a fault change its settings
mid-run: `checkpoint_every_steps`, `checkpoint_dir`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 256


def read_direct(path: str) -> mmap.mmap:
    """The whole file, read with O_DIRECT into a page-aligned buffer."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size
        buf = mmap.mmap(-1, max(size, mmap.PAGESIZE))
        done = 0
        while done < size:
            view = memoryview(buf)[done:]
            n = os.preadv(fd, [view], done)
            view.release()
            if n <= 0:
                break
            done += n
        return buf
    finally:
        os.close(fd)


def work_unit() -> float:
    """One unit of preprocessing work (a few small single-threaded matmuls)."""
    a = torch.ones(64, 64)
    for _ in range(4):
        a = (a @ a).clamp_(-1, 1)
    return float(a[0, 0])


def calibrate(ms: float) -> int:
    """How many work units take `ms` on this CPU when it is not contended (best of 5)."""
    if ms <= 0:
        return 0
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            work_unit()
        best = min(best, (time.perf_counter() - t0) / 20)
    return max(1, round(ms / 1000 / best))


class DirectFiles(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, files: list[str], units: int) -> None:
        self.files = files
        self.units = units

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        buf = read_direct(self.files[i])
        x = torch.frombuffer(bytearray(buf), dtype=torch.uint8).float()
        buf.close()
        for _ in range(self.units):  # decode / augment: CPU work per sample
            work_unit()
        x = x[: (x.numel() // FEATURES) * FEATURES].view(-1, FEATURES).mean(0) / 255.0
        return x, i % 4


class S3Objects(Dataset[tuple[torch.Tensor, int]]):
    """One object per sample from an S3 bucket (`--data s3://BUCKET/PREFIX`, at
    `--s3-endpoint`): the same decode work as DirectFiles. Each process (input workers are
    forked) makes its own boto3 client on first use: clients are not fork-safe.

    With `report` (--mode sdk, no `gpufeed run` to see boto3) each read is reported with the
    SDK's Job.add_io, from a Job of the worker's own: the object's bytes and the time from
    the request to the body's last byte."""

    def __init__(self, url: str, endpoint: str, units: int, report: bool = False) -> None:
        import boto3  # only in this mode: the file mode needs nothing beyond torch

        self.bucket, _, prefix = url[len("s3://") :].partition("/")
        self.endpoint = endpoint or None
        self.units = units
        self.report = report
        self._client: Any = None
        self._job: Any = None
        self._pid = 0
        pages = boto3.client("s3", endpoint_url=self.endpoint).get_paginator("list_objects_v2")
        self.keys = sorted(
            o["Key"]
            for page in pages.paginate(Bucket=self.bucket, Prefix=prefix.rstrip("/") + "/")
            for o in page.get("Contents", [])
        )

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self._client is None or self._pid != os.getpid():
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint)
            self._pid = os.getpid()
            if self.report:
                import gpufeed

                self._job = gpufeed.Job("lab-train")
        t0 = time.perf_counter()
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read()
        except Exception:
            if self._job is not None:
                where = f"s3://{self.bucket}/{self.keys[i]}"
                self._job.add_io(where, "read", 0, time.perf_counter() - t0, errors=1)
            raise
        if self._job is not None:
            where = f"s3://{self.bucket}/{self.keys[i]}"
            self._job.add_io(where, "read", len(body), time.perf_counter() - t0)
        x = torch.frombuffer(bytearray(body), dtype=torch.uint8).float()
        for _ in range(self.units):
            work_unit()
        x = x[: (x.numel() // FEATURES) * FEATURES].view(-1, FEATURES).mean(0) / 255.0
        return x, i % 4


class DeviceWork:
    """The per-step device time: a sleep (the stand-in) or, on a GPU, real kernels that keep
    it busy for about as long; either way the host waits for the device before going on."""

    def __init__(self, device: str, seconds: float) -> None:
        self.seconds = seconds
        self.cuda = device == "cuda"
        self.kernels = 0
        if self.cuda and seconds > 0:
            self.a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):  # warm-up: the first products load cuBLAS
                self.a @ self.a
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                self.a @ self.a
            torch.cuda.synchronize()
            per = (time.perf_counter() - t0) / 50
            self.kernels = max(1, round(seconds / per))

    def run(self) -> None:
        if not self.cuda:
            time.sleep(self.seconds)  # the device stand-in: the host waits on it
            return
        for _ in range(self.kernels):
            self.a @ self.a
        torch.cuda.synchronize()  # the host waits on the device, as a real step does


def one_thread(_worker: int) -> None:
    torch.set_num_threads(1)


class Control:
    """The control file, re-read when its mtime changes; absent = the defaults."""

    def __init__(self, path: str, every: int, directory: str) -> None:
        self.path = path
        self.defaults = (every, directory)
        self.every, self.dir = self.defaults
        self.mtime: float | None = None

    def poll(self) -> None:
        try:
            m = os.stat(self.path).st_mtime
        except FileNotFoundError:
            self.mtime = None
            self.every, self.dir = self.defaults
            return
        if m == self.mtime:
            return
        self.mtime = m
        with contextlib.suppress(OSError, ValueError):
            with open(self.path) as f:
                d = json.load(f)
            self.every = int(d.get("checkpoint_every_steps", self.defaults[0]))
            self.dir = str(d.get("checkpoint_dir", self.defaults[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("plain", "sdk"), required=True)
    ap.add_argument("--data", required=True, help="a directory, or s3://BUCKET/PREFIX")
    ap.add_argument("--s3-endpoint", default="", help="the S3 endpoint URL of an s3:// --data")
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--ckpt-mib", type=int, default=24)
    ap.add_argument("--device-seconds", type=float, default=0.05)
    ap.add_argument(
        "--device",
        choices=("stand-in", "cuda"),
        default="stand-in",
        help="stand-in: sleep --device-seconds per step (no GPU); cuda: real kernels as long",
    )
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--preprocess-ms", type=float, default=2.0)
    ap.add_argument("--weights", default="", help="a torch.save'd file loaded before step 1")
    ap.add_argument("--hold-seconds", type=float, default=0.0, help="stay alive after the loop")
    ap.add_argument(
        "--seconds", type=float, required=True, help="loop this long after step 1 (or the load)"
    )
    ap.add_argument("--steps-log", required=True)
    ap.add_argument("--control", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    job: Any = None
    if args.mode == "sdk":
        import gpufeed

        job = gpufeed.Job("lab-train")

    # on a GPU the CUDA context (and with it the job's hold on the GPU) begins here
    dev = torch.device("cuda" if args.device == "cuda" else "cpu")
    device_work = DeviceWork(args.device, args.device_seconds)
    units = calibrate(args.preprocess_ms)
    data: Dataset[tuple[torch.Tensor, int]]
    if args.data.startswith("s3://"):
        data = S3Objects(args.data, args.s3_endpoint, units, report=args.mode == "sdk")
    else:
        data = DirectFiles(sorted(os.path.join(args.data, f) for f in os.listdir(args.data)), units)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        worker_init_fn=one_thread,
        persistent_workers=args.workers > 0,
        prefetch_factor=2 if args.workers > 0 else None,
    )
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 4)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    control = Control(args.control, args.ckpt_every, args.ckpt)
    log = open(args.steps_log, "a", buffering=1 << 16)  # noqa: SIM115 - flushed per second
    first: Any = None
    started: float | None = None  # the clock's start, where it is not the first step
    if args.weights:
        # the input workers start (and read their first batches) before the load, so the
        # load is all that stands between the clock's start and the first step
        first = iter(loader)
        started = time.time()
        log.write(json.dumps({"start": round(started, 3)}) + "\n")
        log.flush()
        with job.load(args.weights) if job is not None else contextlib.nullcontext():
            weights = torch.load(args.weights, map_location=dev, weights_only=True)
    else:
        weights = torch.zeros(args.ckpt_mib << 20, dtype=torch.uint8)
    flushed = time.monotonic()
    clock = time.perf_counter
    steps = 0
    until = float("inf")
    done = False
    while not done:
        t_prev = clock()
        source = first if first is not None else loader
        first = None
        batches = job.track(source) if job is not None else source
        for x, y in batches:
            t1 = clock()
            x, y = x.to(dev), y.to(dev)
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            device_work.run()
            steps += 1
            if steps == 1:
                until = (started or time.time()) + args.seconds
            control.poll()
            k = 0.0
            if control.every and steps % control.every == 0:
                os.makedirs(control.dir, exist_ok=True)
                path = os.path.join(control.dir, f"ckpt-{steps % 2}.pt")
                k0 = clock()
                state = {"model": model.state_dict(), "weights": weights, "step": steps}
                with job.checkpoint(path) if job is not None else contextlib.nullcontext():
                    torch.save(state, path)
                k = clock() - k0
            t2 = clock()
            log.write(
                json.dumps(
                    {
                        "t": round(time.time(), 3),
                        "s": round(t2 - t_prev, 5),
                        "c": round(t2 - t1 - k, 5),
                        "w": round(t1 - t_prev, 5),
                        "k": round(k, 5),
                    }
                )
                + "\n"
            )
            if time.monotonic() - flushed >= 1.0:
                log.flush()
                flushed = time.monotonic()
            t_prev = t2
            if time.time() >= until:
                done = True
                break
        if job is not None:
            job.epoch()
    log.close()
    if args.hold_seconds > 0:  # done, but the devices stay held (weights, model, context)
        time.sleep(args.hold_seconds)
    if job is not None:
        job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
