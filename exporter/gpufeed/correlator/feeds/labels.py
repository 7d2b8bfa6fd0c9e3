"""Parsing one OpenMetrics series text, `name{a="b",c="d"}`, with the format's escapes."""

from __future__ import annotations

import re


class SeriesSyntaxError(ValueError):
    pass


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _name_ok(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    """`name{labels}` -> (name, labels). Raises SeriesSyntaxError with the reason."""
    brace = text.find("{")
    if brace < 0:
        if not _name_ok(text):
            raise SeriesSyntaxError(f"bad metric name {text!r}")
        return text, {}
    name = text[:brace]
    if not _name_ok(name):
        raise SeriesSyntaxError(f"bad metric name {name!r}")
    if not text.endswith("}"):
        raise SeriesSyntaxError("label set does not end with '}'")
    labels: dict[str, str] = {}
    body = text[brace + 1 : -1]
    i, n = 0, len(body)
    while i < n:
        eq = body.find("=", i)
        if eq < 0:
            raise SeriesSyntaxError(f"label without value in {body!r}")
        key = body[i:eq].strip()
        if not _name_ok(key):
            raise SeriesSyntaxError(f"bad label name {key!r}")
        if eq + 1 >= n or body[eq + 1] != '"':
            raise SeriesSyntaxError(f"label {key!r} value is not quoted")
        j = eq + 2
        out: list[str] = []
        while True:
            if j >= n:
                raise SeriesSyntaxError(f"unterminated value of label {key!r}")
            c = body[j]
            if c == "\\":
                if j + 1 >= n:
                    raise SeriesSyntaxError(f"dangling escape in label {key!r}")
                nxt = body[j + 1]
                out.append("\n" if nxt == "n" else nxt)
                j += 2
                continue
            if c == '"':
                break
            out.append(c)
            j += 1
        if key in labels:
            raise SeriesSyntaxError(f"duplicate label {key!r}")
        labels[key] = "".join(out)
        j += 1
        if j < n:
            if body[j] != ",":
                raise SeriesSyntaxError(f"expected ',' after label {key!r}")
            j += 1
        i = j
    return name, labels


def escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_series(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"
