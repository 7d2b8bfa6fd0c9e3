"""The docs name only what exists: every agent flag is in README's flag table and every
flag there exists; repository paths and `make` targets named in README and docs/ exist."""

from __future__ import annotations

import argparse
import re

from gpufeed.cli import build_parser
from stack_support import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# Top-level folders of the repository that docs refer into.
REPO_DIRS = ("deploy", "exporter", "bench", "tests", "alerts", "dashboards", "compose", "docs")
# Paths the docs cite in other repositories (page, path): not ours to check.
ELSEWHERE = {("gpu.md", "docs/hardware/gpu.md")}  # the OpenTelemetry semantic conventions


def agent_flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    agent = sub.choices["agent"]
    return {s for a in agent._actions for s in a.option_strings if s.startswith("--")}


def readme_flag_table() -> set[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    rows = [line for line in readme.splitlines() if line.startswith("| `--")]
    return {f for row in rows for f in re.findall(r"`(--[a-z][\w.-]*)", row.split("|")[1])}


def test_readme_flag_table_lists_every_agent_flag_and_no_other() -> None:
    flags = agent_flags() - {"--help"}
    # One row covers every collector switch.
    switches = {f for f in flags if f.startswith(("--collector.", "--no-collector."))}
    generic = {"--collector.NAME", "--no-collector.NAME"}
    table = readme_flag_table()
    assert switches and generic <= table
    assert flags - switches == table - generic


def test_repository_paths_named_in_the_docs_exist() -> None:
    dirs = "|".join(REPO_DIRS)
    pattern = re.compile(rf"(?<![\w/.-])((?:{dirs})/[\w./-]*\w)")
    missing = []
    for page in PAGES:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in pattern.finditer(line):
                path = m.group(1)
                if (page.name, path) in ELSEWHERE:
                    continue
                if not (REPO_ROOT / path).exists() and not (page.parent / path).exists():
                    missing.append(f"{page.relative_to(REPO_ROOT)}:{n}: {path}")
    assert missing == [], "a path of another repository goes in ELSEWHERE"


def test_make_targets_named_in_the_docs_exist() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = {
        (page.name, m.group(1))
        for page in PAGES
        for m in re.finditer(r"`make ([a-z][\w-]*)", page.read_text(encoding="utf-8"))
    }
    assert {(page, t) for page, t in named if t not in targets} == set()
