"""The version is one fact: pyproject, the package, the DaemonSet's image tag and CHANGELOG agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import gpufeed

REPO = Path(__file__).resolve().parent.parent


def test_every_place_names_the_same_version() -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]["version"]
    assert gpufeed.__version__ == project
    for manifest in ("daemonset.yaml", "fleet.yaml"):
        text = (REPO / "deploy" / "kubernetes" / manifest).read_text()
        tags = re.findall(r"image:\s*\S*gpufeed-agent:(\S+)", text)
        assert tags == [project], f"{manifest} image tags {tags}, pyproject {project}"
    changelog = (REPO / "CHANGELOG.md").read_text()
    # Work not yet released collects under `## Unreleased`, above the current version.
    released = [h for h in re.findall(r"^## (\S+)", changelog, re.M) if h != "Unreleased"]
    assert released[:1] == [project], f"CHANGELOG's newest release heading {released[:1]}"
