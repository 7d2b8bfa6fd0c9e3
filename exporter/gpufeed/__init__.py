"""gpufeed: why are our GPUs not busy?

Importing `gpufeed` is cheap and has no side effects: the training-loop SDK (`gpufeed.Job`)
is loaded on first use, and the agent's modules only when the agent runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
__all__ = ["Job", "__version__"]

if TYPE_CHECKING:
    from gpufeed.sdk import Job


def __getattr__(name: str) -> Any:
    if name == "Job":
        from gpufeed.sdk import Job

        return Job
    raise AttributeError(f"module 'gpufeed' has no attribute {name!r}")
