"""docs/configuration.md is generated from the config dataclasses and checked against the
parser: every key it accepts is documented with its default, and the documented ranges are
the ones it enforces."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from gpufeed.config import AgentConfig, ConfigError, parse_config
from gpufeed.config_reference import KEYS, config_keys, render_markdown
from stack_support import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "configuration.md"


def nested(key: str, value: Any) -> str:
    """The YAML of one dotted key."""
    doc: Any = value
    for part in reversed(key.split(".")):
        doc = {part: doc}
    return yaml.safe_dump(doc)


def test_committed_page_is_generated_from_the_code() -> None:
    assert PAGE.read_text(encoding="utf-8") == render_markdown(), (
        "docs/configuration.md drifted: PYTHONPATH=exporter python -m gpufeed.config_reference"
        " > docs/configuration.md"
    )


def test_every_key_is_documented_and_every_documented_key_exists() -> None:
    assert set(KEYS) == {k for k, _ in config_keys()}


def test_the_parser_accepts_every_key_at_its_documented_default() -> None:
    doc: dict[str, Any] = {}
    for key, default in config_keys():
        if key == "tiers":
            continue
        section = doc
        *parents, leaf = key.split(".")
        for part in parents:
            section = section.setdefault(part, {})
        section[leaf] = default
    assert parse_config(yaml.safe_dump(doc)) == AgentConfig()


@pytest.mark.parametrize("section", ["", "correlator", "sdk", "jobs", "network"])
def test_the_parser_knows_exactly_the_documented_keys(section: str) -> None:
    """Its unknown-key error lists the keys it accepts: they are the documented ones."""
    text = nested(f"{section}.no_such_key" if section else "no_such_key", 1)
    with pytest.raises(ConfigError, match="unknown key") as err:
        parse_config(text)
    match = re.search(r"known keys: ([^)]*)\)", str(err.value))
    assert match, str(err.value)
    accepted = {f"{section}.{k}" if section else k for k in match.group(1).split(", ")}
    documented = {k for k in KEYS if (k.rsplit(".", 1)[0] if "." in k else "") == section}
    tops = {k.split(".")[0] for k in KEYS}
    assert accepted == (tops if section == "" else documented)


@pytest.mark.parametrize("key", sorted(k for k, d in KEYS.items() if d.minimum is not None))
def test_documented_ranges_are_enforced(key: str) -> None:
    doc = KEYS[key]
    assert doc.minimum is not None and doc.maximum is not None
    default = dict(config_keys())[key]
    step = 1 if isinstance(default, int) else 0.001
    cast = int if isinstance(default, int) else float
    for inside in (doc.minimum, doc.maximum):
        parse_config(nested(key, cast(inside)))
    for outside in (doc.minimum - step, doc.maximum + step):
        with pytest.raises(ConfigError, match=re.escape(key) + ": must be between"):
            parse_config(nested(key, cast(outside)))
