"""No module-level mutable state in the package (the project's rule), and the two places that
used some (offline analysis in parallel, the trace reader's cache) work without it."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from correlator_helpers import analyze_text, scenarios
from gpufeed.correlator.feeds import analyze
from gpufeed.trace.reader import parse_chunk

PACKAGE = Path(__file__).resolve().parent.parent / "exporter" / "gpufeed"

# Methods that change a list, dict or set in place.
MUTATORS = {
    "append", "extend", "insert", "remove", "pop", "popitem", "clear", "update",
    "setdefault", "add", "discard", "difference_update", "intersection_update",
    "symmetric_difference_update", "sort", "reverse",
}  # fmt: skip
# Code that runs inside the user's training process, not the agent: the SDK (loaded by path,
# standard library only) and `gpufeed run`'s torch hook. There "once per process" is the
# behaviour asked for (start-up reported once, one Job per process, re-made after a fork),
# so a process-wide flag is the honest form; each entry names the one allowed statement.
TRAINING_PROCESS_STATE = {
    ("gpufeed/sdk.py", "`global _startup_reported`"),
    ("gpufeed/inject/_gpufeed_torch.py", "`global _job`"),
    ("gpufeed/inject/_gpufeed_torch.py", "`global _warned`"),
    ("gpufeed/inject/_gpufeed_botocore.py", "`global _warned`"),
    ("gpufeed/inject/_gpufeed_s3torch.py", "`global _warned`"),
}
CONTAINER_CALLS = {"list", "dict", "set", "defaultdict", "OrderedDict", "Counter", "deque"}


def _is_container(node: ast.expr) -> bool:
    if isinstance(node, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in CONTAINER_CALLS
    )


def _is_empty_container(node: ast.expr) -> bool:
    if isinstance(node, ast.List | ast.Set):
        return not node.elts
    if isinstance(node, ast.Dict):
        return not node.keys
    return isinstance(node, ast.Call) and _is_container(node) and not node.args


def module_state_problems(source: str) -> list[str]:
    """What in one module's source is module-level mutable state:
    - a `global` statement (a function rebinding a module name);
    - a module-level name bound to an empty container (it exists only to be filled);
    - a module-level container that the module changes in place (a method that mutates,
      an item or slice assignment, `del NAME[...]`).
    A module-level table that is built once and only read is not state."""
    tree = ast.parse(source)
    containers: dict[str, int] = {}
    problems: list[str] = []
    for stmt in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        if value is None or not _is_container(value):
            continue
        for t in targets:
            if isinstance(t, ast.Name) and t.id != "__all__":
                containers[t.id] = stmt.lineno
                if _is_empty_container(value):
                    problems.append(
                        f"line {stmt.lineno}: {t.id} is an empty module-level container"
                    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            problems.append(f"line {node.lineno}: `global {', '.join(node.names)}`")
        name = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Name)
        ):
            name = node.func.value.id
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store | ast.Del)
            and isinstance(node.value, ast.Name)
        ):
            name = node.value.id
        if name in containers and not _shadowed(tree, node, name):
            problems.append(f"line {node.lineno}: module-level {name} is changed in place")
    return problems


def _shadowed(tree: ast.Module, target: ast.AST, name: str) -> bool:
    """Whether `name` at `target` is a local of the enclosing function (not the module's)."""
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if not any(n is target for n in ast.walk(fn)):
            continue
        args = fn.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        if any(a is not None and a.arg == name for a in params):
            return True
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
                return True
    return False


def test_no_module_level_mutable_state_in_the_package() -> None:
    found = []
    allowed = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        for problem in module_state_problems(path.read_text()):
            what = problem.split(": ", 1)[1]
            if (rel, what) in TRAINING_PROCESS_STATE:
                allowed.add((rel, what))
            else:
                found.append(f"{rel}: {problem}")
    assert not found, "module-level mutable state:\n" + "\n".join(found)
    assert allowed == TRAINING_PROCESS_STATE, "stale allowance: drop it from the list"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("CACHE: set[str] = set()\n", "CACHE is an empty module-level container"),
        ("SHARED = []\n", "SHARED is an empty module-level container"),
        ("T = {'a': 1}\ndef f():\n    T['b'] = 2\n", "T is changed in place"),
        ("T = [1]\ndef f():\n    T.append(2)\n", "T is changed in place"),
        ("N = 0\ndef f():\n    global N\n    N += 1\n", "`global N`"),
    ],
)
def test_the_scan_finds_each_kind_of_state(source: str, expected: str) -> None:
    assert any(expected in p for p in module_state_problems(source))


def test_the_scan_leaves_read_only_tables_and_locals_alone() -> None:
    source = (
        "TABLE = {'a': 1}\n"
        "def f(TABLE):\n    TABLE['x'] = 1\n"
        "def g():\n    TABLE = {}\n    TABLE['y'] = 2\n    return TABLE\n"
    )
    assert module_state_problems(source) == []


def _nodes_trace() -> str:
    text, _ = scenarios.build(seed=3, nodes=3, hours=1.5)
    return text


def test_parallel_analysis_matches_serial(tmp_path: Path) -> None:
    text = _nodes_trace()
    serial = analyze_text(text, tmp_path)
    assert len({w.instance for w in serial}) > 1
    assert analyze_text(text, tmp_path, jobs=3) == serial


def test_a_failing_node_fails_the_parallel_analysis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(node: object, *_: object) -> list[object]:
        raise ValueError(f"cannot analyse {getattr(node, 'instance', '?')}")

    monkeypatch.setattr(analyze, "analyze_node", broken)  # the forked workers inherit it
    with pytest.raises(ValueError, match="cannot analyse node-"):
        analyze_text(_nodes_trace(), tmp_path, jobs=2)


def test_a_worker_that_dies_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dies(node: object, *_: object) -> list[object]:
        os._exit(9)

    monkeypatch.setattr(analyze, "analyze_node", dies)
    with pytest.raises(RuntimeError, match="worker died"):
        analyze_text(_nodes_trace(), tmp_path, jobs=2)


def test_the_well_formed_series_cache_belongs_to_one_read() -> None:
    good = b'm{a="1"} 1 1\nm{a="1"} 2 2\n# EOF\n'
    seen: set[str] = set()
    assert parse_chunk(good, seen=seen).error is None
    assert seen == {'m{a="1"}'}
    # a fresh read checks its series afresh: nothing carried over from the read above
    assert parse_chunk(b'm{a="1} 1 1\n# EOF\n').error is not None
