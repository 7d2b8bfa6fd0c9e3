"""Reads a site's alert settings from YAML into a `RulesConfig` (the mixin `_config`).

A site overrides selectors, thresholds, durations and the runbook URL in a YAML file given
to `python -m alerts.build --config FILE` (`make alerts ALERTS_CONFIG=FILE`), never by editing
Python. Keys are `RulesConfig`'s field names; what is not set keeps its default. Anything
wrong stops the build with one line that names the file and the key: a setting that is
silently ignored is how rules end up selecting nothing.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import yaml

from alerts.config import RulesConfig

# Domain facts the correlator shares: one list in the agent's vocabulary, not a setting.
NOT_SETTABLE = frozenset({"fatal_xids", "throttle_reasons"})
DURATION_SUFFIXES = ("_for", "_lookback", "_baseline", "_window")
# A Prometheus duration: 90s, 10m, 1h30m, 1d (no spaces, no fractions).
DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_VALUE = r'"(?:[^"\\]|\\.)*"'
# PromQL label matchers without the braces: name op "value", comma-separated.
SELECTOR = re.compile(
    rf"\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*{_VALUE}"
    rf"(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*{_VALUE})*\s*,?\s*"
)


class ConfigError(ValueError):
    """A settings file that cannot be used; the message is one line, for the user."""


def settable_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(RulesConfig) if f.name not in NOT_SETTABLE]


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check(key: str, value: Any, default: Any) -> Any:
    """The value for `key`, converted, or a one-line reason it is wrong."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, int):
        if not number or not isinstance(value, int) or value <= 0:
            raise ValueError(f"must be a positive whole number, got {_type_name(value)} {value!r}")
        return value
    if isinstance(default, float):
        if not number or not math.isfinite(value) or value < 0:
            raise ValueError(f"must be a number >= 0, got {_type_name(value)} {value!r}")
        if "_ratio" in key and value > 1:
            raise ValueError(f"is a ratio between 0 and 1, got {value!r}")
        return float(value)
    if isinstance(default, dict):
        return _check_mapping(key, value, default)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {_type_name(value)} {value!r}")
    if key.endswith(DURATION_SUFFIXES) and not DURATION.fullmatch(value):
        raise ValueError(f"must be a Prometheus duration such as 90s, 10m or 1h, got {value!r}")
    if key == "selector" and not SELECTOR.fullmatch(value):
        raise ValueError(
            f'must be PromQL label matchers without braces, such as job="gpufeed", got {value!r}'
        )
    if key == "runbook_base_url" and not re.match(r"https?://\S+$", value):
        raise ValueError(f"must be an http(s) URL, got {value!r}")
    return value


def _check_mapping(key: str, value: Any, default: dict[str, str]) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {_type_name(value)} {value!r}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"must map strings to strings, got {k!r}: {v!r}")
    if key == "cause_hints":
        # The causes are the correlator's; a hint for a cause that does not exist would
        # never be shown, so it is a typo. Causes not given keep their default hint.
        unknown = sorted(set(value) - set(default))
        if unknown:
            raise ValueError(f"has no cause {unknown[0]!r} (causes: {', '.join(default)})")
        return {**default, **value}
    return dict(value)


def config_from_mapping(settings: Any, source: str = "settings") -> RulesConfig:
    """A `RulesConfig` from parsed YAML; `source` names the file in error messages."""
    if settings is None:
        return RulesConfig()
    if not isinstance(settings, dict):
        raise ConfigError(f"{source}: must be a mapping of settings, got {_type_name(settings)}")
    defaults = RulesConfig()
    known = settable_keys()
    changes: dict[str, Any] = {}
    for key, value in settings.items():
        if key in NOT_SETTABLE:
            raise ConfigError(
                f"{source}: {key!r} is not a setting: it is the agent's vocabulary, shared "
                "with the correlator (exporter/gpufeed/vocabulary.py)"
            )
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r} (known: {', '.join(known)})")
        try:
            changes[key] = _check(key, value, getattr(defaults, key))
        except ValueError as exc:
            raise ConfigError(f"{source}: {key!r} {exc}") from None
    return dataclasses.replace(defaults, **changes)


def load_config(path: Path) -> RulesConfig:
    """Reads and validates a settings file; ConfigError (one line) if it is unusable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        settings = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    return config_from_mapping(settings, str(path))
