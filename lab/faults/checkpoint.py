"""`checkpoint_storm`: the job checkpoints far too often (a configuration mistake: every
step instead of every few thousand). The workload reads its control file each step
(lab/workloads/train.py --control); this writes `checkpoint_every_steps` there and removes
it at stop. Settings: every_steps (default 1), tier (where the checkpoints go; default the
workload's checkpoint tier)."""

from __future__ import annotations

import contextlib
import json
import os

from lab.faults import FaultContext
from lab.scenario import Fault


class CheckpointStorm:
    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        self.ctx = ctx
        self.every = int(fault.param("every_steps", 1))
        tier = fault.param("tier")
        self.dir = str(ctx.tiers[tier].mnt / "ckpt") if tier in ctx.tiers else ""

    def prepare(self) -> None:
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)

    def start(self) -> None:
        settings: dict[str, object] = {"checkpoint_every_steps": self.every}
        if self.dir:
            settings["checkpoint_dir"] = self.dir
        tmp = self.ctx.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(settings))
        os.rename(tmp, self.ctx.control)  # the workload never sees half a file

    def stop(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ctx.control.unlink()
