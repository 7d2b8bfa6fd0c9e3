"""Renders every dashboards/*.dashboard.py to dashboards/json/NAME.json (`make dashboards`).

    python -m dashboards.build           # regenerate the committed JSON
    python -m dashboards.build --check   # exit 1 if the committed JSON is stale

(from the repository root: the *.dashboard.py files import the `dashboards` package).

The JSON is sorted and indented, so a change to a dashboard reads as a small diff.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS_DIR = REPO_ROOT / "dashboards"
JSON_DIR = DASHBOARDS_DIR / "json"
SUFFIX = ".dashboard.py"


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS_DIR.glob(f"*{SUFFIX}"))


def dashboard_name(path: Path) -> str:
    return path.name[: -len(SUFFIX)]


def load_dashboard(path: Path) -> Any:
    """Executes one *.dashboard.py file and returns its `dashboard` object."""
    name = f"gpufeed_dashboard_{dashboard_name(path)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    board = getattr(module, "dashboard", None)
    if board is None:
        raise ValueError(f"{path} does not define a variable named 'dashboard'")
    return board


def render(board: Any) -> str:
    from grafanalib._gen import DashboardEncoder

    data = board.to_json_data()
    return json.dumps(data, sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"


def render_all() -> dict[str, str]:
    """File name in dashboards/json -> its JSON text, for every dashboard."""
    return {f"{dashboard_name(p)}.json": render(load_dashboard(p)) for p in dashboard_files()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is stale")
    args = parser.parse_args(argv)
    rendered = render_all()
    stale = [
        name
        for name, text in rendered.items()
        if not (JSON_DIR / name).exists() or (JSON_DIR / name).read_text(encoding="utf-8") != text
    ]
    extra = sorted({p.name for p in JSON_DIR.glob("*.json")} - set(rendered))
    if args.check:
        for name in stale:
            print(f"dashboards/json/{name} is stale: run `make dashboards`", file=sys.stderr)
        for name in extra:
            print(f"dashboards/json/{name} has no *.dashboard.py", file=sys.stderr)
        return 1 if stale or extra else 0
    JSON_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (JSON_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote dashboards/json/{name}")
    for name in extra:
        (JSON_DIR / name).unlink()
        print(f"removed dashboards/json/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
