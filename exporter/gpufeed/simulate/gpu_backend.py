"""The simulated GPU backend: GPUs of a `SimulatedNode`, for demos, tests and `--simulate`.

Everything it returns is generated; the GPU collector labels it `backend="simulated"` on
`gpufeed_gpu_info`, so it can never be mistaken for a measurement.
"""

from __future__ import annotations

from typing import Literal

from gpufeed.gpu.backend import GpuIdentity, GpuSample
from gpufeed.simulate.node import SimulatedNode


class SimulatedGpuBackend:
    def __init__(self, node: SimulatedNode) -> None:
        self.node = node

    @property
    def name(self) -> Literal["simulated"]:
        return "simulated"

    def devices(self) -> list[GpuIdentity]:
        return list(self.node.identities)

    def sample(self) -> list[GpuSample]:
        """One reading of every GPU, in index order; a lost GPU has up=False."""
        return self.node.gpu_samples()

    def close(self) -> None:
        return None


def default_backend() -> SimulatedGpuBackend:
    """The built-in scenario's GPUs on the wall clock (for `bench/gpu_sampling.py
    --backend gpufeed.simulate.gpu_backend:default_backend`)."""
    from gpufeed.simulate.scenario import default_scenario

    return SimulatedGpuBackend(SimulatedNode(default_scenario(), seed=1))
