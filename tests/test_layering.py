"""Layers point down the data flow: a module never imports the layer that uses it.

Read from the source with `ast` (every import, also those inside functions and under
TYPE_CHECKING: a deferred import is still a dependency), so the rules hold without importing
anything. A failure names the importing file, its line and the forbidden module.

- The parsers (procfs/, sysfs/, storage/) know nothing of collectors/: where to read comes
  from gpufeed.hostpaths, below them both.
- The real GPU backend (gpu/) never imports the simulator; the simulator (simulate/) may
  implement gpu/'s interface, so the dependency runs one way only.
- The job layer's parts (jobs/) do not import collectors/: collectors are built by the
  agent's wiring (gpufeed/agent/wiring.py), which imports both.
- The correlator's engine (correlator/engine/) imports neither its feeds, its outputs nor
  the agent; the feeds do not import the agent, nor do its outputs (/api/windows).
- The HTTP layer (web/) serves the agent, the fleet and the scheduler alike, so it lives
  below all three and imports none of them (nor the correlator whose pages it serves); the
  three services import each other not at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "exporter" / "gpufeed"

# (importing package, forbidden package): "gpufeed.X" imports nothing under "gpufeed.Y"
FORBIDDEN = [
    ("procfs", "collectors"),
    ("sysfs", "collectors"),
    ("storage", "collectors"),
    ("gpu", "simulate"),
    ("jobs", "collectors"),
    ("netlink", "collectors"),
    # The correlator's reasoning is fed and read by the layers around it, never the reverse:
    # the same engine serves the live, trace and PromQL feeds.
    ("correlator/engine", "correlator/feeds"),
    ("correlator/engine", "correlator/outputs"),
    ("correlator/engine", "agent"),
    ("correlator/feeds", "agent"),
    ("correlator/outputs", "agent"),
    # One web layer for every service: what the three share lives below them.
    ("web", "agent"),
    ("web", "fleet"),
    ("web", "scheduler"),
    ("web", "correlator"),
    ("fleet", "agent"),
    ("fleet", "scheduler"),
    ("scheduler", "agent"),
    ("scheduler", "fleet"),
    ("agent", "fleet"),
    ("agent", "scheduler"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `source`, the text of module `module`;
    relative imports are resolved against its package."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            # `from gpufeed import collectors` imports the package gpufeed.collectors
            out.extend((node.lineno, f"{mod}.{alias.name}") for alias in node.names)
    return out


def under(module: str, package: str) -> bool:
    dotted = package.replace("/", ".")
    return module == f"gpufeed.{dotted}" or module.startswith(f"gpufeed.{dotted}.")


def violations(importer: str, forbidden: str) -> list[str]:
    found: dict[str, str] = {}
    for path in sorted((PACKAGE / importer).rglob("*.py")):
        name = module_name(path)
        for line, mod in imports(path.read_text(), name, path.name == "__init__.py"):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if under(mod, forbidden) and where not in found:
                found[where] = f"{where} imports {mod}"
    return list(found.values())


@pytest.mark.parametrize(("importer", "forbidden"), FORBIDDEN, ids=lambda v: str(v))
def test_layer_does_not_import_the_layer_above(importer: str, forbidden: str) -> None:
    assert (PACKAGE / importer).is_dir(), f"gpufeed/{importer}/ is gone: update FORBIDDEN"
    bad = violations(importer, forbidden)
    assert not bad, f"gpufeed/{importer}/ must not import gpufeed/{forbidden}/:\n" + "\n".join(bad)


def test_the_check_sees_imports_of_every_form() -> None:
    """The scan itself: absolute, package, deferred and relative imports are all seen."""
    source = (
        "import gpufeed.collectors.base\n"
        "from gpufeed import collectors\n"
        "from ..collectors.network import NetworkCollector\n"
        "def f():\n"
        "    from gpufeed.collectors.host import HostCollector\n"
    )
    seen = {mod for _, mod in imports(source, "gpufeed.procfs.m")}
    for mod in (
        "gpufeed.collectors.base",
        "gpufeed.collectors",
        "gpufeed.collectors.network",
        "gpufeed.collectors.host",
    ):
        assert mod in seen, mod
        assert under(mod, "collectors")
    assert not under("gpufeed.collectorsx", "collectors")


def test_no_module_imported_by_tests_edits_sys_path() -> None:
    """bench/, alerts/ and dashboards/ are packages at the repository root (pytest's
    `pythonpath`, `python -m bench.NAME`): nothing imported in-process edits sys.path. Child
    scripts run by path (tests/helpers/) set up their own interpreter and are exempt."""
    root = PACKAGE.parents[1]
    offenders = []
    for folder in ("bench", "alerts", "dashboards", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            if "helpers" in path.relative_to(root).parts or "fixtures" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                func = node.func if isinstance(node, ast.Call) else None
                if (
                    isinstance(func, ast.Attribute)
                    and ast.unparse(func.value) == "sys.path"
                    and func.attr in ("insert", "append", "extend")
                ):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, "sys.path edited (import it as a package instead):\n" + "\n".join(
        offenders
    )
