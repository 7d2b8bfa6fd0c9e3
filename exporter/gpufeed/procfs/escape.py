"""The kernel's octal escaping of paths in mountinfo and mountstats (`seq_escape`)."""

from __future__ import annotations

import re

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_octal(field: str) -> str:
    r"""Turns `\040` (space), `\011` (tab), `\012` (newline) and `\134` (backslash) back."""
    if "\\" not in field:
        return field
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)
