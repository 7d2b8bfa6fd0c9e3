"""Helpers for the dashboard, alert, compose and end-to-end stack tests.

- `metric_names(expr)`: the metric names a PromQL expression selects (a small tokenizer:
  enough to check names against the contract, not a full parser; promtool parses fully).
- `catalogue_metrics()`: every series name the metric catalogue (gpufeed.catalogue) allows.
- `grafana_queries(board)`: every query in a dashboard's JSON (panels, variables,
  annotations), and `expand_grafana_vars` to turn one into plain PromQL.
- `promtool_check_exprs(exprs)`: runs each expression through promtool's real parser.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent

RULES_FILE = REPO_ROOT / "alerts" / "gpufeed.rules.yml"


# Series the rules and dashboards may use besides the catalogue's: Prometheus's own `up`.
EXTRA_METRICS = frozenset({"up"})

_AGGREGATIONS = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ]
)
_KEYWORDS = frozenset(["bool", "and", "or", "unless", "offset", "atan2", "inf", "nan"])
_LABEL_LIST_KEYWORDS = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])

_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<matchers>\{(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^}"'])*\})
    |(?P<range>\[[^\]]*\])
    |(?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*(?![a-zA-Z0-9_:]))
    |(?P<number>(?:0x[0-9a-fA-F]+|\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<lparen>\()
    |(?P<rparen>\))
    |(?P<space>\s+)
    |(?P<other>[-+*/%^=!<>,@])
    """,
    re.VERBOSE,
)


class PromQLSyntaxError(ValueError):
    pass


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise PromQLSyntaxError(f"unexpected character {expr[pos]!r} at {pos} in {expr!r}")
        kind = m.lastgroup or "other"
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects (plain names and __name__ matchers)."""
    toks = _tokens(expr)
    depth = 0
    names: set[str] = set()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "lparen":
            depth += 1
        elif kind == "rparen":
            depth -= 1
            if depth < 0:
                raise PromQLSyntaxError(f"unbalanced ')' in {expr!r}")
        elif kind == "matchers":
            m = re.search(r'__name__\s*=\s*"([^"]+)"', text)
            if m:
                names.add(m.group(1))
        elif kind == "ident":
            if text in _LABEL_LIST_KEYWORDS:
                if nxt[0] == "lparen":  # skip the label list
                    j = i + 2
                    while j < len(toks) and toks[j][0] != "rparen":
                        j += 1
                    i = j
            elif text in _KEYWORDS or text in _AGGREGATIONS or nxt[0] == "lparen":
                pass  # an operator, keyword, aggregation or function call
            else:
                names.add(text)
        i += 1
    if depth != 0:
        raise PromQLSyntaxError(f"unbalanced parentheses in {expr!r}")
    return names


def catalogue_metrics() -> set[str]:
    """Every series name of the metric catalogue (histograms as their _bucket/_sum/_count)."""
    from gpufeed.catalogue import CATALOGUE, sample_names

    return {n for m in CATALOGUE for n in (m.name, *sample_names(m))}


def recorded_names(rules_file: Path = RULES_FILE) -> set[str]:
    doc = yaml.safe_load(rules_file.read_text(encoding="utf-8"))
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def rule_exprs(rules_file: Path = RULES_FILE) -> Iterator[tuple[str, str]]:
    doc = yaml.safe_load(rules_file.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def grafana_queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target, query variable and annotation."""
    title = board["title"]

    def walk(panels: Iterable[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for t in panel.get("targets", []):
                yield f"{title} / {panel['title']} / {t['refId']}", t["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(board["panels"])
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"])
            assert m, f"{title}: variable {var['name']}: unexpected query {var['query']!r}"
            yield f"{title} / variable {var['name']}", m.group(1)
    for ann in board["annotations"]["list"]:
        if "expr" in ann:
            yield f"{title} / annotation {ann['name']}", ann["expr"]


def expand_grafana_vars(
    expr: str,
    *,
    rate_interval: str = "1m",
    range_: str = "1h",
    values: dict[str, str] | None = None,
) -> str:
    """Plain PromQL from a Grafana query: $__rate_interval, $__range and the variables
    (default: "All", i.e. the regex .*)."""
    values = values or {}
    out = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    out = out.replace("$__interval", rate_interval)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), ".*"), out)


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found (Debian package prometheus; `make promtool`)"
    return path


def promtool_check_exprs(exprs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Parses every expression with promtool, as recording rules in a scratch rule file."""
    rules = [
        {"record": f"gpufeed_check:expr_{i}", "expr": expr, "labels": {"where": where}}
        for i, (where, expr) in enumerate(exprs.items())
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exprs.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
        return subprocess.run(
            [promtool(), "check", "rules", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


# --- Test copies of the compose configs -------------------------------------------------
# The end-to-end test runs the shipped configs with only addresses, paths and timings
# changed; these helpers make those copies so that the shipped files stay as they are.


def prometheus_config_for_test(
    shipped: Path,
    *,
    agent: str,
    alertmanager: str,
    rule_files: list[str],
    interval: str,
) -> dict[str, Any]:
    """The compose prometheus.yml with the agent and Alertmanager addresses, the rule files
    and the scrape/evaluation interval replaced; every other setting is kept."""
    config: dict[str, Any] = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    config["global"]["scrape_interval"] = interval
    config["global"]["evaluation_interval"] = interval
    config["rule_files"] = rule_files
    for am in config["alerting"]["alertmanagers"]:
        for static in am["static_configs"]:
            static["targets"] = [alertmanager]
    kept = []
    for job in config["scrape_configs"]:
        if job["job_name"] == "gpufeed":
            for static in job["static_configs"]:
                static["targets"] = [agent]
            kept.append(job)
    config["scrape_configs"] = kept  # the compose file's self-scrape has no address here
    return config


def alertmanager_config_for_test(
    shipped: Path, *, webhook_base: str, group_wait: str
) -> dict[str, Any]:
    """The compose alertmanager.yml with every webhook pointed at `webhook_base` (each
    receiver keeps its own path, so the test sees which route was taken) and the grouping
    delays shortened; routes, matchers and inhibitions are kept."""
    config: dict[str, Any] = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    config["route"]["group_wait"] = group_wait
    config["route"]["group_interval"] = group_wait
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            path = "/" + hook["url"].split("://", 1)[1].split("/", 1)[1]
            hook["url"] = webhook_base.rstrip("/") + path
    return config
