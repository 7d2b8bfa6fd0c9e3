"""Choosing the GPU backend from `--gpu.backend` (auto, nvml, simulated, off).

- auto: NVML if it works; on a host without a driver, no GPU collector and one reason line.
- nvml: NVML or a clear error (`NvmlUnavailable` propagates, the agent exits with it).
- simulated: whatever `simulated` builds (the simulated node owns its scenario).
- off: no GPU collector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpufeed.gpu.backend import GpuBackend

BackendKind = Literal["auto", "nvml", "simulated", "off"]
BACKEND_KINDS: tuple[BackendKind, ...] = ("auto", "nvml", "simulated", "off")


@dataclass(frozen=True, slots=True)
class BackendChoice:
    """The backend to run (None: no GPU collector) and the one line that says why."""

    backend: GpuBackend | None
    reason: str


def make_backend(
    kind: BackendKind,
    *,
    simulated: Callable[[], GpuBackend] | None = None,
    nvml: Callable[[], GpuBackend] | None = None,
) -> BackendChoice:
    """Builds the backend `kind` asks for. Raises NvmlUnavailable only for kind="nvml"."""
    from gpufeed.gpu.nvml import NvmlBackend, NvmlUnavailable

    open_nvml: Callable[[], GpuBackend] = nvml or NvmlBackend
    if kind == "off":
        return BackendChoice(None, "GPU collector off (--gpu.backend=off)")
    if kind == "simulated":
        if simulated is None:
            raise ValueError("--gpu.backend=simulated needs a simulated node to build")
        return BackendChoice(simulated(), "GPU backend: simulated (values are generated)")
    if kind == "nvml":
        backend = open_nvml()
        return BackendChoice(backend, f"GPU backend: NVML, {len(backend.devices())} GPU(s)")
    if kind == "auto":
        try:
            backend = open_nvml()
        except NvmlUnavailable as exc:
            return BackendChoice(
                None,
                f"GPU collector off: {exc} (--gpu.backend=nvml makes this an error; "
                "--simulate runs a simulated node)",
            )
        return BackendChoice(backend, f"GPU backend: NVML, {len(backend.devices())} GPU(s)")
    raise ValueError(f"--gpu.backend {kind!r}: expected one of {', '.join(BACKEND_KINDS)}")
