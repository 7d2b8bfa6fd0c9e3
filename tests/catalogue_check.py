"""Checks an exposition or a list of families against the metric catalogue.

Every failure names the family and the fix, so that adding a metric without its catalogue
entry (or with HELP, type or labels that differ from it) fails with a message that says
what is missing and where it goes.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from gpufeed.catalogue import BY_NAME, MetricSpec
from gpufeed.model import Family

WHERE = "exporter/gpufeed/catalogue.py"


def _exposed_name(base: str, type_: str) -> str:
    return f"{base}_total" if type_ == "counter" else base


def _label_problems(spec: MetricSpec, label_sets: Iterable[frozenset[str]]) -> list[str]:
    allowed = set(spec.labels)
    required = allowed - set(spec.optional_labels)
    problems = []
    for labels in label_sets:
        labels = frozenset(labels - {"le"}) if spec.type == "histogram" else labels
        extra = sorted(labels - allowed)
        missing = sorted(required - labels)
        if extra:
            problems.append(f"{spec.name}: label(s) {extra} not declared in {WHERE}")
        if missing:
            problems.append(f"{spec.name}: sample lacks required label(s) {missing}")
    return sorted(set(problems))


def family_problems(
    name: str, type_: str, help_: str, label_sets: list[frozenset[str]]
) -> list[str]:
    spec = BY_NAME.get(name)
    if spec is None:
        return [
            f"{name} ({type_}) is exported but not in the metric catalogue: add a MetricSpec to {WHERE}"
        ]
    problems = []
    if spec.type != type_:
        problems.append(f"{name}: exported as {type_}, the catalogue ({WHERE}) says {spec.type}")
    if spec.help != help_:
        problems.append(
            f"{name}: HELP {help_!r} differs from the catalogue's {spec.help!r} ({WHERE})"
        )
    return problems + _label_problems(spec, label_sets)


def exposition_problems(text: str) -> list[str]:
    """Problems of a Prometheus text page, parsed by prometheus_client's own parser."""
    problems: list[str] = []
    for fam in text_string_to_metric_families(text):
        type_ = "gauge" if fam.type in ("info", "stateset") else fam.type
        label_sets = [frozenset(s.labels) for s in fam.samples]
        problems += family_problems(
            _exposed_name(fam.name, type_), type_, fam.documentation, label_sets
        )
    return problems


def families_problems(families: Iterable[Family]) -> list[str]:
    """Problems of families as a collector returns them (before exposition)."""
    problems: list[str] = []
    for fam in families:
        type_ = "gauge" if fam.type == "info" else fam.type
        label_sets = [frozenset(k for k, _ in s.labels) for s in fam.samples]
        problems += family_problems(fam.name, type_, fam.help, label_sets)
    return problems
