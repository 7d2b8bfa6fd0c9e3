"""The simulated node: every contract metric, coherently, from one scenario.

`build_simulated_node` is what the agent calls for `--simulate [SCENARIO.yaml]`; the trace
generator (`gpufeed.simulate.tracegen`) writes labelled multi-node traces for benchmarks.
Imports are light (PyYAML only); nothing runs at import.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufeed.collectors.base import Collector
    from gpufeed.simulate.gpu_backend import SimulatedGpuBackend
    from gpufeed.simulate.node import SimulatedNode

__all__ = ["build_simulated_node"]


def build_simulated_node(
    scenario_path: str | None,
    seed: int = 1,
    pace: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[SimulatedGpuBackend, list[Collector], SimulatedNode]:
    """The simulated GPU backend, the `simulated` collector, and the node they share.

    `scenario_path` None runs the built-in scenario. `clock` only needs to advance in
    seconds (default `time.monotonic`); the snapshot timestamps come from the sampler. Raises `ScenarioError` (a
    `ConfigError`) with file, key and line for a bad scenario.
    """
    from gpufeed.simulate.gpu_backend import SimulatedGpuBackend
    from gpufeed.simulate.node import SimulatedNode, SimulatedNodeCollector
    from gpufeed.simulate.scenario import load_scenario

    if pace <= 0:
        raise ValueError("--simulate.pace must be positive")
    node = SimulatedNode(load_scenario(scenario_path), seed=seed, pace=pace, clock=clock)
    return SimulatedGpuBackend(node), [SimulatedNodeCollector(node)], node
