"""Adding a collector: the registration table is the only way in (docs/architecture.md).

A collector class (`*Collector` in collectors/) must be reachable from the table in
gpufeed/agent/wiring.py (its module imported there), and nothing outside wiring.py and the class's
own module builds one. A failure names the class and what it lacks. That its families are
in the metric catalogue is tests/test_catalogue.py's `test_real_agent_on_the_fixture_trees`
(the real agent on fixture trees, every family named that is missing or differs).
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpufeed.agent import wiring

PACKAGE = Path(__file__).resolve().parents[1] / "exporter" / "gpufeed"
WIRING = PACKAGE / "agent" / "wiring.py"


def collector_classes(folder: Path) -> dict[str, str]:
    """Class name -> module ("gpufeed.collectors.X") of every *Collector class in folder."""
    out = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem in ("__init__", "base"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Collector"):
                out[node.name] = f"gpufeed.collectors.{path.stem}"
    return out


def imported_modules(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods.update(alias.name for alias in node.names)
    return mods


def unregistered(classes: dict[str, str], wiring_imports: set[str]) -> list[str]:
    return [
        f"{cls} ({module}) is not in the registration table: add a CollectorSpec to "
        "COLLECTORS in gpufeed/agent/wiring.py"
        for cls, module in sorted(classes.items())
        if module not in wiring_imports
    ]


def test_every_collector_is_in_the_registration_table() -> None:
    classes = collector_classes(PACKAGE / "collectors")
    assert len(classes) >= 7, sorted(classes)  # the scan itself found the collectors
    problems = unregistered(classes, imported_modules(WIRING))
    assert not problems, "\n".join(problems)


def test_the_table_names_each_collector_once_with_help() -> None:
    names = [s.name for s in wiring.COLLECTORS]
    assert len(names) == len(set(names)), names
    for s in wiring.COLLECTORS:
        assert s.help.strip(), f"collector {s.name!r}: no help for --collector.{s.name}"


def test_only_wiring_builds_collectors() -> None:
    """A collector built elsewhere would escape the table's switches and the tick's order."""
    classes = collector_classes(PACKAGE / "collectors")
    built_elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if path == WIRING:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                home = classes.get(node.func.id)
                if home is not None and home != module:
                    rel = path.relative_to(PACKAGE.parent)
                    built_elsewhere.append(f"{rel}:{node.lineno} builds {node.func.id}")
    assert not built_elsewhere, "build collectors in gpufeed/agent/wiring.py only:\n" + "\n".join(
        built_elsewhere
    )


def test_a_collector_left_out_of_the_table_is_named() -> None:
    problems = unregistered({"DiskCollector": "gpufeed.collectors.disk"}, imported_modules(WIRING))
    assert problems == [
        "DiskCollector (gpufeed.collectors.disk) is not in the registration table: add a "
        "CollectorSpec to COLLECTORS in gpufeed/agent/wiring.py"
    ]
