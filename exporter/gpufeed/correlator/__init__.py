"""The correlator: tags every GPU-underutilization window with its root cause.

One engine (`engine.NodeCorrelator`) serves three feeds: live snapshots inside the agent
(`live.CorrelatorProcessor`), recorded traces (`trace.read_trace`) and Prometheus range
queries (`promql`). Importing this package is light; submodules load what they need.
"""

from __future__ import annotations

from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.window import Window

__all__ = ["Cause", "Window"]
