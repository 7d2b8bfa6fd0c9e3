"""The causes a window can be tagged with; the enum values are the stable `cause` label values."""

from __future__ import annotations

from enum import StrEnum


class Cause(StrEnum):
    DATA_LOADING = "data_loading"
    PREPROCESSING = "preprocessing"
    CHECKPOINTING = "checkpointing"
    NETWORK = "network"
    THROTTLING = "throttling"
    STARTUP = "startup"
    IDLE = "idle"
    GPU_ERROR = "gpu_error"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value
