"""What a test does when this host lacks something it needs (root, cgroup v1 blkio,
/dev/fuse): outside CI it skips with the reason; in CI (`CI=true`, what `.ci/run`'s
runners set) it fails, because a test that silently skips there proves nothing (0.1.0's
tests skipped when a file outside the repository was missing)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"{reason}; CI is set, so this test fails instead of skipping", pytrace=False)
    pytest.skip(reason)
