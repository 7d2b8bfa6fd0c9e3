"""HELP texts live once, in the catalogue: product code builds its families from catalogue
entries (`Families.declare_spec` / `put` / `put_histogram`), never from a HELP literal."""

from __future__ import annotations

import ast
from pathlib import Path

from gpufeed.catalogue import CATALOGUE

PACKAGE = Path(__file__).resolve().parent.parent / "exporter" / "gpufeed"
NAME_AND_HELP_METHODS = {"gauge", "counter", "info", "histogram", "declare", "add"}
LOGGERS = {"log", "_log", "logger", "logging"}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        if rel in ("gpufeed/catalogue.py", "gpufeed/model.py"):
            continue
        out.append((rel, ast.parse(path.read_text())))
    return out


def help_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """HELP-like string literals (text with spaces) passed to a Families name-and-HELP
    method: `f.gauge("gpufeed_x", "What it is.", ...)`."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in NAME_AND_HELP_METHODS:
            continue
        receiver = node.func.value
        if isinstance(receiver, ast.Name) and receiver.id in LOGGERS:
            continue
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and " " in arg.value:
                found.append((node.lineno, arg.value))
    return found


def test_no_family_is_built_from_a_help_literal() -> None:
    found = [
        f"{rel}:{line}: {text[:60]!r}"
        for rel, tree in _modules()
        for line, text in help_literals(tree)
    ]
    assert not found, "HELP belongs in gpufeed/catalogue.py:\n" + "\n".join(found)


def test_no_catalogue_help_text_is_copied_into_another_module() -> None:
    helps = {m.help: m.name for m in CATALOGUE}
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in helps:
                found.append(f"{rel}:{node.lineno}: HELP of {helps[node.value]}")
    assert not found, "\n".join(found)


def test_the_scan_finds_a_help_literal() -> None:
    tree = ast.parse('f.gauge("gpufeed_x", "What it is.", {}, 1.0)\nlog.info("a b %s", x)\n')
    assert help_literals(tree) == [(1, "What it is.")]
