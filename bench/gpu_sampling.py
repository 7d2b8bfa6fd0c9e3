"""Sampling cost per interval of the GPU collector, over any GPU backend.

Backends:
  fake-nvml   NvmlBackend over an in-process fake libnvidia-ml of N GPUs (tests/nvml_fake.py).
              This measures ONLY gpufeed's Python overhead around NVML (the fake answers in
              microseconds); real NVML adds the driver's time on top (see bench/gpu-smoke.sh).
  nvml        NvmlBackend on the real driver (a GPU host).
  MOD:FACTORY any other backend, built by calling FACTORY() from module MOD, for example
              the simulated node: gpufeed.simulate.gpu_backend:<factory>.

Figures are medians over --samples calls of GpuCollector.collect() (backend sample plus
family building), given in milliseconds and as ratios against references measured in the
same run: the sampling interval (1 s by default) and one reference operation (rendering the
same families to Prometheus text), so they compare across machines.

Usage: python -m bench.gpu_sampling [--backend fake-nvml] [--gpus 8] [--samples 300]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

from gpufeed.collectors.gpu import GpuCollector, gpu_families
from gpufeed.exposition import render_text
from gpufeed.gpu.backend import GpuBackend


def fake_nvml_backend(gpus: int) -> tuple[GpuBackend, Callable[[], None]]:
    import pynvml

    from gpufeed.gpu.nvml import NvmlBackend
    from tests.nvml_fake import FakeGpu, FakeNvml

    saved: dict[str, Any] = {}

    def setattr_saving(obj: Any, name: str, value: Any) -> None:
        saved.setdefault(name, getattr(obj, name))
        setattr(obj, name, value)

    fake = FakeNvml([FakeGpu(f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(gpus)])
    fake.install(setattr_saving)

    def restore() -> None:
        for name, value in saved.items():
            setattr(pynvml, name, value)

    return NvmlBackend(watch_xid=True), restore


def build(spec: str, gpus: int) -> tuple[GpuBackend, Callable[[], None], str]:
    if spec == "fake-nvml":
        backend, restore = fake_nvml_backend(gpus)
        return (
            backend,
            restore,
            f"NvmlBackend over fake libnvidia-ml, {gpus} GPUs (Python overhead only)",
        )
    if spec == "nvml":
        from gpufeed.gpu.nvml import NvmlBackend

        return NvmlBackend(), lambda: None, "NvmlBackend on the real driver"
    module, sep, factory = spec.partition(":")
    if not sep:
        raise SystemExit(f"--backend {spec!r}: expected fake-nvml, nvml or MODULE:FACTORY")
    backend = getattr(importlib.import_module(module), factory)()
    return backend, lambda: None, f"{spec}"


def median_ms(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--backend", default="fake-nvml")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the fake NVML")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--interval", type=float, default=1.0, help="sampling interval, seconds")
    args = ap.parse_args()

    backend, restore, what = build(args.backend, args.gpus)
    collector = GpuCollector(backend)
    try:
        for _ in range(5):  # warm-up: first-call probing, GPM baselines
            collector.collect()
        samples = backend.sample()
        families = gpu_families(samples, backend.name)
        sample_ms = median_ms(backend.sample, args.samples)
        collect_ms = median_ms(collector.collect, args.samples)
        render_ms = median_ms(lambda: render_text(families), args.samples)
    finally:
        collector.close()
        restore()
    series = sum(len(f.samples) for f in families)
    print(f"backend: {what}")
    print(f"GPUs: {len(samples)}, series per interval: {series}, samples measured: {args.samples}")
    print(f"backend.sample()            median {sample_ms:8.3f} ms")
    print(f"GpuCollector.collect()      median {collect_ms:8.3f} ms")
    print(f"  per GPU                   median {collect_ms / max(1, len(samples)):8.3f} ms")
    print(f"reference: render_text()   median {render_ms:8.3f} ms")
    print(f"collect / interval ({args.interval:g} s)    {collect_ms / (args.interval * 1000):.5f}")
    print(f"collect / render_text            {collect_ms / render_ms:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
