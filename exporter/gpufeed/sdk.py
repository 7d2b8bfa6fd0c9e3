"""Training-loop SDK (placeholder until the job layer lands)."""

from __future__ import annotations


class Job:
    def __init__(self, name: str, socket: str | None = None) -> None:
        self.name = name
        self.socket = socket
